"""All ctypes declarations for the kernel calls gpusandbox makes.

Every wrapper raises OSError(errno, "<call>(<args>) failed") so that the
stage that called it can report what failed.  x86_64 and aarch64 syscall
numbers are listed; other architectures are refused at import of the
wrappers that need them.

The C types come from `_ctypes`, the extension module under `ctypes`, and
not from `ctypes` itself: importing ctypes costs about 2 ms of every launch
(it defines some forty types, the library loaders and the Python API
library, and imports `types`, `struct` and `ctypes._endian`), while a launch
needs the eight types, the one libc handle and the helpers below.  Both
supported ABIs are LP64, so the 64-bit and size types are `c_ulong`.  A
module off the launch path may import ctypes itself: its types and these
are interchangeable as arguments and fields (both are `_ctypes` types).
"""
import os
import sys as _sys

import _ctypes
import _struct
from _ctypes import Structure, addressof, byref, get_errno, sizeof  # noqa: F401

from . import (CLONE_NEWCGROUP, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS,  # noqa: F401
               CLONE_NEWPID, CLONE_NEWUSER, CLONE_NEWUTS)


def _ctype(name, code):
    return type(name, (_ctypes._SimpleCData,), {"_type_": code, "__module__": __name__})


c_int, c_uint = _ctype("c_int", "i"), _ctype("c_uint", "I")
c_long, c_ulong = _ctype("c_long", "l"), _ctype("c_ulong", "L")
c_ushort, c_char = _ctype("c_ushort", "H"), _ctype("c_char", "c")
c_char_p, c_void_p = _ctype("c_char_p", "z"), _ctype("c_void_p", "P")
c_uint32, c_uint64, c_size_t = c_uint, c_ulong, c_ulong


class _Library:
    """A loaded library's functions as attributes (ctypes.CDLL(None) and
    ctypes.pythonapi): each one an int-returning C function pointer,
    made on first use and kept."""

    def __init__(self, flags):
        self._handle = _ctypes.dlopen(None, _ctypes.RTLD_LOCAL)
        self._fn = type("_Fn", (_ctypes.CFuncPtr,), {"_flags_": flags, "_restype_": c_int})

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        fn = self._fn((name, self))
        setattr(self, name, fn)
        return fn


def create_string_buffer(init, size=None):
    """A mutable char array holding `init` (ctypes.create_string_buffer)."""
    buf = (c_char * (len(init) + 1 if size is None else size))()
    buf.value = init
    return buf


# seccomp(2)'s program: an array of struct sock_filter (linux/filter.h; both
# supported ABIs are little-endian), at most BPF_MAXINSNS of them; a program
# begins by loading (BPF_LD_W_ABS) seccomp_data.arch (at SECCOMP_DATA_ARCH).
# The compiler (seccompbpf.py) writes them, seccomp.py keeps and installs them.
# (`_struct` is what the `struct` module re-exports, one import less.)
SOCK_FILTER = _struct.Struct("<HBBI")
BPF_MAXINSNS = 4096
BPF_LD_W_ABS = 0x20
SECCOMP_DATA_ARCH = 4

libc = _Library(_ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO)
# The interpreter's own C API, called with the GIL held (ctypes.pythonapi).
_pyapi = _Library(_ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_PYTHONAPI)

_MACHINE = os.uname().machine
# Generic (asm-generic) numbers are shared by x86_64 for the new calls (>= 424).
_NR = {
    "x86_64": dict(pivot_root=155, unshare=272, setns=308, clone=56, clone3=435,
                   openat2=437, open_tree=428, move_mount=429, fsopen=430,
                   fsconfig=431, fsmount=432, mount_setattr=442, bpf=321,
                   seccomp=317, capget=125, capset=126, pidfd_open=434,
                   pidfd_send_signal=424, memfd_create=319, close_range=436),
    "aarch64": dict(pivot_root=41, unshare=97, setns=268, clone=220, clone3=435,
                    openat2=437, open_tree=428, move_mount=429, fsopen=430,
                    fsconfig=431, fsmount=432, mount_setattr=442, bpf=280,
                    seccomp=277, capget=90, capset=91, pidfd_open=434,
                    pidfd_send_signal=424, memfd_create=279, close_range=436),
}.get(_MACHINE, {})

