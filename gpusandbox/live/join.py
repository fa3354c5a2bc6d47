"""`gpusandbox exec NAME CMD`: one more process in a live sandbox.

The process is the twin of the sandbox's command: the command stage
(stages/command.py) runs it from the process settings the planner made for
that command (uid, gid, groups, capability sets, no_new_privs, seccomp
program, environment, working directory), which the launcher recorded
(launch.process_settings); nothing is read from the sandbox itself
(/proc/PID/environ, its cwd, its files), which its processes could rewrite.

    exec (subreaper) ── fork ──> joiner (stages/enter.py, the OCI runtime's
                                 exec's too): born in the cgroup leaf, not
                                 dumpable, joins init's namespaces ── fork ──>
                                 the command stage (in the pid namespace)
The joiner exits at once and the process is this one's child (subreaper):
its status is returned, signals are forwarded (stages/parent.py's
supervisor), -t relays a pty made in the sandbox's own devpts.

Whose namespaces: real root opens init's (/proc/PID/ns).  An unprivileged
caller cannot open those of the sandbox's init, which stays undumpable for
its life (it never execs); it joins the namespaces of one of init's
children instead (dumpable: it has exec'd), checked to be init's child while
the descriptors are opened.  Such a process can have made namespaces of its
own below the sandbox's (with the capabilities it has there): the process
then starts in those, with the same settings, which it could have given a
process itself.
"""
import os

from ..errors import SandboxError
from ..linux import host, procstat
# Imported before setns(2): the command stage installs the filter inside,
# where the host's files are out of reach.
from ..linux import seccomp  # noqa: F401
from ..linux import sys as k
from ..plan import LaunchPlan, set_caps
from ..spec import RunSpec
from ..stages import channel, enter, parent

# Where the host mounts each kind of hierarchy a leaf can be in.
_CGROUP_MOUNTS = {2: ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"),
                  1: ("/sys/fs/cgroup/devices",)}


def make_plan(rec, argv, env=(), workdir=None, tty=False, host_env=None, user=None):
    """The command stage's plan: the recorded settings, with exec's own
    argv, -e variables, -w directory and --user (uid, gid): another user
    only where the command is uid 0 inside, and then with no capability
    (docker's rule for a non-root process), so never more than the command
    has."""
    from ..imageroot import container_path
    p = rec.get("process")
    if not isinstance(p, dict):
        raise SandboxError(f"sandbox {rec.get('name')!r}: its record has no process settings",
                           None, "start it again with this version of gpusandbox")
    plan = LaunchPlan(RunSpec())
    plan.argv = list(argv)
    plan.env = {str(a): str(b) for a, b in (p.get("env") or {}).items()}
    for item in env:
        key, eq, val = item.partition("=")
        if eq:
            plan.env[key] = val
        elif host_env is not None and key in host_env:
            plan.env[key] = host_env[key]
    if tty and "TERM" not in plan.env:
        plan.env["TERM"] = (host_env or {}).get("TERM") or "xterm"
    plan.workdir = container_path(workdir) if workdir else p.get("workdir") or "/"
    plan.cmd_uid, plan.cmd_gid = int(p["uid"]), int(p["gid"])
    plan.groups = [int(g) for g in p["groups"]] if p.get("groups") is not None else None
    plan.clear_groups = bool(p.get("clear_groups"))
    caps = p.get("caps") or [[]] * 5
    set_caps(plan, None, tuple(tuple(int(c) for c in s) for s in caps))
    plan.no_new_privs = bool(p.get("no_new_privs", True))
    plan.umask = p.get("umask") if isinstance(p.get("umask"), int) else None
    plan.seccomp = bytes.fromhex(p["seccomp"]) if p.get("seccomp") else None
    plan.keep_fds = ()
    if user is not None and tuple(user) != (plan.cmd_uid, plan.cmd_gid):
        if plan.cmd_uid != 0:
            raise SandboxError(f"exec --user {user[0]}:{user[1]}: the sandbox's command runs as "
                               f"uid {plan.cmd_uid}", "exec never runs with another identity "
                               "than a non-root command's",
                               f"drop --user, or give --user {plan.cmd_uid}:{plan.cmd_gid}")
        plan.cmd_uid, plan.cmd_gid = user
        plan.groups, plan.clear_groups = None, True
        if plan.cmd_uid != 0:
            set_caps(plan, None, (plan.cap_bounding, (), (), (), ()))
    return plan


def _not_running(name):
    return SandboxError(f"sandbox {name!r} is not running", None,
                        f"'gpusandbox ps -a' shows its state; 'gpusandbox logs {name}' "
                        "what it wrote")


