"""Site and user configuration files (gpusandbox/conffile.py, settings.py,
siterun.py, configcli.py): real files in a temporary site directory."""
import json
import os
import re
from pathlib import Path

import pytest

from gpusandbox import configcli, settings, siterun
from gpusandbox.errors import UsageError
from gpusandbox.mountopt import parse_bind
from gpusandbox.spec import RunSpec

REPO = Path(__file__).resolve().parents[2]
IDS = {"user": "alice", "uid": "1234", "home": None, "job": None}


def _write(path, text, mode=0o644):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)
    return path


@pytest.fixture
def site(tmp_path):
    d = tmp_path / "etc"
    d.mkdir()
    return d


def _settings(tmp_path, site, env=None):
    env = dict(env or {}, HOME=str(tmp_path / "home"))
    return settings.Settings(srcs=settings.sources(env, str(tmp_path / "none"), str(site)))


def _user(tmp_path, text, mode=0o644):
    return _write(tmp_path / "home/.config/gpusandbox/gpusandbox.conf", text, mode)


def test_precedence_env_over_user_over_site_over_default(tmp_path, site):
    _write(site / "gpusandbox.conf", 'network = "none"\nshm-size = "2g"\ngpu-caps = "all"\n')
    _user(tmp_path, 'network = "host"\nshm-size = "1g"\n')
    s = _settings(tmp_path, site, {"GPUSANDBOX_SHM_SIZE": "512m"})
    assert s.lookup("shm-size") == ("512m", "GPUSANDBOX_SHM_SIZE")
    assert s.lookup("network") == ("host", str(tmp_path / "home/.config/gpusandbox/gpusandbox.conf:1"))
    assert s.lookup("gpu-caps") == ("all", f"{site}/gpusandbox.conf:3")
    assert s.lookup("seccomp") == ("default", None)
    spec = RunSpec()
    spec.gpu_caps = "compute"       # the command line wins over every file
    siterun.apply(spec, s, IDS)
    assert (spec.gpu_caps, spec.net, spec.shm_size) == ("compute", "host", "512m")


def test_dropins_in_lexical_order_later_wins(tmp_path, site):
    _write(site / "gpusandbox.conf", 'network = "host"\n')
    _write(site / "conf.d/20-b.conf", 'network = "none"\n')
    _write(site / "conf.d/10-a.conf", 'network = "host"\n')
    _write(site / "conf.d/30-c.conf.bak", 'network = "host"\n')
    assert _settings(tmp_path, site).lookup("network") == ("none", f"{site}/conf.d/20-b.conf:1")


def test_locked_key_user_file_and_variable_ignored_flag_refused(tmp_path, site):
    _write(site / "gpusandbox.conf", 'network = "none"\nlock = ["network"]\n')
    _user(tmp_path, 'network = "host"\n')
    s = _settings(tmp_path, site, {"GPUSANDBOX_NETWORK": "host"})
    assert s.get("network") == "none"
    warns = s.warnings()
    assert len(warns) == 2 and all("setting network is locked by the site" in w for w in warns)
    spec = RunSpec()
    siterun.apply(spec, s, IDS)
    assert spec.net == "none"
    spec = RunSpec()
    spec.net = "host"
    with pytest.raises(UsageError) as e:
        siterun.apply(spec, s, IDS)
    assert e.value.line() == f"--net host: the site locks network = none ({site}/gpusandbox.conf)"


def test_user_file_cannot_lock_or_set_site_only_keys(tmp_path, site):
    _user(tmp_path, 'network = "host"\nlock = []\n')
    with pytest.raises(UsageError) as e:
        _settings(tmp_path, site).get("network")
    assert e.value.line().endswith("gpusandbox.conf:2: key 'lock': only a site file may lock keys")
    _user(tmp_path, 'forbid-binds = []\n')
    with pytest.raises(UsageError) as e:
        _settings(tmp_path, site).get("forbid-binds")
    assert e.value.line().endswith(":1: key 'forbid-binds': only the site configuration may "
                                   "set it")


def test_unknown_key_and_wrong_type_name_file_line_key(tmp_path, site):
    f = _write(site / "gpusandbox.conf", '# site\n\nnetwrok = "none"\n')
    with pytest.raises(UsageError) as e:
        _settings(tmp_path, site).get("network")
    assert e.value.line() == f"{f}:3: unknown key 'netwrok'"
    assert e.value.hint == "did you mean network?"
    _write(f, 'mount-home = "yes"\n')
    with pytest.raises(UsageError) as e:
        _settings(tmp_path, site).get("network")
    assert e.value.line() == f"{f}:1: key mount-home = yes: expected true or false"
    _write(f, '[[mounts]]\nsource = "/x"\nreadonly = true\n')
    with pytest.raises(UsageError) as e:
        _settings(tmp_path, site).get("mounts")
    assert e.value.line() == f"{f}: key mounts.readonly: unknown field"
    _write(f, 'network = "none"\nx = = 1\n')
    with pytest.raises(UsageError) as e:
        _settings(tmp_path, site).get("network")
    assert e.value.line().startswith(f"configuration file {f}: not valid TOML: ")
    assert "line 2" in e.value.line()


