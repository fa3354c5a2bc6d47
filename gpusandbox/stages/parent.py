"""Stage 1: the launcher.  Stays on the host, outside every namespace.

plan -> cgroup leaf -> clone3 -> id maps -> "go" -> supervise -> teardown.
"""
import os
import sys

from .. import plan as planmod
from ..errors import SandboxError
from ..linux import caps, cgplace
from ..linux import sys as k
from . import channel
# Imported here rather than in the clone child: the child then starts work at
# once instead of loading modules first.
from . import init

_SIGCHLD = 17
_SIGWINCH = 28
FORWARDED = (1, 2, 3, 10, 12, 15)


def _say(msg):
    sys.stderr.write(f"gpusandbox: {msg}\n")


def _cgroup(plan, spec):
    """The sandbox's cgroup handle: a leaf when this launch can have one
    (root, or a delegated subtree); without one, notes saying why.  A launch
    without limits that can have no leaf (rootless, the caller's cgroup not
    delegated) is decided by cgplace alone: cgroup.py is for making leaves."""
    limits = None
    if any((spec.memory, spec.memory_swap, spec.pids_limit, spec.cpus)):
        from ..linux import cgroupres
        limits = cgroupres.Limits(memory=spec.memory, memory_swap=spec.memory_swap,
                                  pids=spec.pids_limit, cpus=spec.cpus)
    else:
        h = cgplace.without_leaf(spec.cgroup_parent)
        if h is not None:
            return h
    from ..linux import cgroup
    return cgroup.prepare(parent=spec.cgroup_parent, limits=limits,
                          device_rules=plan.device_rules, best_effort=spec.best_effort)


def _clone_error(e, plan):
    hint = None
    if plan.clone_flags & k.CLONE_NEWUSER and e.errno in (1, 28, 22):
        hint = planmod.USERNS_HINT
    return SandboxError("creating the sandbox's namespaces (clone3)", e.strerror, hint)


def _write_maps(plan, pid):
    """Multi-range maps need the launcher (newuidmap/newgidmap, or root);
    init writes a one-id map for itself."""
    if plan.idmap and plan.idmap[0] == "full":
        from ..linux import idmap    # loaded by the plan already (LAUNCHER_IDS)
        idmap.write_full(pid, plan.idmap[1], plan.idmap[2], plan.real_root)


def launch(spec):
    plan = planmod.build(spec)
    # After the plan: a selection that fails says the same in its hint.
    for note in spec.notes:
        _say(f"note: {note}")
    for w in plan.warnings:
        _say(w)
    member = None
    if plan.pod:
        # Before the cgroup leaf: a keeper forked here must hold none of its fds.
        from ..hpc import pod
        member = pod.join(plan, os.environ)
    tty = None
    if spec.tty and os.isatty(0):
        # The pty is allocated inside the sandbox's own devpts (so tty(1) and
        # ttyname work there); init sends the master back over this pair.
        import socket
        tty = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        tty[0].sendall(winsize())
    # Block what we forward before anything exists to tear down: a signal that
    # arrives while the cgroup leaf is made or during the clone stays pending
    # instead of killing the launcher half-way.  init inherits the mask and
    # collects those signals with sigwaitinfo(); the launcher unblocks them
    # once its own handlers are in place, and forwards them.
    hold_signals()
    if plan.spec.net == "none":
        from ..linux import net  # noqa: F401 - init brings loopback up: loaded before the clone
    cg = _cgroup(plan, spec)
    plan.own_cgroup = cg.view()
    if not spec.verbose:
        for w in cg.warnings:
            _say(f"warning: {w}")
    if spec.verbose:
        for note in cg.notes:
            _say(note)
        for note in plan.notes:
            _say(note)
    status = 125
    child = None
    try:
        channel.pause_point(plan, "after-cgroup")
        v1_join = cg.needs_join
        wait = bool(plan.idmap and plan.idmap[0] == "full") or v1_join \
            or spec.pause_at == "after-clone"
        # `run` built its plan with the collector off (cli.run_and_exit): what
        # is loaded by now is frozen, so neither process walks it again, and
        # both collect what they allocate from here on.
        import gc
        gc.freeze()
        gc.enable()
        pid, child, go_w, err_r = spawn_init(plan, cg, tty, wait, member, hold=True)
        if spec.live is not None:
            spec.live.started(plan, pid, cg)     # run --name/--detach: its record
        _write_maps(plan, pid)
        if v1_join:
            # cgroup v1 fallback: clone3 cannot join a v1 cgroup, so join by pid
            # before init is allowed to go on.
            cg.join(pid)
        channel.pause_point(plan, "after-clone")
        if wait:
            os.write(go_w, b"G")
        master = None
        if tty:
            import socket
            _, fds, _, _ = socket.recv_fds(tty[0], 1, 1)
            tty[0].close()
            master = fds[0] if fds else None
        try:
            status = _supervise(child, err_r, master,
                                spec.live.command_started if spec.live is not None else None)
        except SandboxError as e:
            if e.code == 127:
                _no_gpu(plan, e)
            raise
        os.close(go_w)
    finally:
        if child is not None:
            child.kill_and_reap()
        if plan.squash_pid:
            from ..image import squashfuse
            squashfuse.stop(plan.squash_pid)
        if plan.squash == "kernel":
            from ..hpc import nodeimage
            nodeimage.release()
        seen = len(cg.notes)
        cg.teardown()
        if spec.verbose:
            for note in cg.notes[seen:]:
                _say(note)
    _exit_hooks(plan, status)
    return status


