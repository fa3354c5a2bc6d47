"""`gpusandbox ps | exec | stop | kill | logs | wait | rm` (docs/live.md):
the caller's named and detached sandboxes (`exec`: live/execcli.py).
argparse and json are loaded only where used, so that `exec`, which
imports this module's lookups, loads neither.

Every command acts on the caller's own records only (record.py: found by
walking the caller's runtime directory, every piece the caller's): another
user's sandbox of the same name is another sandbox, and one of theirs
cannot be named at all.  Real root's `ps` also lists what it finds of other
users' (labelled by owner); acting on them is theirs to do.
"""
import os
import sys
import time

from ..errors import SandboxError, UsageError, printable
from ..linux import procstat
from ..linux import sys as k
from . import record

STOP_TIMEOUT = 10


def _parser(cmd, desc):
    import argparse

    class _Parser(argparse.ArgumentParser):
        def error(self, message):
            raise UsageError(f"{self.prog.partition(' ')[2]}: {message}", None,
                             f"run '{self.prog} --help'")
    return _Parser(prog=f"gpusandbox {cmd}", description=desc)


def _name(p):
    p.add_argument("name", metavar="NAME", help="the sandbox's name (run --name, or the one "
                   "run -d printed)")


# --- ps -------------------------------------------------------------------------
def ps_parser():
    p = _parser("ps", "List your named and detached sandboxes (real root: everyone's it "
                "can find, with their owner).")
    p.add_argument("-a", "--all", action="store_true",
                   help="also those that have exited (kept until 'gpusandbox rm')")
    p.add_argument("--json", action="store_true", help="one JSON object per sandbox, in a list")
    return p


def _row(rec, owner=None):
    st = record.state(rec)
    return {"name": rec.get("name"), "owner": rec.get("owner") if owner is None else owner,
            "image": rec.get("image"), "command": rec.get("argv") or [],
            "gpus": rec.get("gpus") or "", "state": st,
            "pid": (rec.get("init") or [0])[0] if st == "running" else 0,
            "created": rec.get("created"), "finished": rec.get("finished"),
            "exit_code": rec.get("exit_code"), "detached": bool(rec.get("detached"))}


def _when(t):
    if not isinstance(t, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _user(uid):
    import pwd
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, TypeError):
        return str(uid)


def main_ps(argv):
    a = ps_parser().parse_args(argv)
    rows = []
    pfd, ppath = record.open_part(make=False)
    if pfd is not None:
        try:
            rows += [_row(rec, os.geteuid()) for _, rec in record.entries(pfd, ppath)]
        finally:
            os.close(pfd)
    if os.geteuid() == 0:
        rows += [_row(rec, uid) for uid, rec in record.others()]
    if not a.all:
        rows = [r for r in rows if r["state"] in ("running", "starting")]
    if a.json:
        import json
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    others = any(r["owner"] != os.geteuid() for r in rows)
    head = (["OWNER"] if others else []) + ["NAME", "IMAGE", "COMMAND", "GPUS", "STATE",
                                            "PID", "CREATED", "STATUS"]
    table = [head]
    for r in rows:
        status = "-" if r["exit_code"] is None else str(r["exit_code"])
        cmd = " ".join(r["command"])
        table.append(([_user(r["owner"])] if others else []) + [
            r["name"], r["image"], cmd[:40], r["gpus"] or "-", r["state"],
            str(r["pid"] or "-"), _when(r["created"]), status])
    table = [[printable(c) for c in row] for row in table]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")
    return 0


# --- the commands on one sandbox -------------------------------------------------
def _find(name):
    pfd, ppath, rec = record.find(name)
    return pfd, rec


def _running(rec):
    if record.state(rec) != "running":
        from .join import _not_running
        raise _not_running(rec.get("name"))


def _pidfd(rec, which):
    """A pidfd of the record's launcher or init, or None when it is gone."""
    pid, start = (rec.get(which) or (0, None))[:2]
    if not procstat.alive(pid, start):
        return None
    try:
        fd = k.syscall("pidfd_open", pid, 0)
    except OSError:
        return None
    if not procstat.alive(pid, start):
        os.close(fd)
        return None
    return fd


def _signal(rec, sig):
    fd = _pidfd(rec, "init")
    if fd is None:
        return False
    try:
        k.syscall("pidfd_send_signal", fd, sig, None, 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _wait_launcher(rec, timeout):
    """Wait up to `timeout` seconds (None: for good) for the launcher to
    end; whether it has."""
    import select
    fd = _pidfd(rec, "launcher")
    if fd is None:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)


def stop_parser():
    p = _parser("stop", "Stop the sandbox NAME: SIGTERM to its command, then, after the "
                "timeout, SIGKILL of the whole sandbox.")
    p.add_argument("-t", "--time", type=int, default=STOP_TIMEOUT, metavar="SECONDS",
                   help=f"seconds to wait before SIGKILL (default {STOP_TIMEOUT})")
    _name(p)
    return p


