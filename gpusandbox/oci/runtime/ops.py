"""start, state, kill, delete, pause, resume, ps, list, features: each acts
on the container's init through a pidfd opened after its start time was
checked, so a recycled pid is never signalled."""
import json
import os
import select
import sys

from ...errors import SandboxError
from . import state
# linux.sys (ctypes) and hooks (subprocess) are imported where used: `state`,
# which podman calls all the time, needs neither.

SIGNALS = {"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "IOT": 6, "BUS": 7,
           "FPE": 8, "KILL": 9, "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14,
           "TERM": 15, "STKFLT": 16, "CHLD": 17, "CONT": 18, "STOP": 19, "TSTP": 20,
           "TTIN": 21, "TTOU": 22, "URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26,
           "PROF": 27, "WINCH": 28, "IO": 29, "POLL": 29, "PWR": 30, "SYS": 31}


# The real-time signals by kill(1)'s names: RTMIN, RTMIN+N, RTMAX-N, RTMAX
# (glibc's SIGRTMIN is 34: two are its own; the kernel's SIGRTMAX is 64).
RTMIN, RTMAX = 34, 64


def parse_signal(text):
    """The number of signal `text`: 1..64, a name of SIGNALS or a real-time
    name, with or without SIG, any case (runc's rules, and kill(1)'s
    real-time names); SandboxError for anything else.  bin/gpusandbox-oci
    maps numbers and SIGNALS' upper-case names the same way
    (tests/unit/test_sh_tables.py)."""
    t = (text or "TERM").upper()
    if t.isascii() and t.isdigit() and 0 < int(t) <= RTMAX:
        return int(t)
    t = t[3:] if t.startswith("SIG") else t
    if t in SIGNALS:
        return SIGNALS[t]
    for base, sign, at in (("RTMIN", "+", RTMIN), ("RTMAX", "-", RTMAX)):
        if t == base:
            return at
        off = t[len(base) + 1:] if t.startswith(base + sign) else ""
        if off.isascii() and off.isdigit() and int(off) <= RTMAX - RTMIN:
            return at + int(off) if sign == "+" else at - int(off)
    raise SandboxError(f"unknown signal {text!r}")


def _pidfd(st):
    """A pidfd of the init, only if it is still the recorded process."""
    from ...linux import sys as k
    if not state.alive(st):
        return None
    try:
        fd = k.syscall("pidfd_open", st["pid"], 0)
    except OSError:
        return None
    if not state.alive(st):    # the pidfd now pins it: checked once more
        os.close(fd)
        return None
    return fd


def start(root, cid, log):
    st = state.load(root, cid)
    s = state.status(st)
    if s != "created":
        raise SandboxError("cannot start an already running container" if s == "running"
                           else f"cannot start a container that has {s}"
                           if s == "stopped" else f"cannot start a {s} container")
    fifo = os.path.join(st["_dir"], "exec.fifo")
    # The pidfd first: once the fifo is open the workload may start and end
    # before this process looks, and its init's pid must still be ours then.
    pfd = _pidfd(st)
    if pfd is None:
        raise SandboxError("cannot start a container that has stopped")
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    late = b""
    try:
        while True:
            ready, _, _ = select.select([fd, pfd], [], [])
            if fd in ready:
                try:
                    if os.read(fd, 1):
                        break
                except BlockingIOError:
                    pass
            if pfd in ready:
                if (st.get("hooks") or {}).get("startContainer"):
                    # The init runs them before it answers, and a failing one
                    # ends it (its error on the container's stderr): the
                    # container is then destroyed and the poststop hooks run
                    # (runtime-spec runtime.md, Lifecycle).
                    delete(root, cid, True, log)
                    raise SandboxError("cannot start the container",
                                       "its init exited before start: a startContainer hook "
                                       "failed or the init was killed")
                raise SandboxError("cannot start a container that has stopped",
                                   "its init exited before start")
        # The init holds its end until its execve (or its end): what it
        # writes before is a setup failure after `create` (capset, seccomp),
        # one line (stages/channel.py AFTER_START).
        while True:
            select.select([fd], [], [])
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                break
            late += chunk
    finally:
        os.close(fd)
        os.close(pfd)
    os.unlink(fifo)
    if late:
        raise SandboxError(late.decode("utf-8", "replace").strip().splitlines()[0])
    if (st.get("hooks") or {}).get("poststart"):
        from . import hooks     # subprocess: only when there are hooks to run
        # A failing one is a warning: the container runs on (runtime-spec
        # runtime.md, Lifecycle), and `start` succeeds.
        for line in hooks.run(st.get("hooks"), ("poststart",), poststart_state(st), log,
                              fatal=False):
            sys.stderr.write(f"gpusandbox: warning: {line}\n")
    return 0


