"""One squashfs mount per node for all the ranks that run the same FILE.sqsh.

Without this, N ranks of a node launched on one FILE.sqsh make N loop devices and
N squashfs superblocks, each with its own page cache of the same bytes.  Here the
first rank mounts the file (the detached mount of image/squash.py) and starts a
keeper: a process of its own session that holds that mount's fd and nothing else.
Every rank, the first included, runs on a clone of it (open_tree(OPEN_TREE_CLONE)
of /proc/KEEPER/fd/N, the same superblock and loop device), which the init attaches
as it attaches a mount of its own.  There is no daemon: the keeper is started by
the first rank and ends when the last rank's launcher has ended.

Coordination is through files only, in /run/gpusandbox/nodeimage (root's, mode
0700, never followed through a symlink), per key = node name, uid and the file's
identity (device, inode, size, mtime):
  KEY.lock    flock LOCK_EX: the mutex around "find or start the keeper, take a
              reference";
  KEY.ref     flock LOCK_SH held by every rank's launcher while its sandbox lives
              (the kernel drops it when the launcher dies, SIGKILL included);
  KEY.keeper  "PID STARTTIME FD" of the live keeper.
A launcher whose sandbox ended drops its reference under the mutex and, when no
other reference is left (LOCK_EX|LOCK_NB on KEY.ref succeeds), ends the keeper and
removes the three files itself, before it exits: under Slurm the step's cleanup may
kill whatever is left in the step's cgroup the moment the last task ended.  For a
launcher that could not (SIGKILL), the keeper checks twice a second, under the
mutex, whether any reference is left, and retires the same way.  The mount goes with
its last holder and the loop device with the mount (autoclear).  The keeper holds
LOCK_EX of KEY.ref only while it holds the mutex, so a rank never waits on it; a
rank whose lock file was removed while it waited opens the new one.

Used by real-root launches (kernel squashfs) inside a Slurm job, or anywhere with
GPUSANDBOX_NODE_IMAGE=1 (GPUSANDBOX_NODE_IMAGE=0 turns it off).  Rootless launches
keep one squashfuse per rank: a fuse mount lives in its helper's user namespace.
A kernel that cannot clone a detached mount (before 6.15: EINVAL) gives each rank a
mount of its own, as without sharing.
"""
import errno
import fcntl
import os
import time

from ..errors import UsageError
from ..linux import sys as k

DIR = "/run/gpusandbox/nodeimage"      # rundir.ROOT_BASE + "/nodeimage": for messages
_FILE = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
KEEPER_NAME = "gsbx-nodeimage"


def enabled(environ=None):
    env = os.environ if environ is None else environ
    val = env.get("GPUSANDBOX_NODE_IMAGE", "")
    if val in ("0", "1"):
        return val == "1"
    return bool(env.get("SLURM_JOB_ID")) and os.geteuid() == 0


def _safe(text):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:64]


def key_of(st):
    return (f"{_safe(os.uname().nodename)}-{os.geteuid()}-{st.st_dev:x}-{st.st_ino:x}-"
            f"{st.st_size:x}-{st.st_mtime_ns:x}")


def _open_dir():
    """fd of DIR, the part "nodeimage" of root's base directory
    (gpusandbox/rundir.py: made if missing, root's, 0700)."""
    from .. import rundir
    try:
        return rundir.open_part("nodeimage")[0]
    except UsageError as e:
        raise UsageError(f"cannot share squashfs mounts in {DIR}", e.line(),
                         f"{e.hint}, or set GPUSANDBOX_NODE_IMAGE=0") from None


def _open_current(dfd, name):
    """fd of dfd/name, made if missing.  A retiring keeper may remove the file
    between this open and the flock: _still_named says whether it is still the one."""
    return os.open(name, _FILE, 0o600, dir_fd=dfd)


