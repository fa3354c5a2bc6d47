"""Resource limits of a sandbox's cgroup: one model, written as cgroup v2 or
cgroup v1 interface files.

Limits holds the raw values, from `run`'s options (docker's forms: bytes with
k/m/g/t or 'max'; pids; cpus), from an OCI config's linux.resources
(from_oci), or from `update`'s flags (runc's names).  files(version) checks
them (UsageError naming the option) and returns [(controller, file, value)]
to write; OPTION names the option behind each file, for messages.

The one table of what goes where:

| setting              | cgroup v2                         | cgroup v1                       |
|----------------------|-----------------------------------|---------------------------------|
| --memory             | memory.max                        | memory.limit_in_bytes           |
| --memory-swap (total)| memory.swap.max (total - memory)  | memory.memsw.limit_in_bytes     |
| --memory-reservation | memory.low                        | memory.soft_limit_in_bytes      |
| --pids-limit         | pids.max                          | pids.max                        |
| --cpus               | cpu.max "<cpus*100000> 100000"    | cpu.cfs_period_us, cfs_quota_us |
| --cpu-quota/-period  | cpu.max "<quota|max> <period>"    | cpu.cfs_period_us, cfs_quota_us |
| --cpu-shares         | cpu.weight (runc's conversion)    | cpu.shares                      |
| --cpuset-cpus/-mems  | cpuset.cpus, cpuset.mems          | cpuset.cpus, cpuset.mems        |
| --blkio-weight       | io.weight "default N"             | blkio.weight                    |
| hugepage limits      | hugetlb.<size>.max                | hugetlb.<size>.limit_in_bytes   |
| OOM killer disabled  | (none: cgroup v2 has no switch)   | memory.oom_control 1            |
| memory.swappiness    | (none: cgroup v2 has no knob)     | memory.swappiness (0-100)       |

blkio.weight missing on v1 (no CFQ/BFQ weight on the host's scheduler):
blkio.bfq.weight instead, where BFQ has it (cgroupv1.write).
"""
import os

from gpusandbox.errors import UsageError

PERIOD = 100000
# The option behind each interface file (both versions), for messages.
OPTION = {
    "memory.max": "--memory", "memory.limit_in_bytes": "--memory",
    "memory.swap.max": "--memory-swap", "memory.memsw.limit_in_bytes": "--memory-swap",
    "memory.low": "--memory-reservation", "memory.soft_limit_in_bytes": "--memory-reservation",
    "pids.max": "--pids-limit",
    "cpu.max": "--cpus", "cpu.cfs_quota_us": "--cpus", "cpu.cfs_period_us": "--cpus",
    "cpu.weight": "--cpu-shares", "cpu.shares": "--cpu-shares",
    "cpuset.cpus": "--cpuset-cpus", "cpuset.mems": "--cpuset-mems",
    "io.weight": "--blkio-weight", "blkio.weight": "--blkio-weight",
    "memory.oom_control": "memory.disableOOMKiller",
    "memory.swappiness": "memory.swappiness",
}


def _cpuset_ok(text):
    """'0-3,8': numbers and ranges (no `re`: off OCI create's import path,
    tests/unit/test_oci_fastjson.py)."""
    for part in text.split(","):
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or not lo.isascii() or (dash and not (hi.isdigit() and hi.isascii())):
            return False
    return True


def _pagesize_ok(size):
    return (isinstance(size, str) and len(size) > 2 and size[-2:] in ("KB", "MB", "GB")
            and size[:-2].isdigit() and size[:-2].isascii())


def option(name):
    """The option behind interface file `name`."""
    if name.startswith("hugetlb."):
        return f"hugepage limit {name.split('.')[1]}"
    return OPTION.get(name, name)


