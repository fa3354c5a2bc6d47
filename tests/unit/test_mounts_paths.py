"""Container paths and the image root: lexical normalisation at the plan,
plain-name walks in the init, the held image fd, and how the launcher reads
image files (fd-relative, never following a symlink out, never stalled by a
lease)."""
import errno
import os
import shutil
import tempfile

import pytest

from gpusandbox import imageroot
from gpusandbox.errors import UsageError
from gpusandbox.linux import mounts as m
from gpusandbox.linux import sys as k

@pytest.fixture
def tree():
    d = tempfile.mkdtemp(prefix="gsbx-unit-paths-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("raw, want", [
    ("/", "/"), ("/a/b", "/a/b"), ("/a/./b/", "/a/b"), ("//a//b", "/a/b"),
    ("/a/../b", "/b"), ("/../../x", "/x"), ("/tmp/a" + "/.." * 30 + "/etc/x", "/etc/x"),
    ("/a/b/../../..", "/"),
])
def test_container_path_is_lexical_and_clamped_at_root(raw, want):
    assert imageroot.container_path(raw) == want


def _dirfd(path):
    return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


@pytest.mark.parametrize("comps", [["a", "..", "escape"], [".", "x"], ["a/b"], [""]])
def test_walk_create_refuses_non_plain_components(tree, comps):
    base = os.path.join(tree, "base")
    os.mkdir(base)
    fd = _dirfd(base)
    try:
        with pytest.raises(m.MountError) as e:
            m._walk_create(fd, comps)
        assert e.value.errno == errno.EINVAL
    finally:
        os.close(fd)
    # Refused before anything was created, inside or next to the base.
    assert os.listdir(base) == [] and sorted(os.listdir(tree)) == ["base"]


def test_canonical_refuses_dotdot_after_a_missing_component(tree):
    os.makedirs(os.path.join(tree, "usr"))
    os.symlink("nx/" + "../" * 10 + "host", os.path.join(tree, "usr", "lib"))
    fd = _dirfd(tree)
    try:
        with pytest.raises(m.MountError) as e:
            m._canonical(fd, "/usr/lib/libx.so")
        assert e.value.errno == errno.ENOENT
        # `..` in existing parts stays inside (clamped at the root).
        assert m._canonical(fd, "/usr/../../usr/new") == (["usr"], ["new"])
    finally:
        os.close(fd)


def test_open_target_creates_only_inside(tree):
    root = os.path.join(tree, "root")
    os.makedirs(os.path.join(root, "mnt"))
    os.symlink("nx/" + "../" * 10 + tree.lstrip("/") + "/escaped",
               os.path.join(root, "mnt", "dst"))
    fd = _dirfd(root)
    try:
        with pytest.raises(m.MountError):
            m.open_target(fd, "/mnt/dst/sub", "dir")
    finally:
        os.close(fd)
    assert not os.path.exists(os.path.join(tree, "escaped"))


# --- the image root --------------------------------------------------------------

def _rootfs(path):
    os.makedirs(os.path.join(path, "bin"))
    os.makedirs(os.path.join(path, "etc"))


def test_image_root_holds_a_directory_fd(tree):
    _rootfs(tree)
    display, fd, config = imageroot.image_root(tree)
    try:
        assert display == tree and config is None
        assert os.path.samestat(os.fstat(fd), os.stat(tree))
        # The held fd is what counts: renaming the directory away changes nothing.
        os.rename(tree, tree + ".moved")
        os.mkdir(tree)
        assert os.path.samestat(os.fstat(fd), os.stat(tree + ".moved"))
    finally:
        os.close(fd)
        shutil.rmtree(tree + ".moved", ignore_errors=True)


@pytest.mark.parametrize("target_exists", [True, False])
def test_bundle_config_symlink_refused_without_looking(tree, target_exists):
    secret = os.path.join(tree, "secret.json")
    if target_exists:
        with open(secret, "w") as f:
            f.write("{}")
    bundle = os.path.join(tree, "bundle")
    _rootfs(os.path.join(bundle, "rootfs"))
    os.symlink(secret, os.path.join(bundle, "config.json"))
    with pytest.raises(UsageError) as e:
        imageroot.image_root(bundle)
    assert e.value.line() == f"invalid OCI bundle {bundle}: its config.json is a symlink"


