"""The OCI config's per-process kernel settings: process.scheduler,
process.ioPriority, process.execCPUAffinity and linux.memoryPolicy, read as
plain data (ProcSettings) for the command stage, which applies them with
gpusandbox/linux/procsched.py before it drops its privileges.

What can be judged without the kernel is refused here, at `create`, with
the words crun uses for it (callers and crun's own tests match them); what
only the kernel can judge (a NUMA node that does not exist, a deadline
reservation the CPU cannot admit) fails the start with the kernel's errno.
"""
from ..errors import UsageError

SCHED_POLICIES = {"SCHED_OTHER": 0, "SCHED_FIFO": 1, "SCHED_RR": 2, "SCHED_BATCH": 3,
                  "SCHED_IDLE": 5, "SCHED_DEADLINE": 6}
SCHED_FLAGS = {"SCHED_FLAG_RESET_ON_FORK": 0x01, "SCHED_FLAG_RECLAIM": 0x02,
               "SCHED_FLAG_DL_OVERRUN": 0x04, "SCHED_FLAG_KEEP_POLICY": 0x08,
               "SCHED_FLAG_KEEP_PARAMS": 0x10, "SCHED_FLAG_UTIL_CLAMP_MIN": 0x20,
               "SCHED_FLAG_UTIL_CLAMP_MAX": 0x40}
IOPRIO_CLASSES = {"IOPRIO_CLASS_RT": 1, "IOPRIO_CLASS_BE": 2, "IOPRIO_CLASS_IDLE": 3}
MPOL_MODES = {"MPOL_DEFAULT": 0, "MPOL_PREFERRED": 1, "MPOL_BIND": 2, "MPOL_INTERLEAVE": 3,
              "MPOL_LOCAL": 4, "MPOL_PREFERRED_MANY": 5, "MPOL_WEIGHTED_INTERLEAVE": 6}
MPOL_FLAGS = {"MPOL_F_NUMA_BALANCING": 1 << 13, "MPOL_F_RELATIVE_NODES": 1 << 14,
              "MPOL_F_STATIC_NODES": 1 << 15}
# sched(7): every SCHED_DEADLINE time is at least 1024 ns and at most 2^63.
DL_MIN, DL_MAX = 1024, 1 << 63
U64 = (1 << 64) - 1


class ProcSettings:
    """Plain data for the command stage; None: leave the inherited setting."""
    __slots__ = ("sched", "ioprio", "mempolicy", "cpus_initial", "cpus_final", "personality")

    def __init__(self):
        self.sched = self.ioprio = self.mempolicy = self.personality = None
        self.cpus_initial = self.cpus_final = None

    def __bool__(self):
        return any(getattr(self, s) is not None for s in self.__slots__)


def _bad(where, why):
    return UsageError(f"OCI config {where}", why)


def _int(obj, key, where, lo, hi):
    v = obj.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(where, f"{key} has the wrong type ({type(v).__name__})")
    if not lo <= v <= hi:
        raise _bad(where, f"{key} {v} is out of range ({lo} to {hi})")
    return v


def _named_and_flags(obj, where, key, names, flag_names, missing, what, flag_what):
    """(obj[key], one of `names`; the OR of obj's "flags", each one of
    `flag_names`), refused in crun's words."""
    if not isinstance(obj, dict):
        raise _bad(where, "not an object")
    name = obj.get(key)
    if not name:
        raise _bad(where, missing)
    if name not in names:
        raise _bad(where, f"invalid {what} `{name}`")
    flags = 0
    for f in obj.get("flags") or []:
        if f not in flag_names:
            raise _bad(where, f"invalid {flag_what} `{f}`")
        flags |= flag_names[f]
    return name, flags


def _scheduler(s):
    where = "process.scheduler"
    name, flags = _named_and_flags(s, where, "policy", SCHED_POLICIES, SCHED_FLAGS,
                                   "scheduler policy not defined", "scheduler",
                                   "scheduler option")
    nice = _int(s, "nice", where, -20, 19) or 0
    prio = _int(s, "priority", where, 0, 99) or 0
    times = [_int(s, k, where, 0, U64) for k in ("runtime", "deadline", "period")]
    runtime, deadline, period = (t or 0 for t in times)
    if name == "SCHED_DEADLINE":
        _check_deadline(times, runtime, deadline, period)
    return (SCHED_POLICIES[name], flags, nice, prio, runtime, deadline, period)


