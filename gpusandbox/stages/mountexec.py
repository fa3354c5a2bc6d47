"""The one executor of a plan's mount operations (edits.MountOp, plan.mounts):
a single pass over the ordered list, as bubblewrap's setup ops, used by the
init (stages/init.py, after the system mounts) and by the OCI hook (oci/hook.py,
over a running container's root).

open_sources() runs on the host side, before the image's tree is attached
(the hook: before or after it enters the container's namespaces, as its
privileges allow): every host source is cloned then, so none can be a path
inside the image and no later mount can shadow one.  apply() then walks the
ops in order; each target is resolved inside the root without following a
symlink out of it (linux/mounts.open_target).

Kernel is the kernel as the init calls it after the clone: one interface
(youki's Syscall trait) for the root filesystem (stages/init.py), the system
mounts (stages/sysmounts.py), these ops, the container's kernel settings,
the masks, the pivot and the command stage (stages/command.py: ids,
capabilities, no_new_privs, seccomp, the execve).  KERNEL is the real one,
over linux/*.py and os; a test double (tests/unit/test_init_order.py)
records the calls instead, so a unit test states the order of the whole
setup without privileges.  Every method is one kernel operation (or one
step of linux/, named so); fds are plain integers the caller passes back.
"""
import os

from ..linux import caps
from ..linux import mounts as m
from ..linux import sys as k


