"""gpusandbox.settings: one reader of the settings for every OCI door (the
runtime's config loading, the wrapper/filter/hook edit, the wrapper's real
runtime).  Files are this test's own, named by GPUSANDBOX_OCI_CONF or
passed as sources; nothing reads the host's /etc/gpusandbox."""
import os

import pytest

from gpusandbox import settings
from gpusandbox.errors import UsageError
from gpusandbox.linux import host
from gpusandbox.oci import config as oc
from gpusandbox.oci import configedit, wrapper

from .test_oci_runtime_config import _bundle

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chowns to another uid")


def _file(path, text, mode=0o644):
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def _sources(*files, env=None):
    return [settings.EnvSource(env or {})] + [settings.FileSource(str(f)) for f in files]


def test_the_format():
    text = ("# a comment\n  # indented comment\n\ndriver-root = /a/b  # trailing comment\n"
            "dev-root=\t/d#not a comment\t\nruntime = /x\nruntime =\nno equals sign\n"
            "driver_root = /old\nbogus = 1\n")
    values, notes = settings.parse(text)
    # The last line naming a key wins, in either spelling; an empty value names nothing.
    assert values == {"driver-root": "/old", "dev-root": "/d#not a comment", "runtime": ""}
    assert notes == [("driver_root: an older spelling, still read", "write driver-root"),
                     ("unknown key 'bogus': ignored", "remove it or correct its spelling")]


@pytest.mark.parametrize("var", ["GPUSANDBOX_OCI_CONF", "GPUSANDBOX_OCI_CONFIG"])
@pytest.mark.parametrize("spelling", ["driver-root", "driver_root"])
def test_every_door_reads_one_file_in_either_spelling(tmp_path, var, spelling):
    """The runtime (oci/config.py), the wrapper/filter/hook edit (configedit)
    and the wrapper's real runtime read the same file the same way; the older
    variable and key spellings still work."""
    dev = spelling.replace("driver", "dev")
    f = _file(tmp_path / "oci.conf", f"{spelling} = /sim/host\n{dev} = /sim/dev\n"
              "runtime = /usr/bin/crun\n")
    env = {var: f}
    assert configedit.host_roots(env) == ("/sim/host", "/sim/dev")
    spec = oc.load(_bundle(tmp_path), env)
    assert (spec.driver_root, spec.dev_root) == ("/sim/host", "/sim/dev")
    assert wrapper.real_runtime(env) == "/usr/bin/crun"


def test_environment_first_and_dev_root_follows_the_driver_root(tmp_path):
    f = _file(tmp_path / "oci.conf", "driver-root = /file/host\ndev-root = /file/dev\n")
    env = {"GPUSANDBOX_OCI_CONF": f}
    # A driver root of the caller's own comes with its own /dev, whatever the file says.
    assert settings.driver_roots(dict(env, GPUSANDBOX_DRIVER_ROOT="/mine")) == ("/mine", None)
    assert settings.driver_roots(dict(env, GPUSANDBOX_DRIVER_ROOT="/mine",
                                      GPUSANDBOX_DEV_ROOT="/mydev")) == ("/mine", "/mydev")
    # A dev root alone keeps the file's driver root.
    assert settings.driver_roots(dict(env, GPUSANDBOX_DEV_ROOT="/mydev")) == \
        ("/file/host", "/mydev")
    assert settings.driver_roots({"GPUSANDBOX_OCI_CONF": str(tmp_path / "none")}) == ("/", None)
    s = settings.Settings(env)
    assert s.lookup("driver-root") == ("/file/host", f)
    assert s.lookup("runtime") == (None, None)


def test_the_users_file_comes_before_the_system_file(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".config/gpusandbox").mkdir(parents=True)
    _file(home / ".config/gpusandbox/oci.conf", "runtime = /home/rt\n")
    system = _file(tmp_path / "system.conf", "runtime = /sys/rt\ndriver-root = /sys/host\n")
    monkeypatch.setattr(host, "real_root", lambda: False)
    s = settings.Settings(srcs=settings.sources({"HOME": str(home)}, system))
    assert s.lookup("runtime") == ("/home/rt", str(home / ".config/gpusandbox/oci.conf"))
    assert s.get("driver-root") == "/sys/host"
    # Real root reads the system file only; so does a caller without a HOME.
    for real, env in ((True, {"HOME": str(home)}), (False, {})):
        monkeypatch.setattr(host, "real_root", lambda real=real: real)
        assert settings.Settings(srcs=settings.sources(env, system)).get("runtime") == "/sys/rt"
    # A file named by the environment replaces both.
    named = _file(tmp_path / "named.conf", "")
    assert settings.Settings(srcs=settings.sources({"HOME": str(home),
                                                    "GPUSANDBOX_OCI_CONF": named},
                                                   system)).get("runtime") is None