def _check_deadline(given, runtime, deadline, period):
    """sched_setattr(2)'s rules for SCHED_DEADLINE, in crun's words."""
    pre = "sched_setattr: `SCHED_DEADLINE`"
    where = "process.scheduler"
    if given[0] is None:
        raise _bad(where, f"{pre} requires `runtime`")
    if given[1] is None:
        raise _bad(where, f"{pre} requires `deadline`")
    if runtime == 0:
        raise _bad(where, f"{pre} runtime must be greater than 0")
    if deadline == 0:
        raise _bad(where, f"{pre} deadline must be greater than 0")
    if runtime > deadline:
        raise _bad(where, f"{pre} runtime ({runtime}) must be <= deadline ({deadline})")
    if period and deadline > period:
        raise _bad(where, f"{pre} deadline ({deadline}) must be <= period ({period})")
    # A period of 0 means "the deadline" (sched(7)).
    for name, v in (("runtime", runtime), ("deadline", deadline), ("period", period or DL_MIN)):
        if not DL_MIN <= v <= DL_MAX:
            raise _bad(where, f"{pre} {name} ({v}) must be between {DL_MIN} and {DL_MAX}")


def _ioprio(p):
    where = "process.ioPriority"
    if not isinstance(p, dict):
        raise _bad(where, "not an object")
    cls = p.get("class")
    if cls not in IOPRIO_CLASSES:
        raise _bad(where, f"invalid io priority `{cls}`")
    level = _int(p, "priority", where, 0, 7) or 0
    # IOPRIO_PRIO_VALUE(class, data): the class above bit 13 (linux/ioprio.h).
    return (IOPRIO_CLASSES[cls] << 13) | level


def cpu_list(text, where):
    """A cpuset list ("0-3,8") as a set of CPU numbers."""
    cpus = set()
    if not isinstance(text, str) or not text.strip():
        raise _bad(where, "must be a CPU list such as 0-3,8")
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise _bad(where, f"invalid CPU list {text!r}")
        a, b = int(lo), int(hi) if dash else int(lo)
        if b < a or b >= 8192:
            raise _bad(where, f"invalid CPU range {part.strip()!r}")
        cpus.update(range(a, b + 1))
    return frozenset(cpus)


def _mempolicy(p):
    where = "linux.memoryPolicy"
    mode, flags = _named_and_flags(p, where, "mode", MPOL_MODES, MPOL_FLAGS, "mode is required",
                                   "memory policy mode", "memory policy flag")
    nodes = p.get("nodes")
    nodeset = cpu_list(nodes, where + ".nodes") if nodes not in (None, "") else frozenset()
    return (MPOL_MODES[mode], flags, nodeset)


# personality(2) execution domains (linux/personality.h); the spec names two.
PERSONALITIES = {"LINUX": 0x0000, "LINUX32": 0x0008}


def _personality(p):
    where = "linux.personality"
    if not isinstance(p, dict) or p.get("domain") not in PERSONALITIES:
        raise _bad(where, f"domain must be one of {', '.join(PERSONALITIES)}")
    if p.get("flags"):
        raise _bad(where, "flags are not supported (the runtime spec defines none)")
    return PERSONALITIES[p["domain"]]


def parse(proc, linux=None):
    """ProcSettings of a process object (and, for the container's own
    process, the linux object's memoryPolicy).  Raises UsageError."""
    out = ProcSettings()
    if proc.get("scheduler") is not None:
        out.sched = _scheduler(proc["scheduler"])
    if proc.get("ioPriority") is not None:
        out.ioprio = _ioprio(proc["ioPriority"])
    aff = proc.get("execCPUAffinity")
    if aff is not None:
        if not isinstance(aff, dict):
            raise _bad("process.execCPUAffinity", "not an object")
        if aff.get("initial"):
            out.cpus_initial = cpu_list(aff["initial"], "process.execCPUAffinity.initial")
        if aff.get("final"):
            out.cpus_final = cpu_list(aff["final"], "process.execCPUAffinity.final")
    if linux and linux.get("memoryPolicy") is not None:
        out.mempolicy = _mempolicy(linux["memoryPolicy"])
    if linux and linux.get("personality") is not None:
        out.personality = _personality(linux["personality"])
    if out:
        # Loaded here, in `create` or `exec` before the clone or setns: the
        # command stage runs where the image's tree is the root.
        from ..linux import procsched  # noqa: F401
    return out
