"""The pod's keeper (see pod.py): pid 1 of the pod's pid namespace.

Forked by the first rank's launcher, it outlives that launcher and ends with
the last rank: it holds the namespaces the ranks join, the /dev/shm tmpfs (in
a mount namespace of its own, attached over the pod directory's shm/, where
each rank's mount namespace, a copy of the keeper's, finds it), and kills what
a rank leaves behind.  It runs nothing but a poll loop; everything it reads
comes from its own ranks (same user, a 0700 directory).
"""
import os

from ..linux import host
from ..linux import mounts as m
from ..linux import sys as k
from .podwire import ns_types, recv_fds

_BO = __import__("sys").byteorder
PROBE_TIMEOUT_MS = 30000     # no rank ever connected (its launcher died first)
# What a rank (`kill -INT 1`), a terminal's Ctrl-C or `scancel -s SIG` may
# send the keeper: the set launchers forward.  Ignored outright: the kernel
# drops such a signal to a pid namespace's init only while its disposition is
# SIG_DFL, and the interpreter installs a SIGINT handler (KeyboardInterrupt)
# that would end the keeper, and with its pid namespace every rank (SIGKILL).
# The keeper ends when its last rank's connection closes, or by SIGKILL.
_IGNORED = (1, 2, 3, 10, 12, 15)    # HUP INT QUIT USR1 USR2 TERM


def start(plan, path, dirfd):
    """Bind the pod's socket at `path` and fork the keeper onto it."""
    # _socket, not socket.py: its import (enum and more) would cost the first
    # rank, and the keeper, whom every other rank of the burst waits for.
    import _socket
    pod = plan.pod
    try:
        os.unlink(path)            # a dead keeper's socket
    except FileNotFoundError:
        pass
    lsock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        lsock.bind(path)
        lsock.listen(128)
        flags = k.CLONE_NEWPID | k.CLONE_NEWIPC | k.CLONE_NEWNS
        if pod.idmap:
            flags |= k.CLONE_NEWUSER
        # Through a short-lived middle process: the keeper outlives this
        # launcher and must not stay its child.
        mid = os.fork()
        if mid == 0:
            try:
                # Before the clone, so the keeper is born ignoring them: it is
                # still in the launcher's process group until its setsid().
                import _signal
                for sig in _IGNORED:
                    _signal.signal(sig, _signal.SIG_IGN)
                if k.clone_fork(flags) == 0:
                    _main(pod, lsock.fileno(), dirfd, plan.real_root)
            finally:
                os._exit(0)
        os.waitpid(mid, 0)
    finally:
        lsock.close()


def _main(pod, lfd, dirfd, real_root):
    import _socket
    k.set_comm("gpusandbox-pod")
    os.setsid()
    os.chdir("/")          # never pin the first rank's working directory
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = sorted({0, 1, 2, lfd, dirfd})
    low = 3
    for fd in keep + [0x7FFFFFFF]:
        if fd >= low:
            if fd > low:
                k.syscall("close_range", low, fd - 1, 0)
            low = fd + 1
    lsock = _socket.socket(fileno=lfd)
    error = None
    ns = []
    procfd = -1
    try:
        if pod.idmap:
            from ..linux import idmap
            _, uin, uout, gin, gout = pod.idmap
            idmap.write_single("self", uin, uout, gin, gout, real_root)
        # Pid 1 of every rank's /proc: its root and fds are the host's (the
        # pod directory), so no rank may open /proc/1/root or /proc/1/fd/*.
        # Its full capability set already fails the ptrace check of a rank's
        # command; not being dumpable makes that hold whatever caps a rank has.
        k.prctl(4, 0)  # PR_SET_DUMPABLE
        want = ns_types(pod.idmap)
        ns = [fd for _, fd in host.open_ns("self", want, skip_own=False)]
        k.mount(None, "/", None, k.MS_REC | k.MS_SLAVE)
        shm = m.new_fs("tmpfs", (f"size={pod.shm_size}", "mode=1777"),
                       k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV)
        # By path: the launcher's descriptors name the host's mounts, and
        # move_mount wants a mount of this namespace (the directory is the
        # caller's own, mode 0700, so the path cannot be swapped).
        target = os.open(pod.shm_path, k.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                         | os.O_CLOEXEC)
        m.attach(shm, target, "mounting the pod's /dev/shm")
        # A procfs of the pod's pid namespace, never attached: the sweep
        # reads it through this descriptor.
        procfd = m.new_fs("proc", (), k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV
                          | k.MOUNT_ATTR_NOEXEC)
    except OSError as e:
        error = f"{e.strerror or e}"
    _loop(lsock, ns, pod, dirfd, procfd, error)