def test_bundle_reads_config_through_the_fd(tree):
    bundle = os.path.join(tree, "bundle")
    _rootfs(os.path.join(bundle, "rootfs"))
    with open(os.path.join(bundle, "config.json"), "w") as f:
        f.write('{"process": {"cwd": "/w"}}')
    display, fd, config = imageroot.image_root(bundle)
    try:
        assert display == os.path.join(bundle, "rootfs")
        assert b'"/w"' in config
        assert os.path.samestat(os.fstat(fd), os.stat(os.path.join(bundle, "rootfs")))
    finally:
        os.close(fd)


# --- reading image files ---------------------------------------------------------

def test_read_in_root_takes_the_held_fd_and_stays_inside(tree):
    _rootfs(tree)
    with open(os.path.join(tree, "etc", "environment"), "w") as f:
        f.write("A=1\n")
    os.symlink("/etc/environment", os.path.join(tree, "etc", "link"))
    fd = _dirfd(tree)
    try:
        assert k.read_in_root(fd, "/etc/environment") == b"A=1\n"
        # An absolute link resolves in the image, not on the host.
        assert k.read_in_root(fd, "/etc/link") == b"A=1\n"
        assert k.read_in_root(fd, "/etc/passwd") is None
        assert k.kind_in_root(fd, "/etc") == "dir"
        assert k.kind_in_root(fd, "/etc/link") == "file"
        assert k.kind_in_root(fd, "/nx") is None
        os.fstat(fd)  # still open: the caller owns it
    finally:
        os.close(fd)


HOLDER = r"""
import fcntl, os, signal, sys
signal.signal(signal.SIGIO, signal.SIG_IGN)  # the break notice
fd = os.open(sys.argv[1], os.O_WRONLY)
fcntl.fcntl(fd, 1024, fcntl.F_WRLCK)  # F_SETLEASE
sys.stdout.write("ready\n")
sys.stdout.flush()
sys.stdin.read()
"""


def test_read_in_root_breaks_a_lease_instead_of_waiting(tree):
    """A write lease held on an image file by its owner must not stall the
    launcher for the lease-break time: the read fails at once."""
    import subprocess
    import sys
    if os.geteuid() != 0:
        pytest.skip("a lease on a file needs its owner or CAP_LEASE")
    _rootfs(tree)
    path = os.path.join(tree, "etc", "environment")
    with open(path, "w") as f:
        f.write("A=1\n")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    fd = _dirfd(tree)
    try:
        assert holder.stdout.readline() == "ready\n"
        with pytest.raises(OSError) as e:
            k.read_in_root(fd, "/etc/environment")
        assert e.value.errno == errno.EAGAIN
        assert "leased" in str(e.value)
    finally:
        holder.stdin.close()
        holder.wait()
        os.close(fd)


def test_open_target_a_target_that_appears_during_the_walk(tree, monkeypatch):
    """The image's own command renames the target back between the first
    open (ENOENT) and the walk: the target is opened, not an IndexError."""
    root = tree
    os.makedirs(os.path.join(root, "mnt", "x"))
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    real = m._open
    calls = []

    def racing(dirfd, rel, flags, resolve):
        calls.append(rel)
        if len(calls) == 1:
            raise OSError(errno.ENOENT, "gone for a moment")
        return real(dirfd, rel, flags, resolve)
    monkeypatch.setattr(m, "_open", racing)
    got = m.open_target(fd, "/mnt/x")
    try:
        assert os.path.samestat(os.fstat(got), os.stat(os.path.join(root, "mnt", "x")))
    finally:
        os.close(got)
        os.close(fd)


# --- a checked host source (edits.Mount.ident) ----------------------------------

def test_checked_source_is_refused_once_replaced_or_a_link(tmp_path):
    """A directory checked where other users can write (the MPS pipe
    directory) is bound only as the inode that was checked: a link in its
    place, or another directory under its name, is refused before any
    mount call."""
    d = tmp_path / "nvidia-mps"
    d.mkdir()
    st = os.stat(d)
    d.rename(tmp_path / "moved")
    d.mkdir()
    with pytest.raises(m.MountError) as e:
        m.clone_source(str(d), (st.st_dev, st.st_ino))
    assert e.value.errno == errno.ESTALE and "was replaced" in str(e.value)
    d.rmdir()
    d.symlink_to(tmp_path / "moved")
    with pytest.raises(m.MountError) as e:
        m.clone_source(str(d), (st.st_dev, st.st_ino))
    assert e.value.errno == errno.ELOOP
