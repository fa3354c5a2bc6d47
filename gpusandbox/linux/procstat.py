"""A process as /proc/PID/stat names it: its state, parent and start time
(field 22, in clock ticks since boot).  A pid with its start time names one
process for good: a recycled number comes with another start time.

Light: os only (the OCI fast paths and `gpusandbox ps` call it)."""
import os


def stat_fields(pid):
    """The fields of /proc/PID/stat after the command name (field 3 on), or
    None when the pid is gone.  The name is skipped by its last ')': a
    process may put any byte in its own name."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()


def start_time(pid):
    """(start time, state letter) of `pid`, or None when the pid is gone."""
    rest = stat_fields(pid)
    if not rest or len(rest) < 20:
        return None
    return int(rest[19]), rest[0].decode()


def parent(pid):
    """The parent pid of `pid` (as this process's pid namespace sees it),
    or None when the pid is gone."""
    rest = stat_fields(pid)
    return int(rest[1]) if rest and len(rest) > 1 else None


def alive(pid, start):
    """Whether `pid` still names the process that started at `start` and
    has not exited (a zombie has)."""
    if not isinstance(pid, int) or pid <= 0 or not isinstance(start, int):
        return False
    got = start_time(pid)
    return got is not None and got[0] == start and got[1] not in ("Z", "X")


def children(pid):
    """The pids of `pid`'s children, lowest first ([] when unreadable):
    /proc/PID/task/PID/children, else (a kernel without
    CONFIG_PROC_CHILDREN) every process whose parent it is."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return sorted(int(p) for p in f.read().split())
    except FileNotFoundError:
        pass
    except (OSError, ValueError):
        return []
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and parent(name) == pid:
            out.append(int(name))
    return sorted(out)