class Limits:
    """Raw values; files(version) validates them."""
    __slots__ = ("memory", "memory_swap", "pids", "cpus", "memory_reservation", "cpu_shares",
                 "cpu_quota", "cpu_period", "cpuset_cpus", "cpuset_mems", "blkio_weight",
                 "hugetlb", "oom_kill_disable", "swappiness")

    def __init__(self, memory=None, memory_swap=None, pids=None, cpus=None, **more):
        self.memory, self.memory_swap, self.pids, self.cpus = memory, memory_swap, pids, cpus
        for name in self.__slots__[4:]:
            setattr(self, name, more.pop(name, None))
        if more:
            raise TypeError(f"unknown limits {sorted(more)}")
        self.hugetlb = list(self.hugetlb or ())

    def empty(self):
        return all(getattr(self, n) in (None, [], False) for n in self.__slots__)

    def controllers(self):
        """The controllers these limits need (v1 names; io is blkio)."""
        return list(dict.fromkeys(c if c != "io" else "blkio"
                                  for c, _, _ in self.files(2) + self.files(1)))

    def files(self, version=2, current=None):
        """[(controller, file, value)] for cgroup `version`.  current(file):
        the leaf's present value, for a setting given in part (`update
        --cpu-period` alone keeps the quota); None at creation."""
        v1 = version == 1
        out = []
        mem = _size("--memory", self.memory) if self.memory is not None else None
        if mem is not None:
            if mem != "max" and mem < 6 << 20:
                raise UsageError(f"--memory {self.memory}: below the 6 MiB minimum",
                                 hint="give at least 6m; a smaller limit OOM-kills the command at start")
            out.append(("memory", "memory.limit_in_bytes" if v1 else "memory.max", _v(mem, v1)))
        if self.memory_swap is not None:
            total = _size("--memory-swap", self.memory_swap)
            if total == "max":
                swap = "max"
            elif mem is None or mem == "max":
                raise UsageError(f"--memory-swap {self.memory_swap}: needs --memory",
                                 hint="--memory-swap is memory plus swap together; set --memory too")
            elif total < mem:
                raise UsageError(
                    f"--memory-swap {self.memory_swap}: smaller than --memory {self.memory}",
                    hint="--memory-swap counts memory plus swap; equal to --memory means no swap")
            else:
                swap = total - mem
            if v1:
                out.append(("memory", "memory.memsw.limit_in_bytes", _v(total, v1)))
            else:
                out.append(("memory", "memory.swap.max", str(swap)))
        if self.memory_reservation is not None:
            res = _size("--memory-reservation", self.memory_reservation)
            out.append(("memory", "memory.soft_limit_in_bytes" if v1 else "memory.low",
                        _v(res, v1)))
        if self.oom_kill_disable and v1:
            out.append(("memory", "memory.oom_control", "1"))
        if self.swappiness is not None and v1:
            out.append(("memory", "memory.swappiness", str(self.swappiness)))
        if self.pids is not None:
            out.append(("pids", "pids.max", _pids(self.pids)))
        out += self._cpu(v1, current)
        for opt, name in (("--cpuset-cpus", "cpus"), ("--cpuset-mems", "mems")):
            val = getattr(self, f"cpuset_{name}")
            if val is not None:
                val = str(val).strip()
                if not _cpuset_ok(val):
                    raise UsageError(f"{opt} {val}: not a list of numbers",
                                     hint="give numbers and ranges such as 0-3,8")
                out.append(("cpuset", f"cpuset.{name}", val))
        if self.blkio_weight is not None:
            w = _int("--blkio-weight", self.blkio_weight, 10, 1000)
            out.append(("blkio", "blkio.weight", str(w)) if v1 else
                       ("io", "io.weight", f"default {w}"))
        for size, limit in self.hugetlb:
            if not _pagesize_ok(size):
                raise UsageError(f"hugepage limit {size!r}: not a page size",
                                 hint="give a size such as 2MB or 1GB")
            lim = _size(f"hugepage limit {size}", limit)
            out.append(("hugetlb", f"hugetlb.{size}.{'limit_in_bytes' if v1 else 'max'}",
                        _v(lim, v1)))
        return out

    def _cpu(self, v1, current):
        out = []
        quota = period = None
        if self.cpus is not None:
            if self.cpu_quota is not None:
                raise UsageError("--cpus and --cpu-quota: give one of them",
                                 hint="--cpus N is --cpu-quota N*100000 --cpu-period 100000")
            quota, period = _cpus(self.cpus)
        if self.cpu_quota is not None:
            q = _int("--cpu-quota", self.cpu_quota, -1, 1 << 62)
            if 0 <= q < 1000:
                raise UsageError(f"--cpu-quota {self.cpu_quota}: below 1000 microseconds",
                                 hint="give at least 1000, or -1 for no limit")
            quota = "max" if q == -1 else q
        if self.cpu_period is not None:
            period = _int("--cpu-period", self.cpu_period, 1000, 1000000)
        if quota is not None or period is not None:
            if v1:
                if period is not None:
                    out.append(("cpu", "cpu.cfs_period_us", str(period)))
                if quota is not None:
                    out.append(("cpu", "cpu.cfs_quota_us", "-1" if quota == "max" else str(quota)))
            else:
                now = (current("cpu.max") if current else "").split()
                if quota is None:
                    quota = now[0] if now else "max"
                if period is None:
                    period = now[1] if len(now) > 1 else PERIOD
                out.append(("cpu", "cpu.max", f"{quota} {period}"))
        if self.cpu_shares is not None:
            s = _int("--cpu-shares", self.cpu_shares, 2, 262144)
            out.append(("cpu", "cpu.shares", str(s)) if v1 else
                       ("cpu", "cpu.weight", str(1 + (s - 2) * 9999 // 262142)))
        return out


def from_oci(res, where="linux.resources"):
    """Limits from an OCI resources object (config.json's linux.resources,
    or `update -r`'s file).  Raises UsageError naming the field.  Zero or
    absent values leave a setting as it is, as runc does."""
    if not isinstance(res, dict):
        raise UsageError(f"{where}: not an object", hint="give a JSON object of resources")

    def sect(key):
        v = res.get(key)
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise UsageError(f"{where}.{key}: not an object", hint="see the OCI runtime spec")
        return v

    def num(obj, sec, key):
        v = obj.get(key)
        if v is None:
            return None
        if not isinstance(v, int) or isinstance(v, bool):
            raise UsageError(f"{where}.{sec}.{key}: not an integer ({v!r})",
                             hint="give a number of the unit the OCI runtime spec says")
        return v

    lim = Limits()
    mem = sect("memory")
    limit = num(mem, "memory", "limit")
    if limit:
        lim.memory = "max" if limit < 0 else str(limit)
    swap = num(mem, "memory", "swap")
    if swap:
        lim.memory_swap = "max" if swap < 0 else str(swap)
    resv = num(mem, "memory", "reservation")
    if resv:
        lim.memory_reservation = "max" if resv < 0 else str(resv)
    oom = mem.get("disableOOMKiller")
    if oom is not None and not isinstance(oom, bool):
        raise UsageError(f"{where}.memory.disableOOMKiller: not a boolean ({oom!r})",
                         hint="give true or false")
    lim.oom_kill_disable = bool(oom)
    swappiness = num(mem, "memory", "swappiness")
    if swappiness is not None and swappiness != -1:     # -1: unset, as runc reads it
        if not 0 <= swappiness <= 100:
            raise UsageError(f"{where}.memory.swappiness: {swappiness} is not 0 to 100",
                             hint="give a value from 0 to 100")
        lim.swappiness = swappiness
    pids = num(sect("pids"), "pids", "limit")
    if pids:
        lim.pids = "max" if pids < 0 else str(pids)
    cpu = sect("cpu")
    quota, period = num(cpu, "cpu", "quota"), num(cpu, "cpu", "period")
    if quota:
        lim.cpu_quota = quota
    if period:
        lim.cpu_period = period
    shares = num(cpu, "cpu", "shares")
    if shares:
        lim.cpu_shares = shares
    for key in ("cpus", "mems"):
        v = cpu.get(key)
        if v not in (None, ""):
            if not isinstance(v, str):
                raise UsageError(f"{where}.cpu.{key}: not a string ({v!r})",
                                 hint="give a list such as \"0-3,8\"")
            setattr(lim, f"cpuset_{key}", v)
    weight = num(sect("blockIO"), "blockIO", "weight")
    if weight:
        lim.blkio_weight = weight
    tlb = res.get("hugepageLimits")
    tlb = [] if tlb is None else tlb
    if not isinstance(tlb, list):
        raise UsageError(f"{where}.hugepageLimits: not a list", hint="see the OCI runtime spec")
    for i, ent in enumerate(tlb):
        if not isinstance(ent, dict):
            raise UsageError(f"{where}.hugepageLimits[{i}]: not an object",
                             hint="give {\"pageSize\": \"2MB\", \"limit\": N}")
        val = num(ent, f"hugepageLimits[{i}]", "limit")
        lim.hugetlb.append((ent.get("pageSize"), "max" if val is None or val < 0 else str(val)))
    return lim


def _v(val, v1):
    return "-1" if v1 and val == "max" else str(val)


def _size(opt, text):
    t = str(text).strip().lower()
    if t in ("max", "-1"):
        return "max"
    for tail in ("ib", "b"):
        if t.endswith(tail) and len(t) > len(tail):
            t = t[:-len(tail)]
            break
    mult = 1
    if t and t[-1] in "kmgt":
        mult = 1 << (10 * ("kmgt".index(t[-1]) + 1))
        t = t[:-1]
    try:
        val = float(t)
    except ValueError:
        val = -1.0
    if not t or val != val or val <= 0 or val == float("inf"):
        raise UsageError(f"{opt} {text}: not a size",
                         hint="give bytes or a number with k, m, g or t (512m, 2g), or 'max'")
    return int(val * mult)


def _int(opt, text, low, high):
    try:
        val = int(str(text).strip())
    except ValueError:
        val = low - 1
    if not low <= val <= high:
        raise UsageError(f"{opt} {text}: out of range",
                         hint=f"give a whole number from {low} to {high}")
    return val


def _pids(text):
    t = str(text).strip().lower()
    if t in ("max", "-1"):
        return "max"
    if not t.isdigit() or int(t) < 1:
        raise UsageError(f"--pids-limit {text}: not a positive number",
                         hint="give the most processes the sandbox may hold (e.g. 256), or 'max'")
    return t


def _cpus(text):
    try:
        val = float(str(text).strip())
    except ValueError:
        val = -1.0
    ncpu = os.cpu_count() or 1
    if not 0.01 <= val <= ncpu:   # the kernel's smallest quota is 1 ms per period
        raise UsageError(f"--cpus {text}: out of range",
                         hint=f"give a number of CPUs from 0.01 to {ncpu} (e.g. 1.5)")
    return round(val * PERIOD), PERIOD
