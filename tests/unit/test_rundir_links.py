"""rundir.trusted_dir for a path the caller names itself (gpusandbox-oci
--root): symlinks of root's or the caller's are followed and their targets
walked by the same rule ('..' in a target included), anyone else's refused;
missing parts made 0700 with `make`; a loop ends in ELOOP.  And the OCI
state root's rule: another user's directory on the way, or a root others
can write, is refused."""
import errno
import os

import pytest

from gpusandbox import rundir

OTHER = 3999999923

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns to another uid")


def _real(fd):
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


def test_links_of_root_or_the_caller_are_followed(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    os.symlink("a/b", tmp_path / "rel")
    os.symlink(str(tmp_path / "a"), tmp_path / "abs")
    os.symlink("../a/b/..", tmp_path / "a" / "up")
    assert _real(rundir.trusted_dir(str(tmp_path / "rel"), own=False, links=True)) == \
        str(tmp_path / "a" / "b")
    assert _real(rundir.trusted_dir(str(tmp_path / "abs" / "b"), links=True)) == \
        str(tmp_path / "a" / "b")
    assert _real(rundir.trusted_dir(str(tmp_path / "a" / "up"), links=True)) == \
        str(tmp_path / "a")
    # Without `links`, as every other caller of the rule walks: no link at all.
    with pytest.raises(OSError) as e:
        rundir.trusted_dir(str(tmp_path / "rel"), own=False)
    assert e.value.errno in (errno.ELOOP, errno.ENOTDIR)


def test_another_users_link_or_directory_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    os.symlink("a", tmp_path / "theirs")
    os.lchown(tmp_path / "theirs", OTHER, OTHER)
    with pytest.raises(rundir.Taken) as e:
        rundir.trusted_dir(str(tmp_path / "theirs"), own=False, links=True)
    assert e.value.foreign and "symbolic link owned by uid" in e.value.why
    (tmp_path / "shared").mkdir()
    os.chown(tmp_path / "shared", OTHER, OTHER)
    with pytest.raises(rundir.Taken) as e:
        rundir.open_oci_root(str(tmp_path / "shared" / "state"), True, make=True)
    assert e.value.path == str(tmp_path / "shared")
    assert not (tmp_path / "shared" / "state").exists()


def test_a_root_others_can_write_is_refused_and_parts_are_made(tmp_path):
    open_root = tmp_path / "open"
    open_root.mkdir()
    os.chmod(open_root, 0o1777)
    with pytest.raises(rundir.Taken) as e:
        rundir.open_oci_root(str(open_root), True)
    assert e.value.path == str(open_root) and not e.value.foreign
    fd = rundir.open_oci_root(str(tmp_path / "x" / "y"), True, make=True)
    st = os.fstat(fd)
    os.close(fd)
    assert st.st_mode & 0o7777 == 0o700 and st.st_uid == os.geteuid()
    assert (tmp_path / "x").stat().st_mode & 0o7777 == 0o700
    assert rundir.open_oci_root(str(tmp_path / "nothing"), True) is None


def test_a_link_loop_ends(tmp_path):
    os.symlink("l2", tmp_path / "l1")
    os.symlink("l1", tmp_path / "l2")
    with pytest.raises(OSError) as e:
        rundir.trusted_dir(str(tmp_path / "l1"), links=True)
    assert e.value.errno == errno.ELOOP
