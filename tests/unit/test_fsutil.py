"""linux/fsutil.write_atomic: the one writer behind the seccomp and ceiling
caches and the CDI spec output."""
import os

import pytest

from gpusandbox.linux import fsutil


def test_replaces_with_the_mode_asked_past_the_umask(tmp_path):
    target = tmp_path / "out"
    target.write_bytes(b"old")
    old = os.umask(0o077)
    try:
        assert fsutil.write_atomic(str(target), b"new" * 100000, 0o644, chmod=True, fsync=True)
    finally:
        os.umask(old)
    assert target.read_bytes() == b"new" * 100000
    assert target.stat().st_mode & 0o777 == 0o644
    assert os.listdir(tmp_path) == ["out"]


def test_a_planted_temporary_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    target = tmp_path / "out"
    tmp = f"{target}.{os.getpid()}.tmp"
    os.symlink(victim, tmp)
    with pytest.raises(FileExistsError):
        fsutil.write_atomic(str(target), b"x", 0o600)
    assert victim.read_bytes() == b"keep" and os.path.islink(tmp)
    # A cache writer gives up quietly and clears the name for the next one.
    assert fsutil.write_atomic(str(target), b"x", 0o600, best_effort=True) is False
    assert victim.read_bytes() == b"keep" and not os.path.lexists(tmp)
    assert not target.exists()


def test_a_failed_rename_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "dir"
    target.mkdir()
    (target / "f").write_bytes(b"")        # rename over a non-empty directory fails
    assert fsutil.write_atomic(str(target), b"x", 0o600, best_effort=True) is False
    with pytest.raises(OSError):
        fsutil.write_atomic(str(target), b"x", 0o600)
    assert sorted(os.listdir(tmp_path)) == ["dir"]