def _leaf(rec, init_pid):
    """The recorded cgroup leaf, once init is seen in it (or below it):
    a record is never taken at its word for a host path."""
    leaf = rec.get("cgroup") or ""
    if not leaf:
        return None
    version = 1 if rec.get("cgroup_version") == 1 else 2
    rel = None
    try:
        with open(f"/proc/{init_pid}/cgroup") as f:
            for ln in f:
                num, _, rest = ln.rstrip("\n").partition(":")
                ctrls, _, path = rest.partition(":")
                if (version == 2 and num == "0" and not ctrls) or \
                        (version == 1 and "devices" in ctrls.split(",")):
                    rel = path
    except OSError:
        pass
    if rel and any(m + rel.rstrip("/") == leaf or (m + rel).startswith(leaf + "/")
                   for m in _CGROUP_MOUNTS[version]):
        return leaf
    raise SandboxError(f"sandbox {rec.get('name')!r}: its init is not in the recorded "
                       f"cgroup {leaf}", None, "stop it and start it again")


def _open_target(rec):
    """(init's pidfd, [(type, fd)] of the namespaces to join, target pid)."""
    name = rec.get("name")
    init_pid, init_start = (rec.get("init") or (0, None))[:2]
    if not procstat.alive(init_pid, init_start):
        raise _not_running(name)
    try:
        pidfd = k.syscall("pidfd_open", init_pid, 0)
    except OSError:
        raise _not_running(name) from None
    try:
        # The pidfd names init for good from here: checked once more that
        # it was opened on the recorded process, not a recycled number.
        if not procstat.alive(init_pid, init_start):
            raise _not_running(name)
        try:
            return pidfd, host.open_ns(init_pid), init_pid
        except host.NamespaceError as e:
            if e.errno != 13 or os.geteuid() == 0:
                raise SandboxError(f"exec: opening the sandbox's {host.NS_PROC[e.ns]} "
                                   "namespace", e.strerror) from None
        for child in procstat.children(init_pid):
            try:
                fds = host.open_ns(child)
            except host.NamespaceError:
                continue
            # Still init's child once its namespaces are open: the
            # descriptors are of a process of this sandbox.
            if procstat.parent(child) == init_pid and procstat.alive(init_pid, init_start):
                return pidfd, fds, child
            host.close_ns(fds)
        raise SandboxError(f"exec: sandbox {name!r} has no process whose namespaces can be "
                           "joined", "its command has exited or is exiting", None)
    except BaseException:
        os.close(pidfd)
        raise


def run(rec, plan, tty=False):
    """Start `plan`'s process in the sandbox of record `rec` and return its
    status (128+N for signal N)."""
    pidfd, nsfds, target = _open_target(rec)
    init_pid = rec["init"][0]
    try:
        leaf = _leaf(rec, init_pid)
        if host.setgroups_denied(target):
            # The sandbox's user namespace denies setgroups(2): the process
            # keeps the groups it has, as the command did.
            plan.clear_groups = False
            plan.groups = None
        k.prctl(36, 1)     # PR_SET_CHILD_SUBREAPER: the grandchild is ours to wait for
        parent.hold_signals()
        sock = None
        if tty:
            import socket
            sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            sock[0].sendall(parent.winsize())
        pid_r, pid_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        joiner, born = enter.fork(leaf if rec.get("cgroup_version") != 1 else None)
        if joiner == 0:
            os.close(pid_r)
            os.close(err_r)
            os.close(pidfd)
            if sock:
                sock[0].close()
            enter.joiner(plan, [leaf] if leaf and not born else [], nsfds, pid_w, err_w,
                         sock[1] if sock else None)
    finally:
        host.close_ns(nsfds)
    os.close(pid_w)
    os.close(err_w)
    if sock:
        sock[1].close()
    data = os.read(pid_r, 32)
    os.close(pid_r)
    os.waitpid(joiner, 0)
    if not data:
        os.set_blocking(err_r, False)
        try:
            buf = os.read(err_r, 4096)
        except OSError:
            buf = b""
        rec_err = channel.parse(buf)
        if rec_err:
            raise SandboxError(rec_err[1], rec_err[2], rec_err[3], rec_err[0])
        raise SandboxError("exec: the process could not be started")
    child = parent._Child(int(data))
    master = None
    if sock:
        _, fds, _, _ = __import__("socket").recv_fds(sock[0], 1, 1)
        sock[0].close()
        master = fds[0] if fds else None
    try:
        return parent._supervise(child, err_r, master)
    finally:
        if child.status is None:
            child.kill_and_reap()
        os.close(pidfd)


