"""Stage 3: the command.  After the pivot it drops everything and execs, in
one of two ways:
  - spawn(): init itself takes the command's credentials, capabilities and
    seccomp filter, then starts the command with posix_spawn(3) (a vfork:
    nothing of init's memory is copied) and only reaps from then on.  The
    way of a plain launch (spawnable()).  docker --init and podman --init
    run their init under the container's profile the same way.
  - run(): init forks and the child drops and execs; for what posix_spawn
    cannot give the command (a controlling terminal, an OCI process's
    settings, seccomp before the capabilities go) and for an OCI init that
    becomes its workload.
Order matters and each step says why it sits where it does; every kernel
call goes through stages/mountexec.Kernel (`kern`), so that
tests/unit/test_init_order.py states the order."""
import errno
import os
import stat

from ..environ import DEFAULT_PATH, passwd_home
from ..linux import sys as k
from .channel import fail, pause_point
from .mountexec import KERNEL

_TIOCSCTTY = 0x540E
_CLOSE_RANGE_CLOEXEC = 4


def _lookup(argv0, path_var):
    """The command on the image's PATH (execvp(3) rules)."""
    if "/" in argv0:
        return argv0
    for d in (path_var or "").split(":"):
        cand = os.path.join(d or ".", argv0)
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    for d in (path_var or "").split(":"):
        cand = os.path.join(d or ".", argv0)
        if os.path.exists(cand):
            return cand  # exists but not executable: execve reports EACCES -> 126
    return None


