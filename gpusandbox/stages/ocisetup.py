"""The init's steps of the container settings an OCI config brings, each
read from a plan field every door fills (hooks, domain name, sysctls, the
root's propagation), and the life of a created container (plan.oci: the
wait for `start` on the exec fifo).  Its mounts are plan.mounts, applied by
stages/mountexec.py; the process's own settings (scheduling, stdio
ownership, umask) are the command stage's (stages/command.py).  The init
loads this module only for a plan with something for it
(LaunchPlan.container_settings), before the pivot.
"""
import errno
import os

from ..linux import sys as k
from . import channel

# The channel record that tells `create` the container is set up and its
# init now waits for `start` (code 0: not a failure).
READY = f"0{channel.SEP}ready{channel.SEP}{channel.SEP}\n".encode()
# The record that tells `create` the init waits at the hooks point
# (hooks_point) for the config's prestart and createRuntime hooks.
HOOKS = f"0{channel.SEP}hooks{channel.SEP}{channel.SEP}\n".encode()


def open_sources(plan):
    """Host-side handles, taken before the image's tree is attached (as the
    init's other sources are): the exec fifo of a created container's state
    directory held by an O_PATH descriptor (reopened for writing after the
    pivot, when no host path is reachable by name any more), and the init's
    pid as the caller sees it, for the hooks' state (/proc here is still the
    host's, of the caller's pid namespace)."""
    fifo = plan.oci.fifo if plan.oci is not None else None
    fifo = os.open(fifo, k.O_PATH | os.O_CLOEXEC) if fifo else -1
    pid = int(os.readlink("/proc/self")) if plan.hook_state else 0
    return {"fifo": fifo, "pid": pid}


def runtime_hooks(plan):
    """Whether the plan has hooks `create` runs in the runtime's namespaces
    while the init waits at the hooks point (hooks_point)."""
    return bool(plan.hooks.get("prestart") or plan.hooks.get("createRuntime"))


def hooks_point(plan, err_w, go_r):
    """The runtime-spec's point for the prestart and createRuntime hooks
    (config.md, POSIX-platform hooks): the container's namespaces made, its
    mounts done, before the pivot (runc's point too).  The init says HOOKS
    to `create` and waits on the go pipe: "H" once the hooks have run; EOF
    when `create` failed or died (it then kills this process anyway).
    Unprivileged, the caller's hooks reach /proc/PID/root and /proc/PID/ns
    only if this process is dumpable (a non-dumpable one needs CAP_SYS_PTRACE
    over the namespace `create` ran in): it is, for the wait only, when no
    other pid namespace's processes can see it (none joined)."""
    joined = plan.oci.ns_join if plan.oci is not None else ()
    look = not plan.real_root and not any(t == "pid" for t, _ in joined)
    if look:
        k.prctl(4, 1)   # PR_SET_DUMPABLE
    os.write(err_w, HOOKS)
    go = os.read(go_r, 1)
    if look:
        k.prctl(4, 0)
    if go != b"H":
        os._exit(125)


def container_hooks(plan, stage, pid, cwd=None):
    """createContainer (after the mounts and the runtime's hooks, before the
    pivot: the paths are the runtime's, cwd the bundle) and startContainer
    hooks (after `start`, in the container's root, before the workload):
    run by the init, in the container's namespaces, with the OCI state on
    stdin (runtime-spec config.md; status created for both, as crun's
    test_in_container_hooks_state expects).  A failing one fails the
    container."""
    hooks = plan.hooks.get(stage) if plan.hook_state else None
    if not hooks:
        return
    from ..oci.runtime import hooks as runner   # loaded by `create` before the clone
    from ..errors import SandboxError
    state = dict(plan.hook_state, pid=pid)
    try:
        runner.run(plan.hooks, (stage,), state, None, cwd=cwd)
    except SandboxError as e:
        raise OSError(0, e.line()) from None    # the init reports an OSError's text as is


