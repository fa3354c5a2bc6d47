"""The sandbox's cgroup: a v2 leaf, resource limits and the device filter.

prepare() runs in the launcher before clone3(): it creates the leaf
`<prefix>-<launcher pid>-<hex>` under the parent (by default the launcher's
own cgroup, so a Slurm job's limits still bound it), writes the limits,
and as a privileged caller attaches the BPF device program (bpfdev.py).
The launcher passes h.dirfd to clone3(CLONE_INTO_CGROUP), so the command
never runs a single instruction outside the leaf, and calls h.teardown()
at exit.

Host layout is read from a proc root (`proc`, default /proc): the cgroup2
mount comes from <proc>/self/mountinfo, so a test can point the whole module
at a fake tree.  Works on pure v2 hosts (/sys/fs/cgroup) and hybrid hosts
(v1 controllers plus cgroup2 at /sys/fs/cgroup/unified: the BPF filter and
cgroup.kill live on the v2 side; the kernel checks both the v2 programs and
the v1 devices list, security/device_cgroup.c devcgroup_check_permission).
Without any cgroup2 mount a root caller falls back to a v1 devices cgroup;
clone3 cannot place a child in a v1 cgroup, so dirfd is -1 and the launcher
must h.join(pid) before the child runs anything from the image.

Where the leaf goes (privileged or not, the cgroup2 mount, the parent, its
delegation) and the fields of the handle are cgplace.py's, shared with
cgplace.without_leaf: a launch without limits that can have no leaf ends
there and never loads this module.

A launcher killed with SIGKILL cannot remove its leaf: the reaper it forks
before creating the leaf (reaper.py) does, once the launcher is gone.  Leaves
left anyway (the reaper killed too) are removed by the next prepare() under
the same parent: name matches, launcher gone, no process inside.

Limits follow docker's options: --memory and --memory-swap take bytes with
an optional k/m/g/t suffix or 'max'; --memory-swap is memory plus swap
together, so memory.swap.max = memory-swap - memory ('max' or -1: unlimited
swap; unset: the kernel default is kept); --pids-limit; --cpus becomes
cpu.max "<cpus*100000> 100000".
"""
import errno
import os

from gpusandbox.errors import CgroupError, UsageError

from . import cgplace
from .cgfs import (  # noqa: F401 - clean_stale and status are part of this module's API
    _write, _mounts, _cgroup2, _v1_mounts,
    _v1_bound, _own_cgroups, _privileged, _mkdir,
    _words, _resolve_parent, clean_stale, _rmtree, status)
from .cgplace import NO_CGROUP2


BEST_EFFORT_OPTION = "--best-effort-limits"
KILL_WAIT = 2.0      # seconds teardown waits for killed processes to leave


# cgroupres (the limits) and cgroupv1 (their v1 leaves) are loaded only when
# a launch has limits or v1 leaves: one without limits never needs them.
def __getattr__(name):
    """Limits (cgroupres.py) is part of this module's API."""
    if name == "Limits":
        from .cgroupres import Limits
        return Limits
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def option(name):
    """The option that sets a limit file (cgroupres.option)."""
    from .cgroupres import option as of
    return of(name)


