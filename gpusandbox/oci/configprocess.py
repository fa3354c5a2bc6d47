"""An OCI process object read as typed data: the one parser of the
container's process (config.json, `create`: oci/config.py) and of one more
process in it (`exec --process FILE` or the command line over the
container's process: oci/runtime/execute.py), so that both refuse bad input
with the same line naming the field and fill the same plan fields
(configplan.process)."""
from .configfield import _bad, _get, _strs

CAPS = ("CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP "
        "LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER "
        "SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE "
        "SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
        "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF "
        "CHECKPOINT_RESTORE").split()
RLIMITS = {"RLIMIT_CPU": 0, "RLIMIT_FSIZE": 1, "RLIMIT_DATA": 2, "RLIMIT_STACK": 3,
           "RLIMIT_CORE": 4, "RLIMIT_RSS": 5, "RLIMIT_NPROC": 6, "RLIMIT_NOFILE": 7,
           "RLIMIT_MEMLOCK": 8, "RLIMIT_AS": 9, "RLIMIT_LOCKS": 10, "RLIMIT_SIGPENDING": 11,
           "RLIMIT_MSGQUEUE": 12, "RLIMIT_NICE": 13, "RLIMIT_RTPRIO": 14, "RLIMIT_RTTIME": 15}


class Process:
    """A process object's fields, checked."""
    __slots__ = ("args", "env", "cwd", "terminal", "uid", "gid", "groups", "umask",
                 # (bounding, effective, permitted, inheritable, ambient) numbers
                 "caps", "nnp",
                 # [(resource number, soft, hard)]
                 "rlimits", "oom_score_adj",
                 # configproc.ProcSettings, or None
                 "settings")


def _caps(names, where):
    out = []
    for n in _strs(names, where):
        short = n[4:] if n.startswith("CAP_") else n
        if short not in CAPS:
            raise _bad(where, f"unknown capability {n}")
        out.append(CAPS.index(short))
    return tuple(sorted(set(out)))


def cap_sets(capset):
    """(bounding, effective, permitted, inheritable, ambient) of an OCI
    process.capabilities object, as capability numbers."""
    return tuple(_caps(capset.get(name) or [], f"process.capabilities.{name}")
                 for name in ("bounding", "effective", "permitted", "inheritable", "ambient"))


def parse(proc, linux=None):
    """The Process of an OCI process object (with, for the container's own
    process, the linux object's memoryPolicy and personality).  Raises
    UsageError naming the field."""
    if not isinstance(proc, dict):
        raise _bad("process", "not an object")
    p = Process()
    p.args = _strs(_get(proc, "args", list, "process", []), "process.args")
    if not p.args:
        raise _bad("process.args", "empty")
    p.env = []
    for item in _strs(_get(proc, "env", list, "process", []), "process.env"):
        key, eq, val = item.partition("=")
        if eq and key:
            p.env.append((key, val))
    p.cwd = _get(proc, "cwd", str, "process", "/")
    if not p.cwd.startswith("/"):
        raise _bad("process.cwd", "must be an absolute path")
    p.terminal = _get(proc, "terminal", bool, "process", False)
    user = _get(proc, "user", dict, "process", {})
    p.uid = _get(user, "uid", int, "process.user", 0)
    p.gid = _get(user, "gid", int, "process.user", 0)
    if p.uid < 0 or p.gid < 0:
        raise _bad("process.user", "uid and gid must not be negative")
    groups = _get(user, "additionalGids", list, "process.user")
    if groups is not None and not all(isinstance(g, int) and not isinstance(g, bool)
                                      and g >= 0 for g in groups):
        raise _bad("process.user.additionalGids", "must be a list of group ids")
    p.groups = groups
    p.umask = _get(user, "umask", int, "process.user")
    p.caps = cap_sets(_get(proc, "capabilities", dict, "process", {}))
    p.nnp = _get(proc, "noNewPrivileges", bool, "process", False)
    p.rlimits = []
    for i, r in enumerate(_get(proc, "rlimits", list, "process", [])):
        t = _get(r, "type", str, f"process.rlimits[{i}]")
        if t not in RLIMITS:
            raise _bad(f"process.rlimits[{i}]", f"unknown rlimit {t}")
        p.rlimits.append((RLIMITS[t], _get(r, "soft", int, t), _get(r, "hard", int, t)))
    p.oom_score_adj = _get(proc, "oomScoreAdj", int, "process")
    from .configproc import parse as proc_settings
    p.settings = proc_settings(proc, linux) or None
    return p