_syscall = libc.syscall
_syscall.restype = c_long
# Each number as the argument the raw call takes, made once (a few hundred
# calls a launch).
_NR_ARG = {name: c_long(num) for name, num in _NR.items()}


def nr(name):
    try:
        return _NR[name]
    except KeyError:
        raise OSError(38, f"{name}: no syscall number known for {_MACHINE}") from None


def _nr_arg(name):
    arg = _NR_ARG.get(name)
    return arg if arg is not None else c_long(nr(name))


def syscall(name, *args):
    """Raw syscall; returns the result or raises OSError naming the call."""
    res = _syscall(_nr_arg(name), *args)
    if res == -1:
        e = get_errno()
        raise OSError(e, f"{name} failed: {os.strerror(e)}")
    return res


def _check(res, what):
    if res == -1:
        e = get_errno()
        raise OSError(e, f"{what} failed: {os.strerror(e)}")
    return res


# --- mount(2) family -------------------------------------------------------
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_UNBINDABLE = 1 << 17
MS_PRIVATE = 1 << 18
MS_SLAVE = 1 << 19
MS_SHARED = 1 << 20
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2

libc.mount.argtypes = (c_char_p, c_char_p, c_char_p, c_ulong, c_char_p)
libc.umount2.argtypes = (c_char_p, c_int)


_FS_CODEC = (_sys.getfilesystemencoding(), _sys.getfilesystemencodeerrors())


def _b(s):
    """A path or string argument as bytes (os.fsencode's rule, without its
    call layers: the wrappers pass a few hundred a launch)."""
    if s is None or type(s) is bytes:
        return s
    return s.encode(*_FS_CODEC) if type(s) is str else os.fsencode(s)


def mount(source, target, fstype, flags=0, data=None):
    res = libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data))
    return _check(res, f"mount({source}, {target}, {fstype})")


def umount2(target, flags=0):
    return _check(libc.umount2(_b(target), flags), f"umount2({target})")


def pivot_root(new_root, put_old):
    return syscall("pivot_root", _b(new_root), _b(put_old))


# --- namespaces --------------------------------------------------------------
# CLONE_NEW*: imported above from the package's NAMESPACES, the one table of them.
CLONE_INTO_CGROUP = 0x200000000
CLONE_PIDFD = 0x00001000
CLONE_PARENT = 0x00008000


def unshare(flags):
    return syscall("unshare", c_int(flags))


class _CloneArgs(Structure):
    _fields_ = [("flags", c_uint64), ("pidfd", c_uint64),
                ("child_tid", c_uint64), ("parent_tid", c_uint64),
                ("exit_signal", c_uint64), ("stack", c_uint64),
                ("stack_size", c_uint64), ("tls", c_uint64),
                ("set_tid", c_uint64), ("set_tid_size", c_uint64),
                ("cgroup", c_uint64)]


def clone_fork(flags, cgroup_fd=-1):
    """fork()-like clone3 with namespace flags (and CLONE_INTO_CGROUP when a
    cgroup dir fd is given).  Returns 0 in the child, the pid in the parent.

    No stack is passed, so the child runs on a copy-on-write copy of the
    caller's stack exactly as after fork(); Python's own fork hooks run
    around it so the interpreter state in the child is sound."""
    args = _CloneArgs()
    args.flags = flags
    # CLONE_PARENT: the caller's parent gets the child, with the caller's own
    # exit signal; clone3 then insists on exit_signal 0.
    args.exit_signal = 0 if flags & CLONE_PARENT else 17  # SIGCHLD
    if cgroup_fd >= 0:
        args.flags |= CLONE_INTO_CGROUP
        args.cgroup = cgroup_fd
    _pyapi.PyOS_BeforeFork()
    res = _syscall(_nr_arg("clone3"), byref(args),
                   c_size_t(sizeof(args)))
    e = get_errno()
    if res == 0:
        _pyapi.PyOS_AfterFork_Child()
        return 0
    _pyapi.PyOS_AfterFork_Parent()
    if res == -1:
        raise OSError(e, f"clone3 failed: {os.strerror(e)}")
    return res


# --- openat2 -------------------------------------------------------------------
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

O_PATH = 0o10000000


class _OpenHow(Structure):
    _fields_ = [("flags", c_uint64), ("mode", c_uint64),
                ("resolve", c_uint64)]