# --- the handle ------------------------------------------------------------------
class CgroupHandle(cgplace.Handle):
    """What prepare() set up (the fields and the view are cgplace.Handle's);
    teardown() undoes it."""

    @classmethod
    def restore(cls, path, version, v1=()):
        """The handle of a leaf another process made (the OCI runtime's
        `delete`), for teardown()."""
        h = cls()
        h.path, h.version, h.v1 = path, version or 2, list(v1 or ())
        return h

    def join(self, pid):
        """Move pid into the leaves it cannot be cloned into: the v1 ones,
        and the main leaf for the v1 fallback (dirfd -1) or a clone without
        CLONE_INTO_CGROUP."""
        leaves = list(self.v1)
        if self.path is not None and (self.dirfd < 0 or not self.v1):
            leaves.insert(0, self.path)
        for leaf in leaves:
            try:
                _write(f"{leaf}/cgroup.procs", str(pid))
            except OSError as e:
                raise CgroupError(f"cgroup: cannot move pid {pid} into {leaf}", e.strerror,
                                  hint="the cgroup must be writable by the launcher") from None

    def _kill_all(self, wait):
        """SIGKILL everything in the leaf; True once it is empty."""
        from . import cgempty       # only with a leaf: a rootless launch often has none
        return cgempty.empty(self.path, self.version, wait)

    def teardown(self, wait=None):
        """Kill what is left, detach and close the program, remove the leaf.
        Idempotent; never raises (problems go to notes).  wait: seconds the
        killed members may take to leave (default KILL_WAIT).  A leaf that
        cannot be emptied keeps its program attached (fail closed) and is
        left to the reaper, which waits longer, or else to the next launch's
        stale cleanup, whose rmdir makes the kernel release it."""
        if self._done:
            return
        self._done = True
        emptied = True
        if self.path is not None:
            try:
                emptied = self._kill_all(KILL_WAIT if wait is None else wait)
            except Exception as e:   # noqa: BLE001 - teardown must finish every step
                emptied = False
                self.note(f"cgroup: teardown could not empty {self.path}: {e}")
            if not emptied:
                self.note(f"cgroup: {self.path} still has processes; left for a later cleanup")
        # What is left to remove; each remove step takes its part off.
        left = {"main": self.path is not None, "v1": bool(self.v1)}
        steps = []
        if self._attached and emptied:
            steps.append(("detach", self._detach))
        steps.append(("close", self._close))
        if self.path is not None and emptied:
            steps.append(("remove", lambda: left.update(main=bool(_rmtree(self.path)))))
        if self.v1 and emptied:
            from . import cgroupv1
            steps.append(("remove the v1 leaves of",
                          lambda: left.update(v1=bool(cgroupv1.remove(self.v1)))))
        for what, fn in steps:
            try:
                fn()
            except Exception as e:   # noqa: BLE001 - teardown must finish every step
                self.note(f"cgroup: teardown could not {what} {self.path}: {e}")
        if self._reaper >= 0:
            # Last: the reaper stands by until the leaf is gone or we are.
            from gpusandbox.linux import reaper
            fd, self._reaper = self._reaper, -1
            reaper.finish(fd, self._reaper_pid, not any(left.values()))

    def _detach(self):
        from gpusandbox.linux import bpfdev
        bpfdev.detach(self._fd, self._prog_fd)
        self._attached = False

    def _close(self):
        first = None
        for name in ("dirfd", "_fd", "_prog_fd"):
            fd = getattr(self, name)
            setattr(self, name, -1)
            try:
                if fd >= 0:
                    os.close(fd)
            except OSError as e:
                first = first or e
        if first:
            raise first


# --- prepare ---------------------------------------------------------------------
def prepare(parent=None, limits=None, device_rules=None, best_effort=False,
            name_prefix="gpusandbox", verbose=None, *, proc="/proc", detached=False,
            v1_all=False, v1_parent=None, v1_path=None):
    """Create the sandbox's cgroup; see the module docstring.  Raises
    UsageError (bad limits or parent) or CgroupError; never leaves a partial
    setup behind.  detached: the leaf outlives this process (the OCI
    runtime's `create`, whose `delete` removes it), so no reaper is forked.
    v1_all, v1_parent: the OCI runtime's v1 placement (cgroupv1.plan: a
    leaf in every v1 hierarchy; v1_parent overrides `parent` there;
    v1_path, a relative cgroup path: the v1 leaves are there under v1_parent,
    made with the cgroups above them, or joined where they exist, as runc's
    cgroupsPath)."""
    h = CgroupHandle(verbose)
    h.detached = detached
    h.v1_all, h.v1_parent, h.v1_path = v1_all, v1_parent, v1_path
    try:
        _prepare(h, parent, limits, device_rules, best_effort, name_prefix, proc)
    except BaseException:
        h.teardown()
        raise
    return h


def _start_reaper(h, leaf, version, v1=()):
    """Before the leaves exist, so no moment leaves one without a remover."""
    if getattr(h, "detached", False):
        return
    from gpusandbox.linux import reaper
    h._reaper, h._reaper_pid = reaper.start(leaf, version, v1)