class Kernel:
    # Mounts (linux/mounts.py: the new mount API, targets reached in the root).
    def new_fs(self, fstype, options, attrs):
        return m.new_fs(fstype, options, attrs)

    def clone_tree(self, source, recursive=True, dirfd=k.AT_FDCWD):
        return m.clone_tree(source, recursive, dirfd)

    def clone_source(self, host_path, ident):
        return m.clone_source(host_path, ident)

    def open_host_node(self, host_path, major, minor):
        return m.open_host_node(host_path, major, minor)

    def open_target(self, rootfd, path, kind="dir", create=True, strict=False):
        return m.open_target(rootfd, path, kind, create, strict)

    def restrict(self, fd, ro=True, nosuid=True, nodev=True, noexec=False, recursive=True):
        m.restrict(fd, ro, nosuid, nodev, noexec, recursive)

    def attach(self, fd, target, what):
        m.attach(fd, target, what)

    def mount_setattr(self, fd, attrs, recursive):
        k.mount_setattr(fd, attrs, recursive)

    def set_propagation(self, fd, flag, recursive):
        k.mount_setattr(fd, 0, recursive=recursive, propagation=flag)

    # Files in the root, each relative to a directory fd of it.
    def symlink(self, target, name, dirfd):
        os.symlink(target, name, dir_fd=dirfd)

    def readlink(self, name, dirfd):
        return os.readlink(name, dir_fd=dirfd)

    def unlink(self, name, dirfd):
        os.unlink(name, dir_fd=dirfd)

    def node_of(self, name, dirfd):
        """(S_IF type, rdev) of what is at name."""
        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
        return st.st_mode & 0o170000, st.st_rdev

    def mknod(self, name, mode, rdev, dirfd):
        os.mknod(name, mode, rdev, dir_fd=dirfd)

    def chown(self, name, uid, gid, dirfd):
        os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)

    def chmod(self, name, mode, dirfd):
        os.chmod(name, mode, dir_fd=dirfd, follow_symlinks=True)

    def create_file(self, name, mode, content, dirfd):
        fd = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, mode, dir_fd=dirfd)
        try:
            os.write(fd, content)
        finally:
            os.close(fd)

    def write_in_root(self, rootfd, path, data):
        """data written to an existing file of the root (a /proc/sys key),
        reached without any symlink."""
        fd = k.openat2(rootfd, path, os.O_WRONLY, 0,
                       k.RESOLVE_IN_ROOT | k.RESOLVE_NO_SYMLINKS | k.RESOLVE_NO_MAGICLINKS)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def close(self, fd):
        os.close(fd)

    def dup(self, fd):
        return os.dup(fd)

    # Namespaces and names.
    def unshare(self, flags):
        k.syscall("unshare", flags)

    def setdomainname(self, name):
        k._check(k.libc.setdomainname(name, len(name)), "setdomainname")

    # The root filesystem (stages/init._rootfs) and the pivot.
    def open_image(self, path):
        """An O_PATH fd of the directory at path, no symlink followed."""
        return k.openat2(k.AT_FDCWD, path, k.O_PATH | os.O_DIRECTORY, 0,
                         k.RESOLVE_NO_SYMLINKS | k.RESOLVE_NO_MAGICLINKS)

    def file_id(self, fd):
        st = os.fstat(fd)
        return st.st_dev, st.st_ino

    def open_dir(self, name, dirfd):
        return os.open(name, k.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)

    def mkdir(self, name, mode, dirfd):
        os.mkdir(name, mode, dir_fd=dirfd)

    def prepare_upper(self, lowerfd, upperfd, points, links, sealed=()):
        m.prepare_upper(lowerfd, upperfd, points, links, sealed)

    def become_mapped_root(self, uid_rows, gid_rows):
        from ..linux import idmap       # a full id map only
        idmap.become_mapped_root(uid_rows, gid_rows)

    def move_mount(self, from_fd, to_fd, what):
        k.move_mount(from_fd, to_fd, what)

    def mount(self, source, target, fstype, flags):
        k.mount(source, target, fstype, flags)

    def loopback_up(self):
        from ..linux import net     # loaded by the launcher before the clone
        net.loopback_up()

    def fchdir(self, fd):
        os.fchdir(fd)

    def chdir(self, path):
        os.chdir(path)

    def pivot_root(self, new_root, put_old):
        k.pivot_root(new_root, put_old)

    def umount(self, target, flags):
        k.umount2(target, flags)

    # The command stage (stages/command.py), in the process that execs.
    def reset_signals(self):
        """No signal blocked, none ignored: both survive the execve."""
        import _signal
        _signal.pthread_sigmask(_signal.SIG_SETMASK, ())
        for sig in range(1, _signal.NSIG):
            try:
                if _signal.getsignal(sig) == _signal.SIG_IGN:
                    _signal.signal(sig, _signal.SIG_DFL)
            except (OSError, ValueError):
                pass

    def setsid(self):
        os.setsid()

    def peer_gone(self, fd):
        """Whether the other end of a pipe that is never written has closed:
        a read that does not wait ends at once (EOF) or finds nothing yet."""
        os.set_blocking(fd, False)
        try:
            return os.read(fd, 1) == b""
        except BlockingIOError:
            return False
        finally:
            os.set_blocking(fd, True)

    def spawn(self, path, argv, env):
        """posix_spawn(3) from init (command.spawn), called in libc: the
        command in its own session, with no signal blocked and every one at
        its default action (ignored ones would survive the execve; CPython
        ignores SIGPIPE and SIGXFSZ).  Not os.posix_spawn: its signal sets
        are built with sigaddset(3), which refuses glibc's two internal
        signals (32, 33), and glibc's child leaves those ignored unless the
        default set names them: the command would start with them ignored."""
        attr = (k.c_char * _SPAWNATTR_SIZE)()
        k.libc.posix_spawnattr_init(attr)
        try:
            k.libc.posix_spawnattr_setsigdefault(attr, _ALL_SIGNALS)
            k.libc.posix_spawnattr_setsigmask(attr, _NO_SIGNALS)
            k.libc.posix_spawnattr_setflags(attr, _SPAWN_FLAGS)
            args = [k._b(a) for a in argv]
            envp = [k._b(f"{key}={val}") for key, val in env.items()]
            pid = k.c_int(0)
            err = k.libc.posix_spawn(k.byref(pid), k._b(path), None, attr,
                                     (k.c_char_p * (len(args) + 1))(*args, None),
                                     (k.c_char_p * (len(envp) + 1))(*envp, None))
        finally:
            k.libc.posix_spawnattr_destroy(attr)
        if err:
            raise OSError(err, os.strerror(err), path)
        return pid.value

    def close_range(self, low, high, flags):
        k.syscall("close_range", low, high, flags)

    def drop_bounding(self, keep):
        caps.drop_bounding(keep)

    def prctl(self, option, arg):
        k.prctl(option, arg)

    def setgroups(self, groups):
        os.setgroups(groups)

    def setresgid(self, gid):
        os.setresgid(gid, gid, gid)

    def setresuid(self, uid):
        os.setresuid(uid, uid, uid)

    def set_cap_sets(self, effective, permitted, inheritable, ambient):
        caps.set_cap_sets(effective, permitted, inheritable, ambient)

    def umask(self, mask):
        os.umask(mask)

    def install_seccomp(self, prog):
        from ..linux import seccomp     # only with a filter
        seccomp.install(prog)

    def execve(self, path, argv, env):
        os.execve(path, argv, env)


