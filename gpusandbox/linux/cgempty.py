"""Emptying a cgroup: SIGKILL to every member, then wait until none is left.

A member can outlive its SIGKILL for a while: a task in uninterruptible sleep
(I/O on a slow or frozen filesystem, a FUSE or NFS request in flight) takes
the signal only when that sleep ends, and a task a cgroup v1 freezer holds
sleeps through it until thawed.  So the wait watches the cgroup rather than
a clock: on cgroup v2 it sleeps in poll() on cgroup.events, which the kernel
signals (POLLPRI) when `populated` changes, and wakes once a second to kill
and thaw again; without cgroup.events (a v1 devices leaf) it re-reads
cgroup.procs with a growing pause.  How long to wait is the caller's: the
launcher's teardown has a user waiting for the exit status, the reaper
(reaper.py) has nobody waiting and stays until the leaf can be removed.
"""
import errno
import os
import time

from .cgfs import _mounts, _populated, _rmtree, _v1_mounts, _words, _write

THAW_AFTER = 0.05    # seconds after the kill before frozen members are looked for
AGAIN = 1.0          # seconds between rounds of kill and thaw while members remain


def empty(path, version, wait):
    """SIGKILL everything in the cgroup tree at `path` (version 2 or 1) and
    wait at most `wait` seconds for it to hold no process; True once it
    holds none.  Raises OSError when the cgroup cannot be signalled."""
    killer = f"{path}/cgroup.kill"
    use_kill_file = version == 2 and os.path.exists(killer)
    events = _open_events(path) if version == 2 else None
    try:
        start = time.monotonic()
        deadline = start + wait
        next_round = start
        thaw_at = start + THAW_AFTER
        pause = 0.005
        while True:
            now = time.monotonic()
            if now >= next_round or not use_kill_file:
                # cgroup.kill: SIGKILL to the whole subtree at once (5.14+);
                # else pid by pid, again each time, for what forked meanwhile.
                if use_kill_file:
                    _write(killer, "1")
                else:
                    _kill_listed(path)
                next_round = now + AGAIN
            if not _holds_processes(path, events):
                return True
            if now >= deadline:
                return False
            if now >= thaw_at:
                # Still there after the kill had time to work: a member
                # frozen by a v1 freezer sleeps through SIGKILL.
                _thaw_v1(path)
                thaw_at = next_round + THAW_AFTER
            wake = min(deadline, next_round, thaw_at) - time.monotonic()
            if events is not None:
                _wait_event(events, wake)
            else:
                time.sleep(max(0.0, min(wake, pause)))
                pause = min(pause * 2, 0.1)
    finally:
        if events is not None:
            os.close(events)


def remove(path, version, wait):
    """The reaper's whole job on a leaf its launcher left (reaper.py): empty
    it (empty() above, up to `wait` seconds) and remove it with the cgroups
    below it; the kernel then frees a BPF program attached to it.  True when
    the leaf is gone (or was already); False when it still holds a process or
    cannot be removed (the next launch's stale cleanup takes it then).  Never
    raises OSError."""
    try:
        if not os.path.isdir(path):
            return True
        if not empty(path, version, wait):
            return False
        _rmtree(path)
    except OSError:
        return False
    return True


def _open_events(path):
    try:
        return os.open(f"{path}/cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _holds_processes(path, events):
    """Read through the polled fd: reading it re-arms POLLPRI (kernfs
    reports a change since this fd's last read)."""
    if events is None:
        return _populated(path)
    try:
        text = os.pread(events, 512, 0).decode("ascii", "replace")
    except OSError as e:
        # ENODEV: the cgroup was removed (by another launch's stale cleanup).
        return e.errno != errno.ENODEV
    for line in text.splitlines():
        if line.startswith("populated "):
            return line.split()[1] != "0"
    return True


def _wait_event(fd, timeout):
    import select     # off OCI create's import path (tests/unit/test_oci_fastjson.py)
    p = select.poll()
    p.register(fd, select.POLLPRI)
    try:
        p.poll(max(0, int(timeout * 1000) + 1))
    except InterruptedError:
        pass


def _kill_listed(path):
    """SIGKILL every pid listed in the cgroup tree (no cgroup.kill).  A pidfd
    pins the pid, and re-reading cgroup.procs after opening it proves the
    pidfd names the member rather than a process that reused its number."""
    from gpusandbox.linux import sys as k
    for top, _, _ in os.walk(path):
        pids = _words(f"{top}/cgroup.procs")
        if not pids:
            continue
        fds = {}
        for p in pids:
            try:
                fds[p] = k.syscall("pidfd_open", int(p), 0)
            except OSError as e:
                if e.errno == errno.ENOSYS:
                    _kill_pid(int(p))
        still = set(_words(f"{top}/cgroup.procs"))
        for p, fd in fds.items():
            try:
                if p in still:
                    k.syscall("pidfd_send_signal", fd, 9, None, 0)
            except OSError:
                pass
            finally:
                os.close(fd)


def _thaw_v1(path, proc="/proc"):
    """Members of the leaf that a cgroup v1 freezer holds (a hybrid or v1
    host, frozen by whoever owns that freezer cgroup) sleep through SIGKILL
    until thawed.  Moving them into the freezer hierarchy's root thaws them
    (the kernel makes a task conform to the state of the cgroup it joins)
    without thawing that cgroup's other tasks; their pending SIGKILL then
    ends them.  Needs write access to the root (real root); otherwise they
    stay, and teardown reports the leaf as left."""
    try:
        root = _v1_mounts(_mounts(proc)).get("freezer")
    except OSError:
        return
    if root is None:
        return
    for top, _, _ in os.walk(path):
        for p in _words(f"{top}/cgroup.procs"):
            try:
                with open(f"{proc}/{p}/cgroup") as f:
                    frozen_in = [ln.split(":", 2)[2] for ln in f.read().splitlines()
                                 if "freezer" in ln.split(":", 2)[1].split(",")]
                if not frozen_in or frozen_in[0] == "/" or ".." in frozen_in[0]:
                    continue
                with open(f"{root}{frozen_in[0]}/freezer.state") as f:
                    if f.read().strip() == "THAWED":
                        continue
                # A frozen task cannot exit, so the pid still names it here.
                _write(f"{root}/cgroup.procs", p)
            except (OSError, IndexError):
                pass


def _kill_pid(pid):
    try:
        os.kill(pid, 9)
    except OSError:
        pass