def test_site_file_writable_by_others_or_not_roots_is_skipped_with_a_warning(tmp_path, site):
    f = _write(site / "gpusandbox.conf", 'network = "none"\n', 0o666)
    s = _settings(tmp_path, site)
    assert s.get("network") is None
    assert s.warnings() == [f"configuration file {f} skipped: mode 0666 lets others write to "
                            f"it (chown root:root {f}; chmod go-w {f})"]
    os.chmod(f, 0o644)
    os.chown(f, 4321, 4321)
    s = _settings(tmp_path, site)
    assert s.get("network") is None
    assert s.warnings()[0].startswith(f"configuration file {f} skipped: owned by uid 4321, "
                                      "not by root")
    # a user file of another user is skipped the same way
    os.chown(f, 0, 0)
    u = _user(tmp_path, 'shm-size = "1g"\n')
    os.chown(u, 4321, 4321)
    s = _settings(tmp_path, site)
    assert s.get("shm-size") is None and "not by root or you" in s.warnings()[0]


def test_mounts_expand_optional_required_and_home(tmp_path, site):
    scratch = tmp_path / "scratch" / "alice"
    scratch.mkdir(parents=True)
    home = tmp_path / "home-alice"
    home.mkdir()
    _write(site / "gpusandbox.conf", f'''mount-home = true
[[mounts]]
source = "{tmp_path}/scratch/{{user}}"
destination = "/scratch"
read-only = true
[[mounts]]
source = "{tmp_path}/nothing/{{uid}}"
optional = true
[[mounts]]
source = "/jobs/{{job}}"
''')
    ids = dict(IDS, home=str(home))
    spec = RunSpec()
    spec.binds.append(parse_bind("/tmp:/data"))
    siterun.apply(spec, _settings(tmp_path, site), ids)
    assert [(b.src, b.dst, b.rw) for b in spec.binds] == [
        (str(scratch), "/scratch", False), (str(home), str(home), True), ("/tmp", "/data", True)]
    spec = RunSpec()
    spec.mount_home = False             # --no-mount-home
    siterun.apply(spec, _settings(tmp_path, site), ids)
    assert [b.dst for b in spec.binds] == ["/scratch"]
    _write(site / "conf.d/x.conf", f'[[mounts]]\nsource = "{tmp_path}/absent"\n')
    with pytest.raises(UsageError, match=f"source {tmp_path}/absent does not exist"):
        siterun.apply(RunSpec(), _settings(tmp_path, site), ids)


def test_forbidden_bind_refused_in_one_line(tmp_path, site):
    proj = tmp_path / "proj" / "other"
    proj.mkdir(parents=True)
    (tmp_path / "link").symlink_to(proj)
    _write(site / "gpusandbox.conf",
           f'forbid-binds = ["/etc/shadow", "{tmp_path}/proj/*"]\n')
    s = _settings(tmp_path, site)
    for src in ("/etc/shadow", "/etc", str(proj), str(proj / "sub"), str(tmp_path / "link"),
                "/"):
        spec = RunSpec()
        spec.binds.append(parse_bind(f"{src}:/x"))
        with pytest.raises(UsageError) as e:
            siterun.apply(spec, s, IDS)
        assert e.value.line().startswith(f"bind of {src}: forbidden by the site: matches ")
    spec = RunSpec()
    spec.binds.append(parse_bind("/usr:/x"))
    siterun.apply(spec, s, IDS)


def test_env_set_and_passed(tmp_path, site, monkeypatch):
    _write(site / "gpusandbox.conf", '[env]\nSCRATCH = "/scratch/{user}"\n')
    _write(site / "conf.d/a.conf", 'pass-env = ["SLURM_*"]\n')
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    spec = RunSpec()
    spec.env_set.append("SCRATCH=/mine")
    siterun.apply(spec, _settings(tmp_path, site), IDS)
    assert spec.env_set[0] == "SLURM_JOB_ID"
    assert spec.env_set[-2:] == ["SCRATCH=/scratch/alice", "SCRATCH=/mine"]


