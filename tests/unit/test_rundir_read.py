"""rundir.read_owned: a small file read from a directory others may have
planted in (the MPS pipe directory's pid file): never blocking on a FIFO,
never following a link, only a regular file of the expected owner, bounded."""
import errno
import os

import pytest

from gpusandbox import rundir


@pytest.fixture
def dirfd(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_regular_file_of_the_caller_is_read_bounded(tmp_path, dirfd):
    (tmp_path / "pid").write_text("12345\n" + "x" * 100)
    assert rundir.read_owned(dirfd, "pid", 32) == b"12345\n" + b"x" * 26


def test_fifo_is_refused_without_blocking(tmp_path, dirfd):
    # No writer ever opens it: a blocking open would hang here.
    os.mkfifo(tmp_path / "pid")
    with pytest.raises(rundir.Taken, match="not a regular file"):
        rundir.read_owned(dirfd, "pid", 32)


def test_link_is_not_followed(tmp_path, dirfd):
    (tmp_path / "elsewhere").write_text("1\n")
    os.symlink(tmp_path / "elsewhere", tmp_path / "pid")
    with pytest.raises(OSError) as e:
        rundir.read_owned(dirfd, "pid", 32)
    assert e.value.errno == errno.ELOOP


def test_file_of_another_owner_is_refused(tmp_path, dirfd):
    (tmp_path / "pid").write_text("1\n")
    other = os.geteuid() + 1
    with pytest.raises(rundir.Taken, match=f"owned by uid {os.geteuid()}, not by uid {other}"):
        rundir.read_owned(dirfd, "pid", 32, uid=other)