def _still_named(dfd, name, fd):
    try:
        a, b = os.stat(name, dir_fd=dfd, follow_symlinks=False), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _starttime(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _keeper(dfd, key):
    """(pid, fd number, start time) of the live keeper for key, else None."""
    try:
        fd = os.open(f"{key}.keeper", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        return None
    try:
        fields = os.read(fd, 128).split()
    finally:
        os.close(fd)
    if len(fields) != 3 or not all(x.isdigit() for x in fields):
        return None
    pid, start, num = int(fields[0]), fields[1].decode(), int(fields[2])
    return (pid, num, start) if _starttime(pid) == start else None


def _clone(fd):
    return k.open_tree(fd, "", k.OPEN_TREE_CLONE | k.OPEN_TREE_CLOEXEC | k.AT_EMPTY_PATH)


def _clone_from(keeper):
    pid, num, start = keeper
    src = os.open(f"/proc/{pid}/fd/{num}", k.O_PATH | os.O_CLOEXEC)
    try:
        # Still the keeper after the open: the fd is its mount, not a descriptor
        # of a process that got the pid since.
        if _starttime(pid) != start:
            raise OSError(errno.ESRCH, "the keeper ended")
        return _clone(src)
    finally:
        os.close(src)


def acquire(filefd, mount):
    """fd of a detached clone of this node's shared mount of filefd's file,
    `mount()` making that mount when no keeper holds one.  The launcher keeps a
    reference (an flock) until it exits."""
    key = key_of(os.fstat(filefd))
    dfd = _open_dir()
    try:
        for attempt in range(1000):
            if attempt:
                # Outside the mutex: a retiring keeper needs it to finish.
                time.sleep(0.005)
            mutex = _open_current(dfd, f"{key}.lock")
            ref = None
            try:
                fcntl.flock(mutex, fcntl.LOCK_EX)
                if not _still_named(dfd, f"{key}.lock", mutex):
                    continue
                ref = _open_current(dfd, f"{key}.ref")
                try:
                    fcntl.flock(ref, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    # Only a keeper retiring under the mutex takes LOCK_EX; be safe anyway.
                    os.close(ref)
                    ref = None
                    continue
                keeper = _keeper(dfd, key)
                clone = None
                if keeper is not None:
                    try:
                        clone = _clone_from(keeper)
                    except OSError:
                        clone = None   # it died since: start another
                if clone is None:
                    mnt = mount()
                    try:
                        clone = _clone(mnt)
                    except OSError as e:
                        if e.errno != errno.EINVAL:
                            os.close(mnt)
                            raise
                        # A kernel before 6.15 cannot clone a detached mount:
                        # this rank runs on a mount of its own, as without sharing.
                        return mnt
                    try:
                        _start_keeper(dfd, key, mnt)
                    except BaseException:
                        os.close(clone)
                        raise
                    finally:
                        os.close(mnt)
                _HELD.append((ref, key))
                ref = None
                return clone
            finally:
                if ref is not None:
                    os.close(ref)
                os.close(mutex)   # drops the mutex
        raise UsageError("cannot share the squashfs mount", "its keeper kept retiring",
                         "set GPUSANDBOX_NODE_IMAGE=0")
    except OSError as e:
        raise UsageError(f"cannot share the squashfs mount through {DIR}",
                         e.strerror or str(e), "set GPUSANDBOX_NODE_IMAGE=0") from None
    finally:
        os.close(dfd)


# Reference locks this launcher holds until it exits.
_HELD = []


def _start_keeper(dfd, key, mnt):
    """Fork the keeper (double fork, its own session) holding mnt; return once it
    has written KEY.keeper."""
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.setsid()
            if os.fork():
                os._exit(0)
            _keep(dfd, key, mnt, w)
        finally:
            os._exit(1)
    os.close(w)
    try:
        os.waitpid(pid, 0)
        if os.read(r, 1) != b"k":
            raise OSError(errno.ECHILD, "the keeper did not start")
    finally:
        os.close(r)


def _keep(dfd, key, mnt, w):
    """The keeper's life; never returns."""
    null = os.open("/dev/null", os.O_RDWR)
    for std in (0, 1, 2):
        os.dup2(null, std)
    keep = {0, 1, 2, dfd, mnt, w}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    k.set_comm(KEEPER_NAME)
    ref = os.open(f"{key}.ref", _FILE, 0o600, dir_fd=dfd)
    tmp = f"{key}.keeper.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dfd)
    os.write(fd, f"{os.getpid()} {_starttime(os.getpid())} {mnt}\n".encode())
    os.close(fd)
    os.rename(tmp, f"{key}.keeper", src_dir_fd=dfd, dst_dir_fd=dfd)
    os.write(w, b"k")
    os.close(w)
    while True:
        time.sleep(0.5)
        mutex = os.open(f"{key}.lock", _FILE, 0o600, dir_fd=dfd)
        fcntl.flock(mutex, fcntl.LOCK_EX)        # no rank is about to take a reference
        try:
            fcntl.flock(ref, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(mutex)
            continue
        _remove(dfd, key)                        # and none holds one
        os._exit(0)


def _remove(dfd, key):
    for name in (f"{key}.keeper", f"{key}.ref", f"{key}.lock"):
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass


def release():
    """Drop this launcher's references (its sandbox has ended); the last one of
    a node ends the keeper and removes its files."""
    import signal
    while _HELD:
        ref, key = _HELD.pop()
        try:
            dfd = _open_dir()
        except (OSError, UsageError):
            os.close(ref)
            continue
        try:
            while True:
                mutex = os.open(f"{key}.lock", _FILE, 0o600, dir_fd=dfd)
                fcntl.flock(mutex, fcntl.LOCK_EX)
                if _still_named(dfd, f"{key}.lock", mutex):
                    break
                os.close(mutex)
            try:
                os.close(ref)
                ref = None
                probe = os.open(f"{key}.ref", _FILE, 0o600, dir_fd=dfd)
                try:
                    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue             # other ranks still run on the mount
                finally:
                    os.close(probe)
                keeper = _keeper(dfd, key)
                if keeper is not None:
                    # Verified by start time, then signalled through a pidfd: never
                    # another process that got the number since.
                    pidfd = os.pidfd_open(keeper[0])
                    try:
                        if _keeper(dfd, key) == keeper:
                            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    finally:
                        os.close(pidfd)
                _remove(dfd, key)
            finally:
                os.close(mutex)
        except OSError:
            pass
        finally:
            if ref is not None:
                os.close(ref)
            os.close(dfd)
