"""The one executor of a plan's mount operations (gpusandbox/mountops.py):
a single pass over the ordered list, as bubblewrap's setup ops, used by the
init (stages/init.py, after the system mounts) and by the OCI hook (oci/hook.py,
over a running container's root).

open_sources() runs on the host side, before the image's tree is attached
(the hook: before or after it enters the container's namespaces, as its
privileges allow): every host source is cloned then, so none can be a path
inside the image and no later mount can shadow one.  apply() then walks the
ops in order; each target is resolved inside the root without following a
symlink out of it (linux/mounts.open_target).
"""
import os

from ..linux import mounts as m
from ..linux import sys as k


def open_sources(ops):
    """[detached mount fd or None] for each op: host paths and nodes cloned."""
    out = []
    try:
        for op in ops:
            if op.op == "bind":
                out.append(m.clone_source(op.source, op.ident) if op.ident else
                           m.clone_tree(op.source, recursive=op.recursive))
            elif op.op == "node":
                fd = m.open_host_node(op.source, op.major, op.minor)
                try:
                    out.append(m.clone_tree("", recursive=False, dirfd=fd))
                finally:
                    os.close(fd)
            else:
                out.append(None)
    except BaseException:
        close(out)
        raise
    return out


def close(fds):
    for fd in fds:
        if fd is not None:
            os.close(fd)


def held_fds(ops):
    """The descriptors the ops hold from before the clone (premade nodes)."""
    return {op.fd for op in ops if op.op == "premade"}


def _attrs(op):
    return ((k.MOUNT_ATTR_RDONLY if op.ro else 0) | (k.MOUNT_ATTR_NOSUID if op.nosuid else 0)
            | (k.MOUNT_ATTR_NODEV if op.nodev else 0) | (k.MOUNT_ATTR_NOEXEC if op.noexec else 0))


def _target(rootfd, op, path=None, kind=None):
    return m.open_target(rootfd, path or op.path, kind or op.kind, create=op.create)


def apply(ops, rootfd, fds, sysfs=None):
    """Every op in order.  fds: open_sources(ops); sysfs: what the "sysfs" op
    does (the init's /sys, mounted where an OCI config lists it)."""
    stage = None
    try:
        for i, (op, fd) in enumerate(zip(ops, fds)):
            kind = op.op
            if kind == "bind":
                m.restrict(fd, ro=op.ro, nosuid=op.nosuid, nodev=op.nodev, noexec=op.noexec,
                           recursive=op.recursive)
                m.attach(fd, _target(rootfd, op), f"binding {op.source} at {op.path}")
            elif kind == "node":
                m.restrict(fd, ro=False, nosuid=op.nosuid, nodev=False, recursive=False)
                m.attach(fd, _target(rootfd, op), f"binding device {op.source}")
            elif kind == "fs":
                new = m.new_fs(op.fstype, op.data, _attrs(op))
                m.attach(new, _target(rootfd, op), f"mounting {op.fstype} at {op.path}")
            elif kind == "symlink":
                _symlink(rootfd, op)
            elif kind == "file":
                if stage is None:
                    stage = m.new_fs("tmpfs", ("mode=0755", "size=16m"), k.MOUNT_ATTR_NOSUID
                                     | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC)
                _file(rootfd, op, stage, f"f{i}")
            elif kind == "seal":
                target = _target(rootfd, op)
                try:
                    k.mount_setattr(target, k.MOUNT_ATTR_RDONLY, recursive=False)
                finally:
                    os.close(target)
            elif kind == "sysfs":
                sysfs()
            elif kind == "premade":
                m.attach(op.fd, _target(rootfd, op), f"binding device {op.path}")
            elif kind == "mknod":
                _mknod(rootfd, op)
    finally:
        if stage is not None:
            os.close(stage)


def _symlink(rootfd, op):
    """A link; one already there with the same target is kept, anything else
    of that name replaced.  (With an overlay the links already sit in its
    upper layer, but one whose directory the image leads into /tmp or /run
    is under our fresh tmpfs by now: each is checked again.)"""
    parent, _, name = op.path.rpartition("/")
    pfd = _target(rootfd, op, parent or "/", "dir")
    try:
        try:
            if os.readlink(name, dir_fd=pfd) == op.target:
                return
            os.unlink(name, dir_fd=pfd)
        except FileNotFoundError:
            pass
        except OSError:
            # A non-link of that name in the image: replace it.
            os.unlink(name, dir_fd=pfd)
        os.symlink(op.target, name, dir_fd=pfd)
    finally:
        os.close(pfd)


def _file(rootfd, op, stage, name):
    """Generated content, written into our staging tmpfs and bound read-only."""
    fd = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, op.mode, dir_fd=stage)
    try:
        os.write(fd, op.content)
    finally:
        os.close(fd)
    clone = m.clone_tree(name, recursive=False, dirfd=stage)
    m.restrict(clone, ro=op.ro, nosuid=op.nosuid, nodev=op.nodev, noexec=op.noexec)
    m.attach(clone, _target(rootfd, op), f"placing {op.path}")


def _mknod(rootfd, op):
    """A device node made by mknod(2) (real root in the host's user
    namespace only: oci/confighost.py); what was at the path is replaced,
    unless it is already the same node (one of the init's standard ones)."""
    parent, _, name = op.path.rpartition("/")
    pfd = m.open_target(rootfd, parent or "/", "dir", create=True)
    try:
        try:
            os.mknod(name, op.dev_type | 0o600, os.makedev(op.major, op.minor), dir_fd=pfd)
        except FileExistsError:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            if st.st_mode & 0o170000 == op.dev_type and \
                    st.st_rdev == os.makedev(op.major, op.minor):
                return      # a host node: left as is
            os.unlink(name, dir_fd=pfd)
            os.mknod(name, op.dev_type | 0o600, os.makedev(op.major, op.minor), dir_fd=pfd)
        # Not through mknod's mode: the umask would take bits off.
        os.chown(name, op.uid, op.gid, dir_fd=pfd, follow_symlinks=False)
        os.chmod(name, op.mode, dir_fd=pfd, follow_symlinks=True)
    finally:
        os.close(pfd)
