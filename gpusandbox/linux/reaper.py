"""The leaf's reaper: removes a sandbox's cgroup leaf when its launcher dies
before its own teardown (SIGKILL, OOM kill).

cgroup2 never removes an empty cgroup by itself (v1's release_agent has no v2
counterpart), and nothing inside the leaf can remove it: a cgroup with a
member cannot be removed, and the sandbox's init sees only its own cgroup
namespace.  So the launcher forks, before it creates the leaf, one small
process that stays outside it, in the launcher's cgroup:

    launcher ──pipe──> gpusandbox-reap      blocks in read() on the pipe

* the launcher's teardown ends by writing b"D" (done): the reaper exits and
  the launcher reaps it, so a caller that removes its own cgroup right after
  the launcher exits finds it empty;
* the launcher dies: every write end is gone (the launcher's; init closes
  its inherited copy at once and dies with the launcher by PDEATHSIG), read()
  returns EOF, and the reaper empties the leaf (cgroup.kill), removes it
  (which releases the BPF device program attached to it: the kernel frees a
  removed cgroup's programs) and exits.  The same happens when the
  launcher's own teardown could not empty the leaf in its short wait.

Emptying can take longer than the launcher's teardown allows itself (a
member in uninterruptible sleep takes its SIGKILL only when that sleep
ends): nobody waits for the reaper, so it waits for the leaf to empty for up
to WAIT seconds (cgempty.py) before it leaves the leaf to the next launch's
stale cleanup.  Giving up at the launcher's bound would leave the leaf
behind for good once its last member does go.

It is no daemon: it lives as long as the launcher, plus the teardown.
It holds no fd of the caller (stdio goes to /dev/null, so `$(gpusandbox run
...)` is not kept waiting), sits in its own session with every signal blocked
(a terminal's or a process group's signal meant for the job does not stop it
before its work), and is forked only when a leaf is made.
"""
import os

from . import cgempty

NAME = "gpusandbox-reap"     # /proc/PID/comm (15 bytes at most)
DONE = b"D"
WAIT = 600.0     # seconds the leaf's last members may take to leave after the kill


def start(leaf, version, v1=()):
    """Fork the reaper for `leaf` (not yet created; v2 or v1 devices) and the
    cgroup v1 leaves `v1` of its limits (cgroupv1.py); returns
    (the pipe's write end, for the launcher to keep until its teardown ends;
    the reaper's pid)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid:
        os.close(r)
        return w, pid
    try:
        _run(r, leaf, version, v1)
    finally:
        os._exit(0)


def finish(fd, pid, removed):
    """The launcher's last word: b"D" when its teardown removed the leaf (then
    wait for the reaper to exit), else plain EOF, and the reaper tries once
    more on its own."""
    try:
        if removed:
            os.write(fd, DONE)
    except OSError:
        removed = False
    finally:
        os.close(fd)
    if removed:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _run(r, leaf, version, v1):
    # stdio first: nothing the reaper might print may reach the caller.
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    import _signal
    from gpusandbox.linux import sys as k
    _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
    os.setsid()
    try:
        k.set_comm(NAME)
    except OSError:
        pass
    # Only the pipe stays open: no fd of the caller (a pipe a shell waits on,
    # srun's PMI_FD), of the launcher (the cgroup fds), or its cwd's mount.
    keep = sorted({0, 1, 2, r})
    low = 0
    for fd in keep + [0x7FFFFFFF]:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.chdir("/")
    while True:
        try:
            said = os.read(r, 1)
            break
        except InterruptedError:
            continue
    if said == DONE:
        return
    if cgempty.remove(leaf, version, WAIT):
        from . import cgroupv1
        try:
            cgroupv1.remove(v1)
        except OSError:
            pass