def poststart_state(st):
    """The state poststart hooks get: as `start` made it, running with the
    init's pid, even when the workload (pid 1, the init itself) has already
    ended by the time they run."""
    return dict(state.public(st), status="running", pid=st["pid"])


def state_cmd(root, cid):
    st = state.load(root, cid)
    sys.stdout.write(json.dumps(state.public(st), indent=2) + "\n")
    return 0


def kill(root, cid, sig, all_=False):
    from ...linux import sys as k
    st = state.load(root, cid)
    signo = parse_signal(sig)
    pfd = _pidfd(st)
    if pfd is None:
        raise SandboxError("container not running")
    try:
        if all_ and st.get("cgroup"):
            for pid in _cgroup_pids(st["cgroup"]):
                try:
                    os.kill(pid, signo)   # members of the leaf: none is outside the container
                except OSError:
                    pass
        else:
            try:
                k.syscall("pidfd_send_signal", pfd, signo, None, 0)
            except OSError as e:
                # The init of a state of the caller's, not the caller's to
                # signal (its pid recorded by root): one line, as runc.
                raise SandboxError(f"kill {cid}", e.strerror) from None
    finally:
        os.close(pfd)
    return 0


def _cgroup_pids(leaf):
    out = []
    for top, _, _ in os.walk(leaf):
        try:
            with open(os.path.join(top, "cgroup.procs")) as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def delete(root, cid, force, log):
    from ...linux import sys as k
    try:
        st = state.load(root, cid)
    except state.NotFound:
        if force:
            return 0
        raise
    pfd = _pidfd(st)
    if pfd is not None:
        try:
            if not force:
                raise SandboxError(f"cannot delete container {cid} that is not stopped: "
                                   f"{state.status(st)}", None, "use delete --force")
            try:
                k.syscall("pidfd_send_signal", pfd, 9, None, 0)
            except OSError as e:
                raise SandboxError(f"delete --force {cid}: killing its init",
                                   e.strerror) from None
            select.select([pfd], [], [], 10)
        finally:
            os.close(pfd)
    if st.get("cgroup"):
        from ...linux.cgroup import CgroupHandle
        h = CgroupHandle.restore(st["cgroup"], st.get("cgroup_version"), st.get("cgroup_v1"))
        if os.path.isdir(h.path) or h.v1:
            h.teardown()
            for note in h.notes:
                log.warn(note)
    if (st.get("hooks") or {}).get("poststop"):
        from . import hooks
        hooks.run(st.get("hooks"), ("poststop",), state.public(st), log, fatal=False)
    if isinstance(st.get("site_exit"), dict):
        # The site's exit point (sitehooks.py): the container has ended; its
        # status went to the caller that reaped it (conmon), not to us.
        from ... import sitehooks
        sitehooks.exit_point(st["site_exit"], None, log.warn)
    d = st["_dir"]
    for name in state.FILES:
        try:
            os.unlink(os.path.join(d, name))
        except OSError:
            pass
    os.rmdir(d)
    return 0