def start_propagation(plan):
    """MS_SLAVE for the init's copy of the host's tree (host mounts still
    reach the container's binds, nothing goes back), MS_PRIVATE when an OCI
    config asks for a private root (oci/propagation.py)."""
    prop = plan.rootfs_propagation
    return k.MS_PRIVATE if prop is not None and prop[0] == k.MS_PRIVATE else k.MS_SLAVE


def root_propagation(plan, kern):
    """linux.rootfsPropagation on the container's root, after the pivot."""
    prop = plan.rootfs_propagation
    if prop is not None:
        flag, rec = prop
        kern.mount(None, "/", None, flag | (k.MS_REC if rec else 0))


def kernel_settings(plan, rootfd, kern):
    """The container's domain name (in its own UTS namespace: oci/config.py
    insists on one) and sysctls, after the mounts and before the masking
    makes /proc/sys read-only."""
    if plan.domainname:
        kern.setdomainname(plan.domainname.encode())
    for key, value in plan.sysctl:
        # The key was checked as dotted words (oci/config.py): no '..' and no '/'.
        kern.write_in_root(rootfd, "proc/sys/" + key.replace(".", "/"), value.encode())


def wait_start(plan, err_w, src, tty_slave=None):
    """Say READY to `create`, then block in open(2) of the exec fifo until
    `start` opens its other end, and run the startContainer hooks.
    `create` has gone by then, so the error channel becomes the container's
    stderr (conmon's log) with text lines.
    With a terminal, the container's stdio is the pty from here on, as
    runc's init has it: the init must not keep `create`'s own stdout and
    stderr, which containerd's runc shim reads to EOF before it takes the
    console and answers the create (docker run -t).  Returns the new error
    fd."""
    os.write(err_w, READY)
    if tty_slave is not None:
        for fd in (0, 1, 2):
            os.dup2(tty_slave, fd)
    os.dup2(2, err_w, inheritable=False)
    channel.PLAIN.append(True)
    fifo = src["fifo"]
    fd = _open_for_start(fifo)
    # The startContainer hooks before the byte `start` waits for: its
    # poststart hooks then come after them, and a failing startContainer
    # hook fails `start`.
    container_hooks(plan, "startContainer", src["pid"], "/")
    os.write(fd, b"0")
    # Kept until the execve closes it: `start` reads to EOF, and a failure
    # before then reaches it (channel.AFTER_START).  Not with a terminal:
    # podman attaches to it once `start` has returned, and a workload that
    # writes and ends within the command stage's few milliseconds would then
    # be gone before the attach (`podman run -it ... tty` lost its output);
    # a failure there reaches the terminal only, as before.
    if tty_slave is None:
        channel.AFTER_START.append(fd)
    else:
        os.close(fd)
    os.close(fifo)
    return err_w


_IN_ATTRIB, _IN_OPEN = 0x04, 0x20


def _open_for_start(fifo):
    """The fifo's write end, once `start` has opened its read end.  A fifo
    unlinked first means the container can never be started: `delete`, or
    its state directory removed (a tmpfs runroot wiped, a caller that lost
    it); the init then ends instead of waiting forever, and the emptied
    cgroup leaf goes with the next create's stale cleanup.  inotify wakes the
    wait on both events (IN_OPEN of the read end, IN_ATTRIB when the link
    count drops; a failed open of our own raises no event), so it neither
    polls nor delays `start`."""
    path = f"/proc/self/fd/{fifo}"
    ino = k.libc.inotify_init1(os.O_CLOEXEC)
    if ino < 0 or k.libc.inotify_add_watch(ino, path.encode(), _IN_OPEN | _IN_ATTRIB) < 0:
        if ino >= 0:
            os.close(ino)
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC)     # block as runc does
    try:
        while True:
            # Watch first, then try: a reader arriving in between leaves an
            # event behind, so the read below returns at once.
            try:
                return os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                if e.errno != errno.ENXIO:
                    raise
            if os.fstat(fifo).st_nlink == 0:
                os._exit(0)
            os.read(ino, 4096)
    finally:
        os.close(ino)


def release_stdio():
    """The init lets go of the caller's stdio once the workload has it: a
    workload that closes its stdout must end the caller's read of it (conmon's
    pipes, `$(... run --detach)`), as with runc, whose init is the workload."""
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