def test_upper_bounds(tmp_path, site):
    _write(site / "gpusandbox.conf", 'max-shm-size = "2g"\nmax-memory = "4g"\n'
           'max-gpu-memory = "8g"\n')
    s = _settings(tmp_path, site)
    for attr, val, opt in (("shm_size", "3g", "--shm-size"), ("memory", "5g", "--memory"),
                           ("gpu_memory", "9G", "--gpu-memory")):
        spec = RunSpec()
        setattr(spec, attr, val)
        with pytest.raises(UsageError) as e:
            siterun.apply(spec, s, IDS)
        assert e.value.line().startswith(f"{opt} {val}: more than the site allows: at most ")
    spec = RunSpec()
    spec.memory, spec.gpu_memory = "4g", "8G"
    siterun.apply(spec, s, IDS)


def test_image_policy(tmp_path, site):
    _write(site / "gpusandbox.conf", 'allowed-images = ["registry.site/*", '
           '"docker.io/library/ubuntu@sha256:*"]\ndenied-images = ["registry.site/bad/*"]\n')
    s = _settings(tmp_path, site)
    siterun.check_image("registry.site/ml/torch:24.01", s)
    siterun.check_image("docker.io/library/ubuntu@sha256:" + "a" * 64, s)
    with pytest.raises(UsageError, match="not among the images the site allows"):
        siterun.check_image("docker.io/library/ubuntu:22.04", s)
    with pytest.raises(UsageError, match="denied by the site"):
        siterun.check_image("registry.site/bad/x:1", s)