def _loop(lsock, ns, pod, dirfd, procfd, error):
    import _signal
    import _socket
    import select
    hello = b"P" + repr(pod.idmap).encode()
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    _signal.set_wakeup_fd(wake_w)
    _signal.signal(17, lambda *a: None)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {17})
    poll = select.poll()
    poll.register(lsock.fileno(), select.POLLIN)
    poll.register(wake_r, select.POLLIN)
    conns = {}
    pidfds = set()
    seen = False
    while True:
        if seen and not conns and _may_end(dirfd, pod):
            return
        timeout = None if seen else PROBE_TIMEOUT_MS
        if seen and not conns:
            timeout = 20          # the lock was busy: a rank is joining
        try:
            events = poll.poll(timeout)
        except InterruptedError:
            continue
        if not events and not seen:
            return
        sweep = False
        for fd, ev in events:
            if fd == lsock.fileno():
                conn = _socket.socket(fileno=lsock._accept()[0])
                if error is not None:
                    conn.sendall(b"E" + error.encode())
                    conn.close()
                    return
                try:
                    conn.sendmsg([hello], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                                            b"".join(fd.to_bytes(4, _BO) for fd in ns))])
                except OSError:
                    conn.close()
                    continue
                seen = True
                conns[conn.fileno()] = conn
                poll.register(conn.fileno(), select.POLLIN)
            elif fd == wake_r:
                try:
                    os.read(wake_r, 256)
                except BlockingIOError:
                    pass
                _reap()
                sweep = True
            elif fd in pidfds:
                poll.unregister(fd)
                pidfds.discard(fd)
                os.close(fd)
                sweep = True
            elif fd in conns:
                try:
                    msg, fds = recv_fds(conns[fd], 16, 4)
                except OSError:
                    msg, fds = b"", []
                for pfd in fds:
                    if msg == b"R" and pfd not in pidfds:
                        pidfds.add(pfd)
                        poll.register(pfd, select.POLLIN)
                    else:
                        os.close(pfd)
                if not msg:
                    poll.unregister(fd)
                    conns.pop(fd).close()
                    sweep = True
        if sweep and procfd >= 0:
            _sweep(procfd)


def _may_end(dirfd, pod=None):
    """With no rank left: end, unless a rank holds the pod's lock (it is
    joining this keeper).  The socket goes first, under the lock, so the next
    rank starts a new pod instead of reaching one that is ending."""
    import fcntl
    try:
        lock = os.open("lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError:
        return True
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        return False
    # Everything of the pod goes, the lock file last (a rank waiting on it
    # sees it unlinked and starts over); exiting releases the lock.
    try:
        os.unlink("sock", dir_fd=dirfd)
    except OSError:
        pass
    if pod is not None:
        try:
            k.umount2(pod.shm_path, k.MNT_DETACH)
        except OSError:
            pass
    for name, rm in (("shm", os.rmdir), ("lock", os.unlink)):
        try:
            rm(name, dir_fd=dirfd)
        except OSError:
            pass
    if pod is not None:
        try:
            os.rmdir(pod.dir)
        except OSError:
            pass
    return True


def _reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _sweep(procfd):
    """Kill every child of the keeper.  Each rank's init is the child of its
    launcher (outside the pod) and a child subreaper, so a process here is a
    child of the keeper only when the rank it belonged to has ended."""
    try:
        # The mount's fd is O_PATH: a readable directory fd of its root lists it.
        dfd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=procfd)
        try:
            names = os.listdir(dfd)
        finally:
            os.close(dfd)
    except OSError:
        return
    for name in names:
        if not name.isdigit() or name == "1":
            continue
        try:
            fd = os.open(f"{name}/stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=procfd)
            try:
                data = os.read(fd, 1024)
            finally:
                os.close(fd)
            ppid = data.rpartition(b")")[2].split()[1]
        except (OSError, IndexError):
            continue
        if ppid == b"1":
            try:
                os.kill(int(name), 9)
            except OSError:
                pass