AT_FDCWD = -100


_HOW_SIZE = c_size_t(sizeof(_OpenHow))


def openat2(dirfd, path, flags, mode=0, resolve=RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS):
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    args = (_nr_arg("openat2"), c_int(dirfd), _b(path), byref(how), _HOW_SIZE)
    # With RESOLVE_IN_ROOT/BENEATH the kernel answers EAGAIN when a rename or
    # a mount anywhere raced a `..` step, and asks the caller to retry
    # (openat2(2)); a bounded retry keeps a busy host from failing a launch.
    for _ in range(64):
        res = _syscall(*args)
        if res != -1:
            return res
        e = get_errno()
        if e != 11 or not resolve & (RESOLVE_IN_ROOT | RESOLVE_BENEATH):
            break
    raise OSError(e, f"openat2({path}) failed: {os.strerror(e)}", path)


def tree_fd(root):
    """(fd, owned): an int is a held directory fd of the tree, used as is; a
    str is opened here (doctor and tests; the launcher always holds an fd)."""
    if isinstance(root, int):
        return root, False
    return os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), True


def walk_fd(basefd, comps, step):
    """The fd that step(fd, i, comp) returns for the last of `comps`, each
    step opened from the fd of the one before it (basefd, dup'ed, for the
    first).  Every fd but the last is closed, on failure too."""
    fd = os.dup(basefd)
    try:
        for i, comp in enumerate(comps):
            nfd = step(fd, i, comp)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_in_root(root, path, limit=64 << 20,
                 resolve=RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS):
    """Read a file of an untrusted tree (an image) from the host side.

    root: the tree's directory fd (or path).  The path is resolved with the
    tree as its root (RESOLVE_IN_ROOT), so an absolute or ../ symlink in the
    image stays inside it, and magic links (/proc/self/...) are refused.
    Only a regular file is read: the name is first opened O_PATH and checked,
    then that same inode is reopened, so an image cannot make the launcher
    open a FIFO (a hang) or a device node (a side effect of open, as root).
    The reopen is O_NONBLOCK: a write lease the image's owner holds on the
    file is broken instead of stalling the launch (EWOULDBLOCK, reported).
    Returns None when there is no such file."""
    import stat as _stat
    rootfd, owned = tree_fd(root)
    try:
        try:
            pfd = openat2(rootfd, path.lstrip("/"), O_PATH, 0, resolve)
        except OSError as e:
            if e.errno in (2, 20, 40, 18):  # ENOENT, ENOTDIR, ELOOP, EXDEV
                return None
            raise
        try:
            if not _stat.S_ISREG(os.fstat(pfd).st_mode):
                return None
            try:
                fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK
                             | os.O_NOCTTY | os.O_CLOEXEC)
            except BlockingIOError:
                raise OSError(11, f"the image's {path} is leased by another process "
                                  "(fcntl F_SETLEASE); not waiting for it", path) from None
        finally:
            os.close(pfd)
        try:
            return read_fd(fd, limit)
        finally:
            os.close(fd)
    finally:
        if owned:
            os.close(rootfd)


def kind_in_root(root, path):
    """"dir", "file" (regular), "other", or None when `path` does not resolve
    inside the tree."""
    import stat as _stat
    rootfd, owned = tree_fd(root)
    try:
        fd = openat2(rootfd, path.lstrip("/"), O_PATH)
    except OSError:
        return None
    finally:
        if owned:
            os.close(rootfd)
    try:
        mode = os.fstat(fd).st_mode
    finally:
        os.close(fd)
    if _stat.S_ISDIR(mode):
        return "dir"
    return "file" if _stat.S_ISREG(mode) else "other"


