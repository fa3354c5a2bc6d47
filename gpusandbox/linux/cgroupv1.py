"""A sandbox's cgroup v1 leaves, for the limits of controllers bound to cgroup v1.

On a hybrid host (v1 controllers under /sys/fs/cgroup/<ctrl>, cgroup2 at
/sys/fs/cgroup/unified without controllers) and a pure v1 host, memory, pids,
cpu, cpuset, blkio and hugetlb limits live in v1 hierarchies: cgroup.py makes
one leaf per hierarchy the limits need (cpu,cpuacct co-mounted: one leaf),
named as the v2 leaf, under the launcher's own cgroup of that hierarchy or
--cgroup-parent resolved in it, and writes the v1 files there
(cgroupres.py's table).  clone3 cannot place a child in a v1 cgroup, so the
launcher moves the init in by pid (CgroupHandle.join) before it lets it run
anything.  The leaves are removed with the v2 (or v1 devices) leaf, by the
launcher's teardown, `delete`, or the reaper; the next launch's stale sweep
covers each parent too.
"""
import errno
import os

from gpusandbox.errors import CgroupError, UsageError

from . import cgfs
from .cgfs import _mounts, _own_cgroups, _read, _resolve_parent, _rmtree, _v1_bound, clean_stale
from .cgroupres import option

# The controllers the OCI runtime makes a v1 leaf in (v1_all), in this order;
# devices stays with the device filter (cgroup.py).
V1_CONTROLLERS = ("memory", "pids", "cpu", "cpuset", "blkio", "hugetlb")


def hierarchies(mounts):
    """{controller: (mount point, root in the fs)} of the v1 hierarchies
    (the first mount of each)."""
    out = {}
    for point, root, fstype, opts in mounts:
        if fstype == "cgroup":
            for o in opts:
                if o not in ("rw", "ro") and "=" not in o:
                    out.setdefault(o, (point, root))
    return out


def parents(controllers, parent, proc="/proc", mounts=None):
    """({mount point: (parent dir, [controllers], [every controller of the
    hierarchy])}, {controller: why}) for the v1 controllers in `controllers`
    that are mounted; `why` says why one cannot have a leaf (not mounted,
    the parent not writable).  `parent`: as --cgroup-parent (None: the
    caller's own cgroup there), or a tuple of such, the first that exists in
    the hierarchy taken."""
    mounts = _mounts(proc) if mounts is None else mounts
    at = hierarchies(mounts)
    own = _own_cgroups(proc)
    out, bad = {}, {}
    for ctl in controllers:
        if ctl not in at:
            bad[ctl] = "no cgroup v1 hierarchy of it is mounted"
            continue
        point, root = at[ctl]
        if point in out:
            out[point][1].append(ctl)
            continue
        mine = next((p for c, p in own.items() if ctl in c.split(",")), None)
        pdir = None
        for cand in (parent if isinstance(parent, tuple) else (parent,)):
            try:
                pdir = _resolve_parent(point, root, mine, cand)
                break
            except (CgroupError, UsageError) as e:
                bad[ctl] = e.line()
        if pdir is None:
            continue
        bad.pop(ctl, None)
        if not all(cgfs._writable(f) for f in (pdir, f"{pdir}/cgroup.procs")):
            bad[ctl] = f"{pdir} is not writable by uid {os.getuid()}"
            continue
        out[point] = (pdir, [ctl], [c for c, (p, _) in at.items() if p == point])
    return out, bad


def plan(limits, parent, proc, mounts, *, pure, prefix, notes, fail, hint, v1_all=False):
    """(v1 files, {mount point: (parent, controllers, every controller of
    the hierarchy)}) for the limits whose controller is bound to cgroup v1
    (every one on a pure v1 host, `pure`).  A needed controller without a
    leaf goes to fail(CgroupError); stale leaves under each parent are
    swept.  v1_all: a leaf in every mounted, writable hierarchy of
    V1_CONTROLLERS too (the OCI runtime's, as runc's and crun's: the
    container's /sys/fs/cgroup shows them all and `update` finds them);
    otherwise `update` makes a missing one when it needs it
    (cgroupupdate.py)."""
    if limits is None and not v1_all:
        return [], {}
    at = hierarchies(mounts)
    bound = _v1_bound(proc) | set(at)
    need = [c for c in (limits.controllers() if limits is not None else [])
            if c in bound or pure]
    want = list(dict.fromkeys(need + [c for c in V1_CONTROLLERS if v1_all and c in at]))
    if not want:
        return [], {}
    where, bad = parents(want, parent, proc, mounts)
    bad = {c: why for c, why in bad.items() if c in need}
    files = limits.files(1) if limits is not None else []
    if bad:
        what = ", ".join(
            f"{c} ({', '.join(dict.fromkeys(option(f) for c2, f, _ in files if c2 == c))})"
            for c in bad)
        fail(CgroupError(
            f"cgroup: no cgroup v1 leaf for the limits: {what}",
            "; ".join(f"{c}: {why}" for c, why in bad.items()),
            hint=f"run as root or pass --cgroup-parent naming a writable cgroup; {hint}"))
    for pdir, *_ in where.values():
        clean_stale(pdir, prefix, proc, notes)
    return [f for f in files if f[0] not in bad], where


