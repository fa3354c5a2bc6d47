"""One more process in a running sandbox: the joiner that `gpusandbox exec`
(live/join.py) and the OCI runtime's `exec` (oci/runtime/execute.py) both
fork, from a plan each builds its own way.

    caller ── fork() ──> joiner: not dumpable; joins the cgroup leaves and
                         the namespaces (runc's two passes) ── fork ──> the
                         process (in the joined pid namespace): working
                         directory, terminal, the command stage (command.run)

The joiner writes its child's pid on pid_w and ends; a failure anywhere is
one channel record on err_w (channel.fail) and exit 125."""
import os

from ..linux import host
from ..linux import sys as k
from . import channel, command
from .init import _open_pty


def fork(leaf):
    """Fork the joiner: born in the cgroup2 directory `leaf` with clone3's
    CLONE_INTO_CGROUP, as the sandbox's init was (a migration by a write to
    cgroup.procs waits for an RCU grace period: about 10 ms of every exec).
    (pid, born_in_leaf): pid 0 in the child.  Without a v2 leaf, or where
    the kernel or the leaf refuses, a plain fork (born_in_leaf False), and
    the joiner then joins by that write."""
    if leaf:
        try:
            fd = os.open(leaf, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                pid = k.clone_fork(0, fd)
            except OSError:
                pid = None
            finally:
                if pid != 0:
                    os.close(fd)
            if pid == 0:
                os.close(fd)
                return 0, True
            if pid is not None:
                return pid, True
    return os.fork(), False


def joiner(plan, leaves, nsfds, pid_w, err_w, sock=None, what="sandbox", sized=True):
    """The joiner's work (never returns).  Not dumpable before anything of
    the sandbox is joined: none of its processes may ptrace this one or open
    its descriptors (runc's CVE-2016-9962); the process inherits it until its
    execve.  leaves: the cgroup directories to join by a write (none when
    fork() placed it); sock: the terminal's socket (stages/init._open_pty;
    sized: the launcher wrote the window size on it first)."""
    step = f"joining the {what}"
    try:
        k.prctl(4, 0)      # PR_SET_DUMPABLE 0
        for leaf in leaves:
            step = f"joining the {what}'s cgroup {leaf}"
            fd = os.open(os.path.join(leaf, "cgroup.procs"),
                         os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        step = f"joining the {what}'s namespaces"
        try:
            # runc's two passes: a namespace the sandbox's user namespace
            # does not own (a network namespace joined by path, the host's)
            # is joined before it, with this process's own capabilities.
            host.join_ns_owned(nsfds)
        except host.NamespaceError as e:
            step = f"joining the {what}'s {host.NS_PROC[e.ns]} namespace"
            raise
        host.close_ns(nsfds)
        step = "starting the process"
        pid = os.fork()
        if pid:
            os.write(pid_w, str(pid).encode())
            os._exit(0)
        os.close(pid_w)
        step = f"entering the working directory {plan.workdir}"
        wdfd = os.open(plan.workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        slave = None
        if sock is not None:
            step = "allocating the terminal"
            slave = _open_pty(sock, sized)
        command.run(plan, err_w, wdfd, slave)
    except OSError as e:
        channel.fail(err_w, 125, step, e.strerror or str(e))
    except Exception as e:  # noqa: BLE001 - one line for any failure
        channel.fail(err_w, 125, step, f"{type(e).__name__}: {e}")
    os._exit(125)