def _signal_launcher(rec, sig):
    fd = _pidfd(rec, "launcher")
    if fd is not None:
        try:
            k.syscall("pidfd_send_signal", fd, sig, None, 0)
        except OSError:
            pass
        finally:
            os.close(fd)


def stop(rec, timeout):
    st = record.state(rec)
    if st == "starting":
        # No init yet: the launcher itself ends (its clean-ups run).
        _signal_launcher(rec, 15)
        if not _wait_launcher(rec, max(timeout, 1)):
            _signal_launcher(rec, 9)
            _wait_launcher(rec, None)
        return
    if st != "running":
        return
    if timeout > 0 and _signal(rec, 15) and _wait_launcher(rec, timeout):
        return
    _signal(rec, 9)
    # The launcher reaps init and tears the cgroup leaf down.
    _wait_launcher(rec, None)


def main_stop(argv):
    a = stop_parser().parse_args(argv)
    if a.time < 0:
        raise UsageError(f"invalid --time {a.time}", "negative", "give seconds, e.g. -t 10")
    pfd, rec = _find(a.name)
    os.close(pfd)
    stop(rec, a.time)
    sys.stdout.write(a.name + "\n")
    return 0


def kill_parser():
    p = _parser("kill", "Send a signal to the sandbox NAME's command (through its init, "
                "which passes HUP INT QUIT USR1 USR2 TERM on; KILL ends the whole sandbox).")
    p.add_argument("-s", "--signal", default="KILL", metavar="SIG",
                   help="signal name or number (default KILL)")
    _name(p)
    return p


def _signum(text):
    import signal
    t = text.upper()
    if t.isdigit() and 0 < int(t) < signal.NSIG:
        return int(t)
    try:
        return int(signal.Signals[t if t.startswith("SIG") else "SIG" + t])
    except KeyError:
        raise UsageError(f"invalid --signal {printable(text)!r}", None,
                         "a name (TERM, SIGINT) or a number") from None


def main_kill(argv):
    a = kill_parser().parse_args(argv)
    sig = _signum(a.signal)
    pfd, rec = _find(a.name)
    os.close(pfd)
    _running(rec)
    if not _signal(rec, sig):
        from .join import _not_running
        raise _not_running(a.name)
    sys.stdout.write(a.name + "\n")
    return 0


def logs_parser():
    p = _parser("logs", "Print what the detached sandbox NAME wrote (its stdout and stderr, "
                f"the newest {__import__('gpusandbox.live.log', fromlist=['x']).LOG_MAX >> 20}"
                " MiB at most).")
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing what it writes until it ends")
    _name(p)
    return p


def main_logs(argv):
    a = logs_parser().parse_args(argv)
    from . import log
    pfd, ppath, rec = record.find(a.name)
    try:
        if not rec.get("detached"):
            raise SandboxError(f"sandbox {a.name!r} has no log", "it runs in the foreground "
                               "of its launcher, whose terminal has its output", None)
        dfd = record.open_dir(pfd, ppath, a.name)
    finally:
        os.close(pfd)
    if dfd is None:
        raise SandboxError(f"no sandbox named {a.name!r}")
    try:
        sys.stdout.flush()
        log.read_log(dfd, a.follow, 1, lambda: record.state(rec) == "running")
    except BrokenPipeError:
        pass
    finally:
        os.close(dfd)
    return 0


def wait_parser():
    p = _parser("wait", "Wait for the sandbox NAME to end and print its exit status.")
    _name(p)
    return p


def main_wait(argv):
    a = wait_parser().parse_args(argv)
    pfd, rec = _find(a.name)
    os.close(pfd)
    _wait_launcher(rec, None)
    try:
        pfd, _, rec = record.find(a.name)
        os.close(pfd)
    except SandboxError:
        raise SandboxError(f"sandbox {a.name!r} ended without an exit status", "its record "
                           "went with it (not detached, --rm, or its launcher was killed)",
                           None) from None
    sys.stdout.write(f"{rec.get('exit_code')}\n")
    return 0


def rm_parser():
    p = _parser("rm", "Remove the record and log of the sandbox NAME once it has exited.")
    p.add_argument("-f", "--force", action="store_true",
                   help="stop it first when it runs (SIGKILL)")
    p.add_argument("names", nargs="+", metavar="NAME")
    return p


def main_rm(argv):
    a = rm_parser().parse_args(argv)
    code = 0
    for name in a.names:
        pfd, ppath, rec = record.find(name)
        try:
            if record.state(rec) == "running":
                if not a.force:
                    raise SandboxError(f"sandbox {name!r} is running", None,
                                       f"'gpusandbox stop {name}' first, or rm -f")
                stop(rec, 0)
            record.remove(pfd, name)
        finally:
            os.close(pfd)
        sys.stdout.write(name + "\n")
    return code