def make(h, name, where, files, fail):
    """mkdir the leaf `name` under each parent of `where` (parents()),
    recording it in h.v1 before the mkdir, and write the v1 `files` of its
    controllers; fail(CgroupError) reports a file that cannot be written."""
    for point, (pdir, ctls, every) in where.items():
        if h.v1_path:
            # The OCI runtime's cgroupsPath (runc's placement): the cgroups
            # above made as needed and left, the leaf joined if it exists.
            leaf = os.path.join(pdir, h.v1_path)
            h.v1.append(leaf)
            up = pdir
            for part in h.v1_path.split("/"):
                up = os.path.join(up, part)
                if not os.path.isdir(up):
                    cgfs._mkdir(up)
                    if "cpuset" in ctls:
                        _inherit_cpuset(up)
        else:
            leaf = os.path.join(pdir, name)
            cgfs._mkdir(leaf)
            h.v1.append(leaf)
        h.v1_view.append((os.path.basename(point), tuple(every)))
        for ctl in ctls:
            h.v1_at[ctl] = leaf
        if "cpuset" in ctls:
            _inherit_cpuset(leaf)
        h.note(f"cgroup: {leaf} (cgroup v1: {','.join(ctls)})")
        write(h, [f for f in files if f[0] in ctls], leaf, fail)


def write(h, files, leaf, fail):
    """Write v1 `files` in `leaf`.  memory.memsw.limit_in_bytes must stay at
    or above memory.limit_in_bytes at every step: a lower memory limit goes
    first, a higher one after the swap limit (the kernel refuses the other
    order with EINVAL)."""
    files = list(files)
    names = [n for _, n, _ in files]
    if "memory.memsw.limit_in_bytes" in names and "memory.limit_in_bytes" in names:
        mem = next(v for _, n, v in files if n == "memory.limit_in_bytes")
        try:
            now = int(_read(f"{leaf}/memory.limit_in_bytes").strip())
        except (OSError, ValueError):
            now = 0
        if mem == "-1" or int(mem) > now:
            files.sort(key=lambda f: f[1] != "memory.memsw.limit_in_bytes")
    for ctl, name, value in files:
        if name == "blkio.weight" and not os.path.exists(f"{leaf}/{name}") \
                and os.path.exists(f"{leaf}/blkio.bfq.weight"):
            name = "blkio.bfq.weight"
        try:
            cgfs._write(f"{leaf}/{name}", value)
            h.note(f"cgroup: {name} = {value}")
        except OSError as e:
            why = e.strerror
            if e.errno == errno.ENOENT:
                why = f"{leaf} has no {name}"
                if name.startswith("memory.memsw"):
                    why = "swap accounting is off (kernel built without it, or swapaccount=0)"
                elif name.startswith("blkio."):
                    why = ("the host's block I/O scheduler has no weight (neither blkio.weight "
                           "nor blkio.bfq.weight)")
            fail(CgroupError(f"cgroup: cannot set {option(name)} ({name} = {value}) in {leaf}",
                             why, hint="drop the option"))


def _inherit_cpuset(leaf):
    """A new v1 cpuset cgroup starts with empty cpus and mems, and no task
    can join it so: copy the nearest ancestor's (cgroup.clone_children does
    this only when set in the parent)."""
    for name in ("cpuset.cpus", "cpuset.mems"):
        try:
            if _read(f"{leaf}/{name}").strip():
                continue
            up = os.path.dirname(leaf)
            val = ""
            while not val and up != "/":
                val = _read(f"{up}/{name}").strip()
                up = os.path.dirname(up)
            if val:
                cgfs._write(f"{leaf}/{name}", val)
        except OSError:
            pass


def remove(leaves):
    """rmdir each v1 leaf (empty by now: its members are those of the main
    leaf, already emptied); the first error is raised after trying all."""
    first = None
    for leaf in leaves:
        try:
            _rmtree(leaf)
        except OSError as e:
            first = first or e
    if first:
        raise first
