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


# --- mount points made in the root: fewer calls, the same places ------------------

def test_open_target_makes_a_missing_target_under_its_parents_without_walking(tree, monkeypatch):
    """A missing target (and missing directories above it) is made under the
    deepest directory that exists, reached as the target would be: the
    image's own links are followed inside the root, nothing is lstat'ed
    component by component; a file comes back held by the open that made it."""
    os.makedirs(os.path.join(tree, "usr", "lib"))
    os.symlink("usr/lib", os.path.join(tree, "lib"))
    fd = os.open(tree, os.O_PATH | os.O_DIRECTORY)

    def no_walk(*a, **kw):
        raise AssertionError("walked the image component by component")
    monkeypatch.setattr(m, "_canonical", no_walk)
    try:
        got = m.open_target(fd, "/lib/firmware/nvidia/gsp.bin", "file")
        want = os.path.join(tree, "usr", "lib", "firmware", "nvidia", "gsp.bin")
        assert os.path.samestat(os.fstat(got), os.stat(want))
        os.close(got)
        got = m.open_target(fd, "/dev/pts", "dir")
        assert os.path.samestat(os.fstat(got), os.stat(os.path.join(tree, "dev", "pts")))
        os.close(got)
    finally:
        os.close(fd)


@pytest.mark.parametrize("strict", [False, True])
def test_open_target_a_dangling_image_link_at_the_name(tree, strict):
    """A link of the image where the target is missing: the target is made
    where it leads, inside the root (the walk), or refused for a system
    mount point (strict); never a file made beside or outside."""
    os.makedirs(os.path.join(tree, "root", "etc"))
    os.makedirs(os.path.join(tree, "root", "run"))
    os.symlink("/run/r/resolv.conf", os.path.join(tree, "root", "etc", "resolv.conf"))
    os.makedirs(os.path.join(tree, "run", "r"))   # what the link names on the host
    fd = os.open(os.path.join(tree, "root"), os.O_PATH | os.O_DIRECTORY)
    try:
        if strict:
            with pytest.raises(m.MountError) as e:
                m.open_target(fd, "/etc/resolv.conf", "file", strict=True)
            assert "symlink" in str(e.value)
        else:
            got = m.open_target(fd, "/etc/resolv.conf", "file")
            want = os.path.join(tree, "root", "run", "r", "resolv.conf")
            assert os.path.samestat(os.fstat(got), os.stat(want))
            os.close(got)
    finally:
        os.close(fd)
    assert not os.path.exists(os.path.join(tree, "run", "r", "resolv.conf"))
    assert os.path.islink(os.path.join(tree, "root", "etc", "resolv.conf"))


def test_open_target_names_a_directory_where_a_directory_is_not(tree):
    os.makedirs(os.path.join(tree, "a"))
    open(os.path.join(tree, "a", "f"), "w").close()
    fd = os.open(tree, os.O_PATH | os.O_DIRECTORY)
    try:
        with pytest.raises(m.MountError) as e:
            m.open_target(fd, "/a/f", "dir")
        assert "mount point /a/f in the image is not a directory" in str(e.value)
        with pytest.raises(m.MountError) as e:
            m.open_target(fd, "/a/f/x", "dir")
        assert "cannot resolve /a/f/x" in str(e.value)
    finally:
        os.close(fd)


def test_prepare_upper_reads_each_image_entry_once_and_never_unlinks(tree, monkeypatch):
    """GPU injection puts dozens of files and links in a few directories:
    each entry of the image is lstat'ed once, the upper layer (ours, fresh)
    gets its links without an unlink first, and everything lands where the
    image's links lead."""
    lower, upper = os.path.join(tree, "lower"), os.path.join(tree, "upper")
    os.makedirs(os.path.join(lower, "usr", "lib", "x"))
    os.makedirs(os.path.join(lower, "usr", "bin"))
    os.symlink("usr/lib", os.path.join(lower, "lib"))
    os.makedirs(upper)
    seen, unlinked = [], []
    real_lstat, real_unlink = os.lstat, os.unlink

    def lstat(p, *, dir_fd=None):
        seen.append(p)
        return real_lstat(p, dir_fd=dir_fd)

    def unlink(p, *, dir_fd=None):
        unlinked.append(p)
        return real_unlink(p, dir_fd=dir_fd)
    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(os, "unlink", unlink)
    points = [(f"/usr/lib/x/lib{i}.so.1", "file") for i in range(5)] + \
        [("/usr/bin/smi", "file"), ("/lib/firmware/n/gsp.bin", "file"), ("/usr/lib/x/d", "dir")]
    links = [(f"/usr/lib/x/lib{i}.so", f"lib{i}.so.1") for i in range(5)]
    lfd = os.open(lower, os.O_PATH | os.O_DIRECTORY)
    ufd = os.open(upper, os.O_PATH | os.O_DIRECTORY)
    try:
        m.prepare_upper(lfd, ufd, points, links)
    finally:
        os.close(lfd)
        os.close(ufd)
    assert len(seen) == len(set(seen)), sorted(seen)
    assert unlinked == []
    for i in range(5):
        assert os.path.isfile(os.path.join(upper, f"usr/lib/x/lib{i}.so.1"))
        assert os.readlink(os.path.join(upper, f"usr/lib/x/lib{i}.so")) == f"lib{i}.so.1"
    assert os.path.isfile(os.path.join(upper, "usr/bin/smi"))
    assert os.path.isfile(os.path.join(upper, "usr/lib/firmware/n/gsp.bin"))
    assert os.path.isdir(os.path.join(upper, "usr/lib/x/d"))
    assert not os.path.exists(os.path.join(upper, "lib"))


_ATTACH = r"""
import os, sys
from gpusandbox.linux import mounts as m
d = sys.argv[1]
src = m.clone_tree(os.path.join(d, "f"), recursive=False)
try:
    m.attach(src, os.open(os.path.join(d, "dir"), os.O_PATH | os.O_CLOEXEC), "binding f at /dir")
except m.MountError as e:
    print(e.strerror)
"""


def test_attach_names_a_file_mount_refused_on_a_directory(tree):
    """A file's mount point is not fstat'ed (open_target with create): the
    kernel refuses a file on a directory, and attach says which is which."""
    import subprocess
    import sys
    open(os.path.join(tree, "f"), "w").close()
    os.makedirs(os.path.join(tree, "dir"))
    r = subprocess.run(["unshare", "-rm", sys.executable, "-c", _ATTACH, tree],
                       capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(
                           os.path.dirname(os.path.abspath(__file__))))})
    if r.returncode != 0 and "unshare" in r.stderr:
        pytest.skip(f"no user namespace here: {r.stderr.strip()}")
    assert r.stdout.strip() == ("binding f at /dir: the mount point in the image is a "
                                "directory, the source is not"), r.stderr