def _fail_or_note(h, best_effort, err):
    if not best_effort:
        raise err
    line = f"{err.line()} (continuing: {BEST_EFFORT_OPTION})"
    h.note(line)
    h.warnings.append(line)


def _make_v1(h, name, files, where, best_effort):
    if not where:
        return
    from . import cgroupv1
    cgroupv1.make(h, name, where, files, lambda err: _fail_or_note(h, best_effort, err))


def _prepare(h, parent, limits, rules, best_effort, prefix, proc):
    privileged = _privileged(proc)
    mounts = _mounts(proc)
    cg2 = _cgroup2(mounts)
    files1, where1 = [], {}
    if limits is not None or h.v1_all:      # else cgroupv1.plan has nothing to plan
        from . import cgroupv1
        files1, where1 = cgroupv1.plan(
            limits, parent if h.v1_parent is None else h.v1_parent, proc, mounts,
            pure=cg2 is None, prefix=prefix, v1_all=h.v1_all,
            notes=h.notes, fail=lambda err: _fail_or_note(h, best_effort, err),
            hint=f"or drop the option, or run without it ({BEST_EFFORT_OPTION})")
    if cg2 is None:
        return _prepare_v1(h, mounts, parent, files1, where1, rules, privileged, best_effort,
                           prefix, proc)
    v1_ctls = _v1_bound(proc) | set(_v1_mounts(mounts))
    files = [f for f in (limits.files(2) if limits is not None else [])
             if (f[0] if f[0] != "io" else "blkio") not in v1_ctls]
    mount = cg2[0]
    pdir = cgplace.leaf_parent(cg2, parent, proc)
    why = cgplace.unwritable(pdir)
    if why:
        if files:
            _fail_or_note(h, best_effort, CgroupError(
                f"cgroup: cannot create a cgroup for {', '.join(option(f) for _, f, _ in files)}",
                why, hint="run inside a delegated cgroup (systemd-run --user --scope -p Delegate=yes), "
                          f"pass --cgroup-parent naming one, or run without limits ({BEST_EFFORT_OPTION})"))
        cgplace.no_leaf(h, why, privileged, pdir)
        return
    clean_stale(pdir, prefix, proc, h.notes)
    files = _usable(h, files, pdir, mount, proc, mounts, best_effort)
    name = f"{prefix}-{os.getpid()}-{os.urandom(4).hex()}"
    leaf = os.path.join(pdir, name)
    _start_reaper(h, leaf, 2, [os.path.join(p, name) for p, *_ in where1.values()])
    _mkdir(leaf)
    h.path, h.version = leaf, 2
    h.note(f"cgroup: {leaf}")
    h._fd = os.open(leaf, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    h.dirfd = os.open(leaf, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    for ctl, name, value in files:
        try:
            _write(f"{leaf}/{name}", value)
            h.note(f"cgroup: {name} = {value}")
        except OSError as e:
            why = e.strerror
            if e.errno == errno.ENOENT and name == "memory.swap.max":
                why = "swap accounting is off (kernel built without it, or swapaccount=0)"
            _fail_or_note(h, best_effort, CgroupError(
                f"cgroup: cannot set {option(name)} ({name} = {value}) in {leaf}", why,
                hint=f"drop the option, or run without it ({BEST_EFFORT_OPTION})"))
    _make_v1(h, name, files1, where1, best_effort)
    if privileged:
        _attach_bpf(h, pdir, rules)
    else:
        cgplace.rootless_filter_note(h)


def _usable(h, files, pdir, mount, proc, mounts, best_effort):
    """Keep the limit files whose controller reaches the leaf, enabling it in
    the parent's cgroup.subtree_control when needed; report the others."""
    if not files:
        return files
    v1 = _v1_bound(proc)
    v1_at = _v1_mounts(mounts)
    enabled = set(_words(f"{pdir}/cgroup.subtree_control"))
    available = set(_words(f"{pdir}/cgroup.controllers"))
    bad = {}
    for ctl in dict.fromkeys(c for c, _, _ in files):
        if ctl in enabled:
            continue
        if ctl in v1 or ctl in v1_at:
            where = v1_at.get(ctl, "a cgroup v1 hierarchy")
            bad[ctl] = (f"bound to cgroup v1 (mounted at {where}), so the cgroup2 hierarchy at "
                        f"{mount} cannot use it",
                        "boot the host with cgroup v2 only (systemd.unified_cgroup_hierarchy=1)")
        elif ctl not in available:
            bad[ctl] = (f"not delegated to {pdir} (missing from its cgroup.controllers)",
                        "ask for a cgroup with this controller delegated, or pass --cgroup-parent")
        elif pdir != mount and _words(f"{pdir}/cgroup.procs"):
            bad[ctl] = (f"cannot be enabled in {pdir}: it holds processes, and cgroup v2 enables "
                        "controllers only for children of a cgroup without processes "
                        "('no internal processes' rule)",
                        "start gpusandbox from its own cgroup and pass --cgroup-parent naming an "
                        f"empty cgroup whose cgroup.subtree_control has +{ctl}")
        else:
            try:
                _write(f"{pdir}/cgroup.subtree_control", f"+{ctl}")
                h.note(f"cgroup: enabled {ctl} in {pdir}/cgroup.subtree_control")
            except OSError as e:
                why = e.strerror
                if e.errno == errno.EBUSY:
                    why = "it holds processes ('no internal processes' rule)"
                bad[ctl] = (f"cannot be enabled in {pdir}: {why}",
                            "pass --cgroup-parent naming a cgroup with the controller enabled")
    if bad:
        what = ", ".join(f"{c} ({', '.join(dict.fromkeys(option(f) for c2, f, _ in files if c2 == c))})"
                         for c in bad)
        hints = "; ".join(dict.fromkeys(hint for _, hint in bad.values()))
        _fail_or_note(h, best_effort, CgroupError(
            f"cgroup: controller not available for the limits: {what}",
            "; ".join(f"{c}: {why}" for c, (why, _) in bad.items()),
            hint=f"{hints}; or drop the option, or run without it ({BEST_EFFORT_OPTION})"))
    return [f for f in files if f[0] not in bad]


def _attach_bpf(h, pdir, rules):
    """Load, attach with BPF_F_ALLOW_MULTI, verify by query; fail closed.

    Every failure here raises, whatever --best-effort-limits says: that option
    relaxes resource limits, while the device filter is a boundary (it is what
    keeps a root command away from other GPUs and every block device), so a
    launch without it must not start.

    Flags: a device check runs the leaf's effective programs, which include
    every ancestor program attached with BPF_F_ALLOW_MULTI whatever flags the
    leaf uses, and all must return 1 (kernel/bpf/cgroup.c
    compute_effective_progs; include/uapi/linux/bpf.h).  MULTI rather than
    none: a program attached below ours (a nested runtime) then runs in
    addition to ours and cannot replace it, and detaching ours needs our
    program fd.  An ancestor attached with BPF_F_ALLOW_OVERRIDE yields to any
    program below it; that is checked and refused."""
    from gpusandbox.linux import bpfdev
    try:
        insns = bpfdev.assemble(list(bpfdev.DEFAULT_RULES) + list(rules or ()))
    except ValueError as e:
        raise CgroupError("device filter: bad device rule", str(e)) from None
    try:
        h._prog_fd = bpfdev.load(insns)
    except bpfdev.LoadError as e:
        log = " | ".join(e.log.strip().splitlines()[-12:]) or "no verifier log"
        hint = f"verifier log: {log}"
        if e.errno == errno.EPERM:
            hint = "loading needs CAP_SYS_ADMIN (or CAP_BPF) in the initial user namespace"
        err = CgroupError(f"device filter: the kernel refused the BPF program ({len(insns)} insns)",
                          e.strerror, hint=hint)
        err.log = e.log
        raise err
    h.prog_id = bpfdev.prog_id(h._prog_fd)
    try:
        bpfdev.attach(h._fd, h._prog_fd, bpfdev.BPF_F_ALLOW_MULTI)
    except OSError as e:
        hint = "check the kernel has CONFIG_CGROUP_BPF"
        if e.errno == errno.EPERM:
            hint = (f"either an ancestor of {pdir} has a device program attached without "
                    "BPF_F_ALLOW_MULTI/OVERRIDE, which forbids programs below it, or the "
                    "launcher lacks CAP_NET_ADMIN")
        raise CgroupError(f"device filter: cannot attach to {h.path}", e.strerror,
                          hint=hint) from None
    h._attached = True
    _, own = bpfdev.query(h._fd)
    _, eff = bpfdev.query(h._fd, effective=True)
    if h.prog_id not in own or h.prog_id not in eff:
        raise CgroupError(f"device filter: program {h.prog_id} is not in force on {h.path}",
                          f"attached {own}, effective {eff}",
                          hint="another tool changed the cgroup's programs; retry")
    pfd = os.open(pdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _, above = bpfdev.query(pfd, effective=True)
    finally:
        os.close(pfd)
    lost = [i for i in above if i not in eff]
    if lost:
        raise CgroupError(
            f"device filter: attaching below {pdir} would disable its device program(s) {lost}",
            "they were attached with BPF_F_ALLOW_OVERRIDE and yield to any program below",
            hint="choose another --cgroup-parent")
    h.filter = "bpf"
    h.note(f"device filter: BPF program id {h.prog_id} attached ({len(insns)} insns)")


def _prepare_v1(h, mounts, parent, files, where, rules, privileged, best_effort, prefix, proc):
    """No cgroup2 mount: the limits go to v1 leaves (_v1_plan); root gets
    the v1 devices list."""
    why = NO_CGROUP2
    name = f"{prefix}-{os.getpid()}-{os.urandom(4).hex()}"
    extra = [os.path.join(p, name) for p, *_ in where.values()]
    if not privileged:
        if extra:
            # The first v1 leaf is the one kill and teardown go through.
            _start_reaper(h, extra[0], 1, extra[1:])
            _make_v1(h, name, files, where, best_effort)
            h.path, h.version = h.v1.pop(0), 1
            h.v1_view = []      # a rootless v1 mount in the sandbox is refused anyway
            h.v1_at = {c: p for c, p in h.v1_at.items() if p != h.path}
            cgplace.rootless_filter_note(h)
        else:
            cgplace.no_leaf(h, why, False, None)
        return
    devmount = _v1_mounts(mounts).get("devices")
    if devmount is None:
        raise CgroupError("device filter: cannot be applied", why + ", nor the v1 devices controller",
                          hint="mount cgroup2 or the v1 devices hierarchy")
    own = next((p for c, p in _own_cgroups(proc).items() if "devices" in c.split(",")), "/")
    pdir = _v1_devices_parent(h, devmount, own, parent)
    clean_stale(pdir, prefix, proc, h.notes)
    leaf = os.path.join(pdir, name)
    from gpusandbox.linux import bpfdev
    try:
        lines = bpfdev.v1_lines(list(bpfdev.DEFAULT_RULES) + list(rules or ()))
    except ValueError as e:
        raise CgroupError("device filter: bad device rule", str(e)) from None
    _start_reaper(h, leaf, 1, extra)
    _mkdir(leaf)
    h.path, h.version = leaf, 1
    h.note(f"cgroup: {leaf} (cgroup v1 devices; {why})")
    try:
        _write(f"{leaf}/devices.deny", "a")
        for line in lines:
            _write(f"{leaf}/devices.allow", line)
    except OSError as e:
        raise CgroupError(f"device filter: cannot write the devices list of {leaf}", e.strerror,
                          hint="the parent devices cgroup must allow these devices") from None
    h.filter = "v1"
    h.note(f"device filter: cgroup v1 devices list ({len(lines)} rules)")
    _make_v1(h, name, files, where, best_effort)


def _v1_devices_parent(h, devmount, own, parent):
    """The devices leaf's parent: as the other v1 leaves' (h.v1_parent, the
    first candidate that exists), else `parent` or the launcher's own."""
    for cand in h.v1_parent or ():
        try:
            return _resolve_parent(devmount, "/", own, cand)
        except UsageError:
            continue
    return _resolve_parent(devmount, "/", own, parent)