def test_config_command_shows_origin(tmp_path, site, capsys, monkeypatch):
    _write(site / "gpusandbox.conf", 'network = "none"\nlock = ["network"]\n')
    real = settings.sources
    monkeypatch.setattr(settings, "sources", lambda env, *a: real(
        {"HOME": str(tmp_path)}, str(tmp_path / "none"), str(site)))
    assert configcli.main(["--show-origin", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["network"] == {"value": "none", "origin": f"{site}/gpusandbox.conf:1 "
                              f"(locked by {site}/gpusandbox.conf)"}
    assert doc["driver-root"] == {"value": "/", "origin": "default"}


def test_docs_table_is_the_key_table():
    """docs/config.md lists exactly the keys of settings.KEYS."""
    text = (REPO / "docs/config.md").read_text().split("\n## Keys\n")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([a-z-]+)` \|", text, re.M)
    assert rows == list(settings.KEYS)


def test_each_keys_doors_are_known_and_the_docs_say_the_same():
    """The `honoured by` column of docs/config.md is each key's doors, every
    door one of settings.DOORS, and the page's door table lists them all."""
    text = (REPO / "docs/config.md").read_text()
    keys = text.split("\n## Keys\n")[1].split("\n## ")[0]
    for line in re.findall(r"^\| `[a-z-]+` \|.*$", keys, re.M):
        name, doors = line.split("|")[1].strip(" `"), line.split("|")[6].strip()
        assert doors == settings.KEYS[name].doors, name
    for key in settings.KEYS.values():
        assert set(key.doors.split(", ")) <= set(settings.DOORS), key.name
    doors = text.split("\n## What each door honours\n")[1].split("\n## ")[0]
    assert re.findall(r"^\| `([a-z-]+)` \|", doors, re.M) == list(settings.DOORS)


def test_docs_slurm_cluster_example_loads(tmp_path, site):
    """docs/config.md's example site file for a Slurm GPU cluster is read
    without a warning or an error, and a `run` request takes its values."""
    text = (REPO / "docs/config.md").read_text().split("\n## Example: a Slurm GPU cluster\n")[1]
    example = text.split("```toml\n")[1].split("```")[0]
    _write(site / "gpusandbox.conf", example)
    s = _settings(tmp_path, site)
    values = {name: s.get(name) for name in settings.KEYS}
    assert s.warnings() == []
    assert (values["network"], values["mount-home"], values["shm-size"]) == ("host", True, "8g")
    assert set(s.locks()) == {"network", "seccomp", "mpi-libs"}
    assert [m["source"] for m in values["mounts"]][:2] == ["/lustre/scratch/{user}",
                                                           "/local/jobs/{job}"]
    spec = RunSpec()
    siterun.apply(spec, s, dict(IDS))
    assert (spec.net, spec.shm_size) == ("host", "8g")
    assert "SCRATCH=/scratch" in spec.env_set


def test_exit_point_gives_the_status_and_warns_naming_a_failed_hook(tmp_path, site,
                                                                     monkeypatch):
    from gpusandbox import sitehooks
    hooks = tmp_path / "hooks"
    log = tmp_path / "seen"
    _write(hooks / "10-log", f"#!/bin/sh\necho \"$1 $GPUSANDBOX_DOOR\" >> {log}; "
           f"cat >> {log}\n", 0o755)
    _write(hooks / "20-fails", "#!/bin/sh\nexit 4\n", 0o755)
    os.chmod(hooks, 0o755)
    _write(site / "gpusandbox.conf", f'hooks-dir = "{hooks}"\n')
    monkeypatch.setattr(settings, "current", lambda: _settings(tmp_path, site))
    monkeypatch.setattr(sitehooks, "_FOUND", [])
    warned = []
    doc = {"point": "exit", "door": "slurm-oci", "argv": ["true"], "status": None}
    sitehooks.exit_point(doc, 3, warned.append)
    head, body = log.read_text().split("\n", 1)
    assert head == "exit slurm-oci"
    assert json.loads(body) == dict(doc, status=3)
    assert warned == [f"site hook {hooks}/20-fails failed at exit: exit status 4"]


def test_doctor_config_section(tmp_path):
    from gpusandbox.doctor.config import check_config
    etc = tmp_path / "etc"
    f = _write(etc / "gpusandbox/gpusandbox.conf", f'''lock = ["network"]
forbid-binds = ["{tmp_path}/secret"]
[[mounts]]
source = "{tmp_path}/secret"
[[mounts]]
source = "{tmp_path}/nothing"
optional = true
[[mounts]]
source = "{tmp_path}/absent"
''')
    (tmp_path / "secret").mkdir()
    bad = _write(etc / "gpusandbox/conf.d/x.conf", 'network = "host"\n', 0o666)
    got = {c.name: (c.status, c.detail) for c in check_config({"HOME": str(tmp_path)}, str(etc))}
    assert got[str(f)] == ("pass", "2 key(s), locks network")     # forbid-binds, mounts
    assert got[str(bad)] == ("warn", "mode 0666 lets others write to it "
                             f"(chown root:root {bad}; chmod go-w {bad})")
    assert got[f"mount {tmp_path}/secret"][0] == "fail"
    assert got[f"mount {tmp_path}/nothing"] == ("pass", "source missing: skipped (optional)")
    assert got[f"mount {tmp_path}/absent"] == ("fail", "source missing")
    assert got["lock network"] == ("pass", f"network = the built-in default ({f})")
    _write(f, "bogus = 1\n")
    got = {c.name: (c.status, c.detail) for c in check_config({"HOME": str(tmp_path)}, str(etc))}
    assert got[str(f)] == ("fail", f"{f}:1: unknown key 'bogus'")


def test_job_expansion_takes_only_a_job_id(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "../../etc")
    assert siterun.identity()["job"] is None
    assert siterun.expand("/jobs/{job}", siterun.identity(), "x") is None
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    assert siterun.expand("/jobs/{job}/{uid}", siterun.identity(), "x") == \
        f"/jobs/4242/{os.getuid()}"


def test_symlinked_user_file_is_read_and_its_target_checked(tmp_path, site):
    real = _write(tmp_path / "dotfiles/gsbx.conf", 'network = "none"\n')
    link = tmp_path / "home/.config/gpusandbox/gpusandbox.conf"
    link.parent.mkdir(parents=True)
    link.symlink_to(real)
    assert _settings(tmp_path, site).get("network") == "none"
    os.chmod(real, 0o666)
    s = _settings(tmp_path, site)
    assert s.get("network") is None and "mode 0666" in s.warnings()[0]


def test_fabric_and_mpi_defaults_from_the_site(tmp_path, site):
    """A site's fabric, fabric-libs and mpi are run's defaults (the command
    line still wins); mpi-libs, locked, ignores the caller's variable, and the
    host MPI it names is what --mpi host injects (fabric/mpi.host_mpi)."""
    lib = tmp_path / "libmpi.so.12"
    lib.write_bytes(b"")
    _write(site / "gpusandbox.conf",
           f'fabric = "none"\nfabric-libs = "host"\nmpi = "host"\nmpi-libs = "{lib}"\n'
           'mpi-compat = "full"\nlock = ["mpi-libs"]\n')
    s = _settings(tmp_path, site, {"GPUSANDBOX_MPI_LIBS": "/elsewhere/libmpi.so.12"})
    spec = RunSpec()
    spec.mpi = "image"
    siterun.apply(spec, s, IDS)
    assert (spec.fabric, spec.fabric_libs, spec.mpi) == ("none", "host", "image")
    assert s.lookup("mpi-libs") == (str(lib), f"{site}/gpusandbox.conf:4")
    assert any("mpi-libs is locked" in w for w in s.warnings())
    with pytest.raises(UsageError) as e:
        _write(site / "gpusandbox.conf", 'mpi-compat = "loose"\n')
        _settings(tmp_path, site).lookup("mpi-compat")
    assert "mpi-compat" in e.value.line()
