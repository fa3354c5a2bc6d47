"""The precreate filter's generated-file lifecycle (one directory per
container, removed by the poststop hook it adds; stale ones collected) and
configedit's translation of CDI tmpfs mounts."""
import os
import time

import pytest

from gpusandbox.edits import ContainerEdits, Tmpfs
from gpusandbox.errors import UsageError
from gpusandbox.oci import configedit, filter as ocifilter


def test_collect_garbage_removes_only_old_entries_of_its_own(tmp_path):
    old, fresh, legacy, other = (tmp_path / n for n in
                                 ("c-old1234", "c-new1234", "ld.so.cache-ab", "keep-me"))
    for d in (old, fresh):
        d.mkdir()
        (d / "ld.so.cache-x").write_bytes(b"x")
    legacy.write_bytes(b"y")
    other.mkdir()
    then = time.time() - ocifilter.GC_AGE - 60
    for p in (old, legacy, other):
        os.utime(p, (then, then))
    (tmp_path / "c-link1234").symlink_to(fresh)
    os.utime(tmp_path / "c-link1234", (then, then), follow_symlinks=False)
    ocifilter.collect_garbage(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["c-new1234", "keep-me"]
    assert os.listdir(fresh) == ["ld.so.cache-x"]


@pytest.mark.parametrize("name", ["../oci", "c-../../etc", "/etc", "c-", "ld.so.cache-x"])
def test_remove_takes_only_names_the_filter_makes(name):
    with pytest.raises(UsageError):
        ocifilter.main(["--remove", name])


def test_cleanup_hook_is_schema_shaped():
    h = ocifilter.cleanup_hook("/run/gpusandbox/oci/c-abcd1234")
    assert h["path"] == "/bin/sh" and h["args"][:2] == ["sh", "-c"]
    assert h["args"][3:] == ["sh", "/run/gpusandbox/oci/c-abcd1234"]
    assert h["env"] == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    with pytest.raises(UsageError):
        ocifilter.cleanup_hook("/run/gpusandbox/oci/../../etc")


def test_cleanup_hook_removes_the_directory_and_the_emptied_parent(tmp_path):
    """The poststop hook's script, run as the runtime would (state on stdin):
    the container's directory goes, then its parent when it was the last."""
    import subprocess
    base = tmp_path / "oci"
    base.mkdir()
    for n in ("c-aaaa1111", "c-bbbb2222"):
        (base / n).mkdir()
        (base / n / "ld.so.cache-x").write_bytes(b"x")
    (base / "c-aaaa1111" / "link").symlink_to(tmp_path / "keep")
    (tmp_path / "keep").write_text("k")
    for n, left in (("c-aaaa1111", ["c-bbbb2222"]), ("c-bbbb2222", None)):
        h = ocifilter.cleanup_hook(str(base / n))
        r = subprocess.run([h["path"]] + h["args"][1:], input=b'{"ociVersion":"1.0.2"}',
                           env=dict(e.split("=", 1) for e in h["env"]), timeout=30)
        assert r.returncode == 0
        assert (sorted(os.listdir(base)) if base.exists() else None) == left
    assert (tmp_path / "keep").read_text() == "k"


def test_apply_writes_cdi_tmpfs_mounts(tmp_path):
    e = ContainerEdits()
    e.tmpfs += [Tmpfs("/var/lib/gpu-scratch", ro=False), Tmpfs("/opt/ro"),
                Tmpfs("/proc/driver"), Tmpfs("/srv/masked")]
    cfg = configedit.apply({"mounts": [{"destination": "/opt/ro", "type": "bind"}]}, e,
                           str(tmp_path))
    tm = [m for m in cfg["mounts"] if m.get("type") == "tmpfs"]
    # The plan's tmpfs (edits.from_edits: the same size and mode as `run`'s).
    assert tm == [{"destination": "/var/lib/gpu-scratch", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "noexec", "mode=0755", "size=1m"]},
                  {"destination": "/srv/masked", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "noexec", "mode=0755", "size=1m", "ro"]}]