# posix_spawnattr_t (glibc, both supported ABIs: flags, pgroup, two 1024-bit
# sigset_t, sched_param, policy, reserved ints; 336 bytes), with room to spare.
_SPAWNATTR_SIZE = 512
# sigset_t: signal n is bit n-1; every signal 1..64, and none.
_NO_SIGNALS = (k.c_char * 128)()
_ALL_SIGNALS = (k.c_char * 128)()
_ALL_SIGNALS.raw = b"\xff" * 8 + bytes(120)
# POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSID (spawn.h)
_SPAWN_FLAGS = 0x04 | 0x08 | 0x80

KERNEL = Kernel()


def open_sources(ops, kern=KERNEL):
    """[detached mount fd or None] for each op: host paths and nodes cloned."""
    out = []
    try:
        for op in ops:
            if op.op == "bind":
                out.append(kern.clone_source(op.source, op.ident) if op.ident else
                           kern.clone_tree(op.source, recursive=op.recursive))
            elif op.op == "node":
                fd = kern.open_host_node(op.source, op.major, op.minor)
                try:
                    out.append(kern.clone_tree("", recursive=False, dirfd=fd))
                finally:
                    kern.close(fd)
            else:
                out.append(None)
    except BaseException:
        for fd in out:
            if fd is not None:
                kern.close(fd)
        raise
    return out


def held_fds(ops):
    """The descriptors the ops hold from before the clone (premade nodes)."""
    return {op.fd for op in ops if op.op == "premade"}


# The staging tmpfs of generated files (the "file" ops): each is written
# there and bound read-only from it.
STAGE_FS = ("tmpfs", ("mode=0755", "size=16m"),
            k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC)


def needs_stage(ops):
    return any(op.op == "file" for op in ops)


def _attrs(op):
    return ((k.MOUNT_ATTR_RDONLY if op.ro else 0) | (k.MOUNT_ATTR_NOSUID if op.nosuid else 0)
            | (k.MOUNT_ATTR_NODEV if op.nodev else 0) | (k.MOUNT_ATTR_NOEXEC if op.noexec else 0))


def _target(kern, rootfd, op, path=None, kind=None):
    return kern.open_target(rootfd, path or op.path, kind or op.kind, create=op.create)


def apply(ops, rootfd, fds, sysfs=None, kern=KERNEL, stage=None):
    """Every op in order.  fds: open_sources(ops); sysfs: what the "sysfs" op
    does (the init's /sys, mounted where an OCI config lists it); stage: the
    caller's staging tmpfs (STAGE_FS, kept open), else one is made when a
    "file" op needs it and closed here."""
    own_stage = stage is None
    links = None    # (key, fd): the directory of the symlink ops just before
    try:
        for i, (op, fd) in enumerate(zip(ops, fds)):
            kind = op.op
            if links is not None and kind != "symlink":
                kern.close(links[1])
                links = None
            if kind == "bind":
                if op.reclone:
                    fd = _renumbered(kern, fd, op.recursive)
                kern.restrict(fd, ro=op.ro, nosuid=op.nosuid, nodev=op.nodev,
                              noexec=op.noexec, recursive=op.recursive)
                _attach(kern, fd, _target(kern, rootfd, op), op,
                        f"binding {op.source} at {op.path}")
            elif kind == "node":
                kern.restrict(fd, ro=False, nosuid=op.nosuid, nodev=False, recursive=False)
                kern.attach(fd, _target(kern, rootfd, op), f"binding device {op.source}")
            elif kind == "fs":
                new = kern.new_fs(op.fstype, op.data, _attrs(op))
                _attach(kern, new, _target(kern, rootfd, op), op,
                        f"mounting {op.fstype} at {op.path}")
            elif kind == "symlink":
                links = _symlink(kern, rootfd, op, links)
            elif kind == "file":
                if stage is None:
                    stage = kern.new_fs(*STAGE_FS)
                _file(kern, rootfd, op, stage, f"f{i}")
            elif kind == "seal":
                target = _target(kern, rootfd, op)
                try:
                    kern.mount_setattr(target, k.MOUNT_ATTR_RDONLY, recursive=False)
                finally:
                    kern.close(target)
            elif kind == "sysfs":
                sysfs()
            elif kind == "premade":
                kern.attach(op.fd, _target(kern, rootfd, op), f"binding device {op.path}")
            elif kind == "mknod":
                _mknod(kern, rootfd, op)
    finally:
        if links is not None:
            kern.close(links[1])
        if own_stage and stage is not None:
            kern.close(stage)