def hold_signals():
    """Block the signals the supervision takes (FORWARDED, SIGCHLD) before
    anything is cloned, and give SIGCHLD its default action: a caller that
    ignores SIGCHLD (SIG_IGN survives execve) would otherwise have init
    reaped by the kernel with no signal sent, and the launcher, or init
    waiting for its command, would wait for ever (wait(2), NOTES)."""
    import _signal
    _signal.signal(_SIGCHLD, _signal.SIG_DFL)
    _signal.pthread_sigmask(_signal.SIG_BLOCK, set(FORWARDED) | {_SIGCHLD})


def _exit_hooks(plan, status):
    """The site's exit hooks (sitehooks.py): a failure is a warning, the
    command's status stands.  None without a site directory
    (settingswhere.configured)."""
    from .. import settingswhere
    if not settingswhere.configured():
        return
    from .. import sitehooks
    if sitehooks.hooks() and not plan.host_root:
        sitehooks.exit_point(sitehooks.info(plan, "exit"), status,
                             lambda line: _say(f"warning: {line}"))


def _no_gpu(plan, err):
    """A driver binary (nvidia-smi...) not found in a launch that selected no
    GPU: the image's PATH is not the cause, the missing --gpus is."""
    if plan.oci is not None or plan.gpu is not None or plan.spec.cdi_devices \
            or not plan.argv:
        return
    from ..gpu.discover import CAP_BINS
    name = os.path.basename(plan.argv[0])
    if any(name in bins for bins in CAP_BINS.values()):
        err.what = f"command not found in the image: {plan.argv[0]}"
        err.why = f"no GPU was selected, so the driver's {name} was not injected"
        err.hint = ("select GPUs with --gpus (--gpus all, --gpus 0, --gpus count=1) "
                    "or NVIDIA_VISIBLE_DEVICES")


def spawn_init(plan, cg, tty, wait, member=None, hold=False):
    """Clone init into the cgroup leaf and start it on the plan; the launcher
    keeps the write end of the "go" pipe and the read end of the error
    channel, and gives up the image root and init's side of the terminal pair.
    Returns (pid, child, go_w, err_r): child is a _Child holding init's pidfd
    when hold, else None (a detached launcher leaves init to its caller)."""
    # What the command stage passes to the kernel is made here once, not in
    # each fork (whose every allocation is a copy-on-write fault): the
    # capability count and the seccomp program's struct.
    caps.last_cap()
    if plan.seccomp is not None:
        from ..linux import seccomp
        seccomp.ready(plan.seccomp)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    # init's ends, closed here once init holds them; every failure below
    # closes what is still open (a pod member's launcher lives on after it).
    ends = [go_r, err_w]
    try:
        if member:
            pid = member.clone(plan.clone_flags, cg.dirfd, err_w)
        else:
            pid = k.clone_fork(plan.clone_flags, cg.dirfd)
    except BaseException as e:
        _close_fds(ends + [go_w, err_r])
        if isinstance(e, OSError):
            raise _clone_error(e, plan) from None
        raise
    if pid == 0:
        # init never execs, so O_CLOEXEC does not apply: close the launcher's
        # cgroup and BPF program fds or init would hold them for its lifetime.
        _close_fds(cg.fds)
        os.close(go_w)
        os.close(err_r)
        if tty:
            tty[0].close()
        # The child must never return into the launcher's code (its
        # finally blocks would tear down the cgroup from inside).
        try:
            init.run(plan, go_r, err_w, tty[1] if tty else None, wait)
        finally:
            os._exit(125)
    child = None
    try:
        if hold:
            # The pidfd right after the clone, before anything else can fail:
            # from here on init is only ever signalled through it.
            try:
                child = _Child(pid)
            except OSError:
                os.kill(pid, 9)      # not yet waited for: the number is still ours
                os.waitpid(pid, 0)
                raise
        if member:
            member.register(child.fd)
        while ends:
            os.close(ends.pop())     # popped first: close releases the fd even when it fails
        # The image root is init's from here on: the launcher holds no
        # descriptor of the image while the sandbox runs.
        os.close(plan.rootfd)
        if tty:
            tty[1].close()
    except BaseException:
        # The caller has no handle on init yet: kill it here, as the
        # caller's teardown would have.
        if child is not None:
            child.kill_and_reap()
        _close_fds(ends + [go_w, err_r])
        raise
    return pid, child, go_w, err_r