def test_a_file_others_can_write_is_refused_where_a_value_is_taken(tmp_path):
    f = _file(tmp_path / "oci.conf", "runtime = /evil\n", 0o666)
    with pytest.raises(UsageError) as e:
        settings.get("runtime", {"GPUSANDBOX_OCI_CONF": f})
    assert e.value.line() == f"settings file {f}: mode 0666 lets others write to it"
    assert "chmod go-w" in e.value.hint
    # A key it does not name is not taken from it, and the environment comes first.
    assert settings.get("driver-root", {"GPUSANDBOX_OCI_CONF": f}) == "/"
    assert settings.get("runtime", {"GPUSANDBOX_OCI_CONF": f,
                                    "GPUSANDBOX_OCI_RUNTIME": "/rt"}) == "/rt"


@root_only
def test_owners_root_the_caller_and_in_a_user_namespace_the_overflow_uid(tmp_path, monkeypatch):
    f = _file(tmp_path / "oci.conf", "runtime = /rt\n")
    env = {"GPUSANDBOX_OCI_CONF": f}
    os.chown(f, 12345, 12345)
    with pytest.raises(UsageError) as e:
        settings.get("runtime", env)
    assert e.value.line() == f"settings file {f}: owned by uid 12345, not by root or you (uid 0)"
    # Inside a user namespace the host's root shows as the overflow uid.
    monkeypatch.setattr(host, "root_uids", lambda: (0, 12345))
    assert settings.get("runtime", env) == "/rt"


def test_unreadable_or_not_a_file_or_not_absolute(tmp_path):
    d = tmp_path / "dir.conf"
    d.mkdir()
    with pytest.raises(UsageError) as e:
        settings.get("runtime", {"GPUSANDBOX_OCI_CONF": str(d)})
    assert e.value.line() == f"settings file {d}: not a regular file"
    f = _file(tmp_path / "oci.conf", "driver-root = relative/path\n")
    with pytest.raises(UsageError) as e:
        settings.get("driver-root", {"GPUSANDBOX_OCI_CONF": f})
    assert e.value.line() == f"setting driver-root = relative/path ({f}): not an absolute path"
    with pytest.raises(UsageError, match="GPUSANDBOX_OCI_RUNTIME"):
        settings.get("runtime", {"GPUSANDBOX_OCI_RUNTIME": "crun"})


def test_each_file_is_read_once_per_call(tmp_path, monkeypatch):
    f = _file(tmp_path / "oci.conf", "driver-root = /a\ndev-root = /b\n")
    opened = []
    real = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: opened.append(p) or real(p, *a, **k))
    assert settings.driver_roots({"GPUSANDBOX_OCI_CONF": f}) == ("/a", "/b")
    # the named oci.conf once (no other oci.conf); the site's TOML file is asked too
    assert [p for p in opened if p.endswith("oci.conf")] == [f]


def test_doctor_names_older_spellings_unknown_keys_and_a_file_that_fails(tmp_path):
    from gpusandbox.doctor import render
    from gpusandbox.doctor.settings import check_settings
    f = _file(tmp_path / "oci.conf", "driver_root = /sim\nbogus = 1\n")
    checks = check_settings({"GPUSANDBOX_OCI_CONFIG": f})
    assert [(c.name, c.status, c.detail, c.fix) for c in checks] == [
        ("GPUSANDBOX_OCI_CONFIG", "warn", "an older name, still read",
         "set GPUSANDBOX_OCI_CONF instead"),
        ("driver-root", "pass", f"/sim (from {f})", ""),
        (f, "warn", "driver_root: an older spelling, still read", "write driver-root"),
        (f, "warn", "unknown key 'bogus': ignored", "remove it or correct its spelling")]
    assert f"  WARN  {f} driver_root: an older spelling, still read  (fix: write driver-root)" \
        in render(checks)
    bad = _file(tmp_path / "bad.conf", "runtime = /rt\n", 0o666)
    checks = check_settings({"GPUSANDBOX_OCI_CONF": bad})
    assert [(c.name, c.status) for c in checks] == [("runtime", "fail")]
    # Nothing set and no file: no section.
    assert check_settings({}, str(tmp_path / "none.conf")) == []