def _attach(kern, fd, target, op, what):
    """Attach fd at target, then give the attached mount op's propagation
    (after move_mount the fd is that mount, in this namespace's tree)."""
    if op.propagation is None:
        kern.attach(fd, target, what)
        return
    held = kern.dup(fd)
    try:
        kern.attach(fd, target, what)
        kern.set_propagation(held, op.propagation[0], op.propagation[1])
    finally:
        kern.close(held)


def _renumbered(kern, fd, recursive):
    """A fresh clone of a bind source cloned before the image was attached,
    made now so that its mount id follows the mounts before it: since Linux
    6.8 /proc/PID/mountinfo lists a namespace's mounts by id, and the mount
    table then shows the config's order (runtime-spec config.md, mounts;
    runtime-tools' mounts).  A kernel that cannot clone a detached mount
    keeps the first clone (its order is the one of attachment there)."""
    try:
        fresh = kern.clone_tree("", recursive=recursive, dirfd=fd)
    except OSError:
        return fd
    kern.close(fd)
    return fresh


def _symlink(kern, rootfd, op, links):
    """A link; one already there with the same target is kept, anything else
    of that name replaced.  (With an overlay the links already sit in its
    upper layer, but one whose directory the image leads into /tmp or /run
    is under our fresh tmpfs by now: each is checked again.)

    links: (key, fd) of the directory the symlink op just before resolved,
    or None.  A run of links in one directory (a driver's sonames) uses
    that held fd: no mount was made since it was resolved inside the root,
    and a link only changes an entry of it.  Returns the (key, fd) now
    held, which the caller closes."""
    parent, _, name = op.path.rpartition("/")
    key = (parent or "/", op.create)
    if links is not None and links[0] == key:
        pfd = links[1]
    else:
        if links is not None:
            kern.close(links[1])
        pfd = _target(kern, rootfd, op, parent or "/", "dir")
    try:
        try:
            if kern.readlink(name, pfd) == op.target:
                return key, pfd
            kern.unlink(name, pfd)
        except FileNotFoundError:
            pass
        except OSError:
            # A non-link of that name in the image: replace it.
            kern.unlink(name, pfd)
        kern.symlink(op.target, name, pfd)
    except BaseException:
        kern.close(pfd)
        raise
    return key, pfd


def _file(kern, rootfd, op, stage, name):
    """Generated content, written into our staging tmpfs and bound read-only."""
    kern.create_file(name, op.mode, op.content, stage)
    clone = kern.clone_tree(name, recursive=False, dirfd=stage)
    kern.restrict(clone, ro=op.ro, nosuid=op.nosuid, nodev=op.nodev, noexec=op.noexec)
    kern.attach(clone, _target(kern, rootfd, op), f"placing {op.path}")


def _mknod(kern, rootfd, op):
    """A device node made by mknod(2) (real root in the host's user
    namespace only: oci/confighost.py); what was at the path is replaced,
    unless it is already the same node (one of the init's standard ones)."""
    parent, _, name = op.path.rpartition("/")
    pfd = kern.open_target(rootfd, parent or "/", "dir", create=True)
    rdev = os.makedev(op.major, op.minor)
    try:
        try:
            kern.mknod(name, op.dev_type | 0o600, rdev, pfd)
        except FileExistsError:
            if kern.node_of(name, pfd) == (op.dev_type, rdev):
                return      # a host node: left as is
            kern.unlink(name, pfd)
            kern.mknod(name, op.dev_type | 0o600, rdev, pfd)
        # Not through mknod's mode: the umask would take bits off.
        kern.chown(name, op.uid, op.gid, pfd)
        kern.chmod(name, op.mode, pfd)
    finally:
        kern.close(pfd)