def _passwd_home(uid):
    """The home of `uid` in the container's /etc/passwd (the command stage
    runs in its root, after every mount), else "/"."""
    try:
        fd = os.open("/etc/passwd", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return "/"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "/"
        data = os.read(fd, 1 << 20)
    finally:
        os.close(fd)
    return passwd_home(data.decode("utf-8", "replace"), uid)


def run(plan, err_w, wdfd, tty_slave, kern=KERNEL):
    step = "starting the command"
    try:
        # init blocks the forwarded signals for sigwaitinfo(); the mask is
        # inherited across execve, so clear it or the command never sees them.
        # Ignored signals stay ignored across execve, and CPython ignores
        # SIGPIPE and SIGXFSZ: without this, `yes | head` inside would end in
        # "Broken pipe" errors instead of a quiet SIGPIPE.
        kern.reset_signals()
        # Own session: the command cannot reach the caller's terminal with
        # TIOCSTI (it is no longer its controlling terminal).
        try:
            kern.setsid()
        except PermissionError:
            pass    # an OCI init that becomes its workload leads its session already
        if tty_slave is not None:
            k.libc.ioctl(tty_slave, _TIOCSCTTY, 0)
            for fd in (0, 1, 2):
                os.dup2(tty_slave, fd)
            if tty_slave > 2:
                os.close(tty_slave)
        step = f"entering the working directory {plan.workdir}"
        kern.fchdir(wdfd)
        kern.close(wdfd)
        # Every fd but stdio (and the error pipe, already CLOEXEC) is closed by
        # the execve: no host directory fd survives into the image (CVE-2024-21626).
        # Before any seccomp filter, which may not know close_range.
        step = "closing inherited descriptors"
        kern.close_range(3, 0xFFFFFFFF, _CLOSE_RANGE_CLOEXEC)
        for fd in plan.keep_fds:  # srun's PMI_FD: the job's own channel to slurmstepd
            os.set_inheritable(fd, True)
        if "HOME" not in plan.env:
            # An environment without HOME (runc's rule for an OCI process):
            # the process's passwd entry, read while still root.
            step = "reading /etc/passwd"
            plan.env["HOME"] = _passwd_home(plan.cmd_uid)
        step = "applying the process settings"
        before_privileges(plan)
        early = seccomp_early(plan, kern)
        step = "dropping privileges"
        _drop_privileges(plan, kern)
        pause_point(plan, "before-exec")
        step = "applying the process settings"
        before_exec(plan, kern)
        path = _path(plan, err_w)
        # Last: after seccomp only the syscalls the profile allows remain.
        if plan.seccomp is not None and not early:
            step = "installing the seccomp filter"
            kern.install_seccomp(plan.seccomp)
        step = f"executing {plan.argv[0]}"
        kern.execve(path, plan.argv, plan.env)
    except OSError as e:
        _failed(plan, err_w, step, e)
    except Exception as e:  # noqa: BLE001
        fail(err_w, 125, step, f"{type(e).__name__}: {e}")


def spawnable(plan, tty_slave):
    """Whether init may start the command itself (spawn): a plain launch
    with one of the shipped seccomp profiles or none, whose every rule
    leaves init what it does after the spawn (and the spawn's own clone).
    Not with a terminal (the command must make it its controlling one), an
    OCI process's settings (scheduling, stdio handed over, HOME from the
    image's passwd), a filter that must go in before the capabilities
    (noNewPrivileges false) or a profile of the caller's (which may deny
    init's calls): those take run() in a forked child."""
    if plan.seccomp is not None:
        from ..linux.seccomp import SHIPPED     # loaded: the plan compiled its filter
        if plan.spec.seccomp not in SHIPPED or not plan.no_new_privs:
            return False
    return (tty_slave is None and plan.oci is None and plan.proc_settings is None
            and not plan.stdio_owner and "HOME" in plan.env)


def spawn(plan, err_w, wdfd, go_r, kern=KERNEL):
    """init (pid 1) becomes what the command must be, in run()'s order, and
    starts it with posix_spawn: the working directory, the descriptors
    marked close-on-exec (init never execs, so its own stay usable), the
    privileges dropped, seccomp last; the spawned child gets no signal
    blocked or ignored and its own session.  Returns the command's pid;
    a failure is reported and ends init.  After the spawn init only reaps
    and forwards signals (stages/init._reap): what the profile allows any
    command.  A credential change clears the parent-death signal and the
    dumpable flag (prctl(2)): both are set again, and the launcher's end
    of the go pipe (go_r, closed here) tells whether it died meanwhile."""
    step = "entering the working directory"
    try:
        kern.fchdir(wdfd)
        kern.close(wdfd)
        step = "closing inherited descriptors"
        kern.close_range(3, 0xFFFFFFFF, _CLOSE_RANGE_CLOEXEC)
        for fd in plan.keep_fds:
            os.set_inheritable(fd, True)
        step = "dropping privileges"
        _drop_privileges(plan, kern)
        kern.prctl(k.PR_SET_PDEATHSIG, 9)
        kern.prctl(4, 0)    # PR_SET_DUMPABLE
        if kern.peer_gone(go_r):
            os._exit(125)
        kern.close(go_r)
        pause_point(plan, "before-exec")
        step = "applying the process settings"
        before_exec(plan, kern)
        path = _path(plan, err_w)
        if plan.seccomp is not None:
            step = "installing the seccomp filter"
            kern.install_seccomp(plan.seccomp)
        step = f"executing {plan.argv[0]}"
        return kern.spawn(path, plan.argv, plan.env)
    except OSError as e:
        _failed(plan, err_w, step, e)
    except Exception as e:  # noqa: BLE001
        fail(err_w, 125, step, f"{type(e).__name__}: {e}")


def _drop_privileges(plan, kern):
    # The bounding set needs CAP_SETPCAP, which the uid change may take away.
    kern.drop_bounding(plan.cap_bounding)
    kern.prctl(8, 1)   # PR_SET_KEEPCAPS: a non-root user may be given capabilities
    if plan.groups is not None:
        kern.setgroups(plan.groups)
    elif plan.clear_groups:
        kern.setgroups([])
    kern.setresgid(plan.cmd_gid)
    kern.setresuid(plan.cmd_uid)
    # Every set written (the permitted set the uid change kept included).
    kern.set_cap_sets(plan.cap_effective, plan.cap_permitted, plan.cap_inheritable,
                      plan.cap_ambient)
    if plan.no_new_privs:
        kern.prctl(k.PR_SET_NO_NEW_PRIVS, 1)


def _path(plan, err_w):
    """The file to execute.  No PATH in the environment: execvp(3)'s search
    of a default one, which the environment does not get."""
    path = _lookup(plan.argv[0], plan.env.get("PATH", DEFAULT_PATH))
    if path is None:
        fail(err_w, 127, f"command not found in the image: {plan.argv[0]}", None,
             "check the image's PATH (-e PATH=...) or give the full path")
    return path


def _failed(plan, err_w, step, e):
    if e.errno in (errno.ENOENT, errno.ENOTDIR) and step.startswith("executing"):
        fail(err_w, 127, f"cannot execute {plan.argv[0]}", e.strerror,
             "the file or its interpreter (#! line) is missing in the image")
    if step.startswith("executing"):
        fail(err_w, 126, f"cannot execute {plan.argv[0]}", e.strerror,
             "make it executable, or check that it is a program for this architecture")
    fail(err_w, 125, step, e.strerror or str(e))


# --- an OCI process's settings (the plan's fields; no-ops for a plain run) ----
def process_settings(ps):
    """The config's scheduling settings (oci/configproc.py), while the command
    stage still holds its capabilities (a real-time policy or I/O class
    needs CAP_SYS_NICE / CAP_SYS_ADMIN); all survive the execve.  The
    memory policy first: it applies to what the process allocates next."""
    from ..linux import procsched
    if ps.cpus_initial is not None:
        procsched.set_affinity(ps.cpus_initial)
    if ps.mempolicy is not None:
        procsched.set_mempolicy(*ps.mempolicy)
    if ps.ioprio is not None:
        procsched.set_ioprio(ps.ioprio)
    if ps.sched is not None:
        procsched.set_scheduler(*ps.sched)
    if ps.personality is not None:
        procsched.set_personality(ps.personality)


def before_privileges(plan):
    """What the command stage does while it is still root: the process's
    kernel settings (plan.proc_settings) and, for the OCI doors, its stdio
    handed to its user (plan.stdio_owner: runc's and crun's rules)."""
    if plan.proc_settings is not None:
        process_settings(plan.proc_settings)
    if plan.stdio_owner:
        _chown_stdio(plan.cmd_uid, plan.cmd_gid)


def _chown_stdio(uid, gid):
    """The process's stdio (a pipe, a file, the pty) owned by its user, so
    that it can reopen them through /proc/self/fd; /dev/null stays as it is.
    Ids the user namespace does not map, or an owner it cannot change, leave
    a descriptor as it was."""
    for fd in (0, 1, 2):
        try:
            st = os.fstat(fd)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3):
                continue
            if (st.st_uid, st.st_gid) != (uid, gid):
                os.fchown(fd, uid, gid)
        except OSError:
            continue


def before_exec(plan, kern=KERNEL):
    """Process settings that apply to the command only."""
    if plan.umask is not None:
        kern.umask(plan.umask)
    ps = plan.proc_settings
    if ps is not None and ps.cpus_final is not None:
        # execCPUAffinity.final: the workload's own CPUs, set last so that the
        # setup before it ran on the initial ones (runtime-spec config.md).
        from ..linux import procsched
        procsched.set_affinity(ps.cpus_final)


def seccomp_early(plan, kern=KERNEL):
    """An OCI config with noNewPrivileges false and a seccomp filter: the
    filter goes in before the capabilities are dropped, since without
    no_new_privs the kernel installs one only for CAP_SYS_ADMIN
    (seccomp(2)); the rest of the command stage then runs under it, as
    runc's does.  Returns whether it was installed here."""
    if plan.no_new_privs or plan.seccomp is None:
        return False
    kern.install_seccomp(plan.seccomp)
    return True