# --- user-namespace id maps (user_namespaces(7)) ------------------------------
def write_proc(path, data):
    """Write one /proc/<pid>/ map or setgroups file in a single write."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data)
    except OSError as e:
        from ..errors import SandboxError
        raise SandboxError(f"writing {path}", os.strerror(e.errno)) from None
    finally:
        os.close(fd)


def _fmt(lines):
    return "".join(f"{a} {b} {c}\n" for a, b, c in lines).encode()


def write_single(pid, uid_in, uid_out, gid_in, gid_out, root):
    """One-id maps written without helper binaries (wider ones: idmap.py).
    pid "self": the child writes its own, from inside the new namespace,
    where even real root holds no CAP_SETGID in the parent namespace: a
    gid_map is then accepted only after setgroups is denied
    (user_namespaces(7)), as for any user."""
    base = f"/proc/{pid}/"
    if not root or pid == "self":
        write_proc(base + "setgroups", b"deny")
    write_proc(base + "uid_map", _fmt([(uid_in, uid_out, 1)]))
    write_proc(base + "gid_map", _fmt([(gid_in, gid_out, 1)]))


# --- prctl -----------------------------------------------------------------------
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

libc.prctl.argtypes = (c_int, c_ulong, c_ulong, c_ulong, c_ulong)


def prctl(option, a2=0, a3=0, a4=0, a5=0):
    return _check(libc.prctl(option, a2, a3, a4, a5), f"prctl({option})")


# --- the new mount API (Linux >= 5.2; mount_setattr >= 5.12) ---------------
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = 0o2000000
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000
AT_SYMLINK_NOFOLLOW = 0x100
MOVE_MOUNT_F_EMPTY_PATH = 0x04
MOVE_MOUNT_T_EMPTY_PATH = 0x40
FSOPEN_CLOEXEC = 1
FSMOUNT_CLOEXEC = 1
FSCONFIG_SET_FLAG = 0
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8
MOUNT_ATTR_NOSYMFOLLOW = 0x00200000


class _MountAttr(Structure):
    _fields_ = [("attr_set", c_uint64), ("attr_clr", c_uint64),
                ("propagation", c_uint64), ("userns_fd", c_uint64)]


def open_tree(dirfd, path, flags):
    return syscall("open_tree", c_int(dirfd), _b(path), c_uint(flags))


def move_mount(from_fd, to_fd, what="move_mount"):
    res = _syscall(_nr_arg("move_mount"), c_int(from_fd), b"",
                   c_int(to_fd), b"",
                   c_uint(MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH))
    return _check(res, what)


def mount_setattr(fd, attr_set, recursive=True, attr_clr=0, propagation=0):
    attr = _MountAttr(attr_set, attr_clr, propagation, 0)
    flags = AT_EMPTY_PATH | (AT_RECURSIVE if recursive else 0)
    return syscall("mount_setattr", c_int(fd), b"", c_uint(flags),
                   byref(attr), c_size_t(sizeof(attr)))


def fsopen(fstype):
    return syscall("fsopen", _b(fstype), c_uint(FSOPEN_CLOEXEC))


def fsconfig(fd, key, value=None):
    if value is None:
        return syscall("fsconfig", c_int(fd), c_uint(FSCONFIG_SET_FLAG),
                       _b(key), None, c_int(0))
    return syscall("fsconfig", c_int(fd), c_uint(FSCONFIG_SET_STRING),
                   _b(key), _b(value), c_int(0))


def fsmount(fsfd, attrs=0):
    syscall("fsconfig", c_int(fsfd), c_uint(FSCONFIG_CMD_CREATE),
            None, None, c_int(0))
    return syscall("fsmount", c_int(fsfd), c_uint(FSMOUNT_CLOEXEC),
                   c_uint(attrs))


def sethostname(name):
    n = _b(name)
    return _check(libc.sethostname(n, c_size_t(len(n))), "sethostname")


def set_comm(name):
    """prctl(PR_SET_NAME): the name ps and /proc/PID/comm show (15 bytes)."""
    buf = create_string_buffer(_b(name)[:15])
    prctl(PR_SET_NAME, addressof(buf))


def read_fd(fd, limit=None, chunk=1 << 20):
    """The bytes of an open fd up to EOF or `limit` bytes (None: no limit),
    in raw reads of at most `chunk` bytes, without io.open's buffering
    layers (fstat + TCGETS + lseek per file)."""
    chunks = []
    while limit is None or limit > 0:
        b = os.read(fd, chunk if limit is None else min(limit, chunk))
        if not b:
            break
        chunks.append(b)
        if limit is not None:
            limit -= len(b)
    return b"".join(chunks)


def read_file(path):
    """The bytes of a host file (trusted path), read raw: the launch reads
    a few dozen."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return read_fd(fd)
    finally:
        os.close(fd)