def delete_matching(root, pattern, force, log):
    """crun's `delete --regex RE`: every container of the root whose id RE
    matches (a search, as regexec(3) does), each as `delete` would; the
    first failure is reported once all were tried."""
    import re
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise SandboxError(f"delete --regex {pattern!r}", f"not a regular expression: {e}",
                           "quote it for the shell, e.g. 'test-.*'") from None
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        names = []
    first = None
    for name in names:
        try:
            state.check_id(name)
        except SandboxError:
            continue        # not a container's directory
        if not rx.search(name):
            continue
        try:
            delete(root, name, force, log)
        except (SandboxError, OSError) as e:
            first = first or e
    if first is not None:
        raise first
    return 0


def freeze(root, cid, on):
    st = state.load(root, cid)
    s = state.status(st)
    if s not in ("running", "paused"):
        raise SandboxError("container not running")
    leaf = st.get("cgroup")
    if not leaf or st.get("cgroup_version") != 2:
        raise SandboxError("pause/resume: the container has no cgroup2 leaf to freeze",
                           None, "run as root or in a delegated cgroup")
    with open(os.path.join(leaf, "cgroup.freeze"), "w") as f:
        f.write("1" if on else "0")
    return 0


def ps(root, cid, fmt):
    st = state.load(root, cid)
    if not state.alive(st):
        pids = []
    elif st.get("cgroup"):
        pids = _cgroup_pids(st["cgroup"])
    else:
        pids = [st["pid"]]
    if fmt == "json":
        sys.stdout.write(json.dumps(pids) + "\n")
        return 0
    sys.stdout.write("PID CMD\n")
    for p in pids:
        try:
            with open(f"/proc/{p}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        sys.stdout.write(f"{p} {comm}\n")
    return 0


def list_cmd(root, fmt, quiet):
    rows = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        names = []
    for name in names:
        try:
            rows.append(state.public(state.load(root, name)))
        except (state.NotFound, SandboxError):
            continue
    if quiet:
        sys.stdout.write("".join(r["id"] + "\n" for r in rows))
    elif fmt == "json":
        sys.stdout.write(json.dumps(rows) + "\n")
    else:
        sys.stdout.write("ID\tPID\tSTATUS\tBUNDLE\tCREATED\tOWNER\n")
        for r in rows:
            sys.stdout.write(f"{r['id']}\t{r['pid']}\t{r['status']}\t{r['bundle']}\t"
                             f"{r['created']}\t{r['owner']}\n")
    return 0


# The runtime spec version this runtime implements: `features`'s
# ociVersionMax and `version`'s "spec:" line (runc's pair: the spec it
# vendors).  config.json of any 1.x is read; fields of later versions that
# gpusandbox cannot honour are refused by name (config.py).
SPEC_VERSION = "1.1.0"


def features():
    from ... import __version__
    from .. import config as c
    from ..configmount import FLAG_OPTS
    doc = {"ociVersionMin": "1.0.0", "ociVersionMax": SPEC_VERSION,
           "hooks": ["prestart", "createRuntime", "createContainer", "startContainer",
                     "poststart", "poststop"],
           "mountOptions": sorted(FLAG_OPTS),
           "linux": {"namespaces": sorted(c.NS_FLAGS),
                     "capabilities": ["CAP_" + n for n in c.CAPS],
                     "cgroup": {"v1": True, "v2": True, "systemd": False, "systemdUser": False},
                     "seccomp": {"enabled": True,
                                 "actions": ["SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL",
                                             "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL_THREAD",
                                             "SCMP_ACT_TRAP", "SCMP_ACT_LOG"],
                                 "operators": ["SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE",
                                               "SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT",
                                               "SCMP_CMP_MASKED_EQ"]},
                     "apparmor": {"enabled": False}, "selinux": {"enabled": False}},
           # The runtime's own version (runc reports its own under its key;
           # this is not runc).
           "annotations": {"io.gpusandbox.version": __version__}}
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    return 0