def _close_fds(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class _Child:
    """The sandbox's init as the launcher holds it.  Every signal goes through
    a pidfd (pidfd_send_signal(2)), which names this process and no other: once
    init is reaped its number may belong to an unrelated process (as root, a
    kill() by number would hit it), while the pidfd only answers ESRCH.  The
    pidfd is opened before the first wait, when the number is still ours."""

    def __init__(self, pid):
        self.pid = pid
        self.status = None       # set once reaped
        self.fd = k.syscall("pidfd_open", pid, 0)

    def signal(self, sig):
        if self.status is not None:
            return
        try:
            k.syscall("pidfd_send_signal", self.fd, sig, None, 0)
        except OSError:
            pass                 # ESRCH: it has exited

    def poll(self):
        """The exit status once init has exited (reaping it), else None."""
        if self.status is None:
            try:
                wpid, st = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                wpid, st = self.pid, 125 << 8
            if wpid == 0:
                return None
            self._reaped(128 + os.WTERMSIG(st) if os.WIFSIGNALED(st) else os.WEXITSTATUS(st))
        return self.status

    def kill_and_reap(self):
        """SIGKILL and reap, unless it is already reaped; never raises."""
        if self.status is not None:
            return
        self.signal(9)
        try:
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        self._reaped(137)

    def _reaped(self, status):
        self.status = status
        os.close(self.fd)


def _supervise(child, err_r, master, on_start=None):
    """Forward signals to init, relay the terminal, collect the first error
    record, and return the sandbox's status once init exits.  `on_start` is
    called once the command has started (the channel closed with no record).
    The signals it handles are blocked (launch() blocked them before the
    clone): without a terminal to relay or a start to report, it takes them
    one by one with sigwaitinfo(2) and reads the channel once init is gone
    (every writer of it is then gone too); otherwise select(2) watches the
    channel and the terminal beside them."""
    import _signal
    sigs = set(FORWARDED) | {_SIGCHLD}
    status = None
    if master is None and on_start is None:
        while status is None:
            sig = _signal.sigwaitinfo(sigs).si_signo
            if sig == _SIGCHLD:
                status = child.poll()
            else:
                child.signal(sig)
        return _channel_end(err_r, b"", status)
    import select
    wake_r, wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    _signal.set_wakeup_fd(wake_w)
    noop = lambda signum, frame: None  # noqa: E731 - the wakeup fd carries the signal
    for s in sigs:
        _signal.signal(s, noop)
    term = None
    if master is not None:
        _signal.signal(_SIGWINCH, noop)
        term = _Terminal(master)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, sigs)
    errbuf = b""
    watch = [wake_r, err_r] + ([master, 0] if master is not None else [])
    while status is None:
        ready, _, _ = select.select(watch, [], [])
        if wake_r in ready:
            for sig in os.read(wake_r, 256):
                if sig == _SIGCHLD:
                    status = child.poll()
                elif sig == _SIGWINCH and term:
                    term.resize()
                else:
                    child.signal(sig)
        if err_r in ready:
            chunk = os.read(err_r, 4096)
            if chunk:
                errbuf += chunk
            else:
                watch.remove(err_r)
                if on_start is not None and not errbuf:
                    on_start()
        if term and status is None:
            term.relay(ready, watch)
    if term:
        term.finish()
    return _channel_end(err_r, errbuf, status)


def _channel_end(err_r, errbuf, status):
    """The sandbox's status, or the first error record on the channel
    (raised as the SandboxError it names)."""
    os.set_blocking(err_r, False)
    try:
        while chunk := os.read(err_r, 65536):
            errbuf += chunk
    except OSError:      # BlockingIOError: a writer is still there (a pod's rank)
        pass
    rec = channel.parse(errbuf)
    if rec:
        code, what, why, hint = rec
        raise SandboxError(what, why, hint, code)
    return status


def winsize():
    """The caller's terminal's window size (struct winsize), for the sandbox's
    pty (init._open_pty sets it before the command starts); zeros when fd 0
    has none."""
    import fcntl
    import termios
    try:
        return fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8)
    except OSError:
        return b"\0" * 8


class _Terminal:
    """--tty: the caller's terminal in raw mode, relayed to the sandbox's pty."""

    def __init__(self, master):
        import termios
        import tty
        self.master = master
        self.saved = termios.tcgetattr(0)
        tty.setraw(0)
        self.resize()

    def resize(self):
        import fcntl
        import termios
        try:
            size = fcntl.ioctl(0, termios.TIOCGWINSZ, b"\0" * 8)
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, size)
        except OSError:
            pass

    def relay(self, ready, watch):
        if 0 in ready:
            data = os.read(0, 4096)
            if data:
                os.write(self.master, data)
            else:
                watch.remove(0)
        if self.master in ready:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO once the last slave fd closes
                data = b""
            if data:
                os.write(1, data)
            else:
                watch.remove(self.master)

    def finish(self):
        import termios
        os.set_blocking(self.master, False)
        try:
            while True:
                data = os.read(self.master, 65536)
                if not data:
                    break
                os.write(1, data)
        except OSError:
            pass
        termios.tcsetattr(0, termios.TCSADRAIN, self.saved)
