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

A launcher killed with SIGKILL leaves its leaf behind; the next prepare()
under the same parent removes leaves whose name matches, whose launcher is
gone and which hold no process.

Limits follow docker's options: --memory and --memory-swap take bytes with
an optional k/m/g/t suffix or 'max'; --memory-swap is memory plus swap
together, so memory.swap.max = memory-swap - memory ('max' or -1: unlimited
swap; unset: the kernel default is kept); --pids-limit; --cpus becomes
cpu.max "<cpus*100000> 100000".
"""
import errno
import os

from gpusandbox.errors import CgroupError, UsageError

BEST_EFFORT_OPTION = "--best-effort-limits"
_PERIOD = 100000
KILL_WAIT = 2.0      # seconds teardown waits for killed processes to leave
_CAP_NET_ADMIN, _CAP_SYS_ADMIN, _CAP_BPF = 12, 21, 39
# The launcher's option behind each interface file, for messages.
OPTION = {"memory.max": "--memory", "memory.swap.max": "--memory-swap",
          "pids.max": "--pids-limit", "cpu.max": "--cpus"}


# --- limits ------------------------------------------------------------------
class Limits:
    """Raw option strings; files() validates them (UsageError) and returns
    [(controller, file, value)] to write into the leaf."""
    __slots__ = ("memory", "memory_swap", "pids", "cpus")

    def __init__(self, memory=None, memory_swap=None, pids=None, cpus=None):
        self.memory, self.memory_swap, self.pids, self.cpus = memory, memory_swap, pids, cpus

    def files(self):
        out = []
        mem = _size("--memory", self.memory) if self.memory is not None else None
        if mem is not None:
            if mem != "max" and mem < 6 << 20:
                raise UsageError(f"--memory {self.memory}: below the 6 MiB minimum",
                                 hint="give at least 6m; a smaller limit OOM-kills the command at start")
            out.append(("memory", "memory.max", str(mem)))
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
            out.append(("memory", "memory.swap.max", str(swap)))
        if self.pids is not None:
            out.append(("pids", "pids.max", _pids(self.pids)))
        if self.cpus is not None:
            out.append(("cpu", "cpu.max", _cpus(self.cpus)))
        return out


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
    return f"{round(val * _PERIOD)} {_PERIOD}"


# --- host facts ----------------------------------------------------------------
def _read(path):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            b = os.read(fd, 65536)
            if not b:
                return b"".join(chunks).decode("utf-8", "replace")
            chunks.append(b)
    finally:
        os.close(fd)


def _write(path, text):
    # No O_CREAT: every cgroup interface file exists; a missing one means the
    # controller or feature is absent, which the caller reports.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _unescape(field):
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts(proc):
    """[(mount point, root in the fs, fstype, super options)] from mountinfo."""
    out = []
    for line in _read(f"{proc}/self/mountinfo").splitlines():
        left, sep, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if sep and len(a) >= 5 and len(b) >= 3:
            out.append((_unescape(a[4]), _unescape(a[3]), b[0], b[2].split(",")))
    return out


def _cgroup2(mounts):
    for point, root, fstype, _ in mounts:
        if fstype == "cgroup2":
            return point, root
    return None


def _v1_mounts(mounts):
    """{controller: mount point} of the cgroup v1 hierarchies."""
    out = {}
    for point, _, fstype, opts in mounts:
        if fstype == "cgroup":
            for o in opts:
                if o not in ("rw", "ro") and "=" not in o:
                    out.setdefault(o, point)
    return out


def _v1_bound(proc):
    """Controllers bound to a v1 hierarchy (non-zero hierarchy id in
    /proc/cgroups): the kernel will not let cgroup2 use them."""
    out = set()
    try:
        text = _read(f"{proc}/cgroups")
    except OSError:
        return out
    for line in text.splitlines():
        f = line.split()
        if len(f) == 4 and not line.startswith("#") and f[1] != "0" and f[3] == "1":
            out.add(f[0])
    return out


def _own_cgroups(proc):
    """{controllers field: path} from /proc/self/cgroup ('' is the v2 line)."""
    out = {}
    for line in _read(f"{proc}/self/cgroup").splitlines():
        hid, _, rest = line.partition(":")
        ctl, _, path = rest.partition(":")
        out[ctl if hid != "0" else ""] = path
    return out


def _privileged(proc):
    """Whether bpf(BPF_PROG_LOAD/ATTACH) of a device program can succeed:
    CAP_SYS_ADMIN, or CAP_BPF with CAP_NET_ADMIN, in the initial user
    namespace (capabilities in a child user namespace do not count for bpf)."""
    try:
        status = _read(f"{proc}/self/status")
        uid_map = _read(f"{proc}/self/uid_map").split()
    except OSError:
        return False
    if uid_map != ["0", "0", "4294967295"]:
        return False
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            caps = int(line.split()[1], 16)
            return bool(caps >> _CAP_SYS_ADMIN & 1
                        or (caps >> _CAP_BPF & 1 and caps >> _CAP_NET_ADMIN & 1))
    return False


def _writable(path):
    return os.access(path, os.W_OK)


def _mkdir(path):
    os.mkdir(path, 0o755)


def _rmdir(path):
    os.rmdir(path)


def _words(path):
    try:
        return _read(path).split()
    except OSError:
        return []


def _populated(path):
    """True unless the cgroup is known to hold no process (v2 cgroup.events,
    else v1: no pid in cgroup.procs of it or any child)."""
    try:
        for line in _read(f"{path}/cgroup.events").splitlines():
            if line.startswith("populated "):
                return line.split()[1] != "0"
    except FileNotFoundError:
        pass
    except OSError:
        return True
    try:
        for top, dirs, _ in os.walk(path):
            if _words(f"{top}/cgroup.procs"):
                return True
    except OSError:
        return True
    return False


def _resolve_parent(mount, mount_root, own, parent, opt="--cgroup-parent"):
    """The parent directory of the leaf: `parent` as an absolute path under
    the mount, else as a cgroup path relative to the mount (with or without
    the leading / of /proc/<pid>/cgroup); by default the launcher's own."""
    if parent is None:
        if own is None:
            raise CgroupError("cgroup: the launcher's cgroup is unknown",
                              f"{mount} is mounted but /proc/self/cgroup has no line for it",
                              hint=f"pass {opt} with a path under {mount}")
        rel = own
        if mount_root not in ("/", "") and (own + "/").startswith(mount_root.rstrip("/") + "/"):
            rel = own[len(mount_root.rstrip("/")):]
        elif mount_root not in ("/", ""):
            raise CgroupError(f"cgroup: the launcher's cgroup {own} is not visible",
                              f"{mount} shows only {mount_root}",
                              hint=f"pass {opt} with a path under {mount}")
    elif parent == mount or parent.startswith(mount.rstrip("/") + "/"):
        rel = parent[len(mount):]
    else:
        # Relative, or absolute as /proc/<pid>/cgroup prints it ("0::/a/b").
        rel = parent
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UsageError(f"{opt} {parent}: '..' is not allowed", hint=f"give a path under {mount}")
    path = os.path.join(mount, *parts)
    if not os.path.isdir(path):
        raise UsageError(f"{opt} {parent or own}: no such cgroup ({path})",
                         hint="create it first or name an existing cgroup")
    return path


def _leaf_pid(name, prefix):
    if not name.startswith(prefix + "-"):
        return None
    pid, _, tag = name[len(prefix) + 1:].partition("-")
    hexd = "0123456789abcdef"
    if not pid.isdigit() or not tag or any(c not in hexd for c in tag):
        return None
    return int(pid)


def _is_launcher(argv):
    for a in argv[:4]:
        if os.path.basename(a).startswith(b"gpusandbox") or b"/gpusandbox/" in a:
            return True
    return False


def _start_time(pid, proc):
    """Wall-clock start of a process (boot time + starttime ticks), or None."""
    try:
        fields = _read(f"{proc}/{pid}/stat").rpartition(")")[2].split()
        for line in _read(f"{proc}/stat").splitlines():
            if line.startswith("btime "):
                return int(line.split()[1]) + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        pass
    return None


def _launcher_gone(pid, path, proc):
    """A leaf's launcher is gone when its pid is dead, or when the pid now
    belongs to a process that is no gpusandbox launcher AND started after
    the leaf was made (a live process that predates the leaf is its creator,
    whatever its argv: e.g. a test runner that calls prepare() itself)."""
    try:
        argv = _read(f"{proc}/{pid}/cmdline").encode().split(b"\0")
    except OSError:
        return True
    if _is_launcher(argv):
        return False
    started = _start_time(pid, proc)
    try:
        made = os.stat(path).st_ctime
    except OSError:
        return False
    return started is not None and started > made + 1


def clean_stale(pdir, prefix, proc="/proc", notes=None):
    """rmdir leaves of launchers killed before their teardown (kill -9):
    name matches, launcher gone, no process inside.  The kernel releases the
    BPF programs of a removed cgroup (cgroup_bpf_offline on destruction)."""
    removed = []
    try:
        names = os.listdir(pdir)
    except OSError:
        return removed
    me = os.getpid()
    for name in names:
        pid = _leaf_pid(name, prefix)
        path = os.path.join(pdir, name)
        if pid is None or pid == me or not _launcher_gone(pid, path, proc) or _populated(path):
            continue
        try:
            _rmtree(path)
        except OSError:
            continue
        removed.append(path)
        if notes is not None:
            notes.append(f"cgroup: removed stale {path}")
    return removed


def _rmtree(path, wait=1.0):
    """rmdir a cgroup and the (empty) cgroups below it, deepest first;
    EBUSY is retried briefly: the last exiting task may still be leaving."""
    import time
    subdirs = [top for top, _, _ in os.walk(path)]
    deadline = time.monotonic() + wait
    for d in reversed(subdirs):
        while True:
            try:
                _rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.005)


# --- the handle ------------------------------------------------------------------
class CgroupHandle:
    """What prepare() set up; teardown() undoes it."""

    def __init__(self, verbose=None):
        self.dirfd = -1          # O_PATH fd of the v2 leaf for CLONE_INTO_CGROUP
        self.path = None         # the leaf, v2 or (fallback) v1 devices
        self.notes = []
        self.warnings = []       # always shown: what the user asked for and did not get
        self.filter = None       # 'bpf' | 'v1' | None
        self.prog_id = None
        self.version = None      # 2 or 1 when a leaf exists
        self._fd = -1            # O_RDONLY fd of the leaf: bpf() refuses O_PATH fds
        self._prog_fd = -1
        self._attached = False
        self._done = False
        self._verbose = verbose

    def note(self, line):
        self.notes.append(line)
        if self._verbose:
            self._verbose(line)

    @property
    def fds(self):
        """Open fds the sandbox's init must close before running anything
        from the image (all are O_CLOEXEC; this matters only before execve)."""
        return [fd for fd in (self.dirfd, self._fd, self._prog_fd) if fd >= 0]

    def join(self, pid):
        """Move pid into the leaf (for the v1 fallback, where dirfd is -1,
        or a clone without CLONE_INTO_CGROUP)."""
        if self.path is None:
            return
        try:
            _write(f"{self.path}/cgroup.procs", str(pid))
        except OSError as e:
            raise CgroupError(f"cgroup: cannot move pid {pid} into {self.path}", e.strerror,
                              hint="the cgroup must be writable by the launcher") from None

    def _kill_all(self):
        """SIGKILL everything in the leaf; True once it is empty."""
        import time
        wait = KILL_WAIT
        path = self.path
        killer = f"{path}/cgroup.kill"
        use_kill_file = self.version == 2 and os.path.exists(killer)
        if use_kill_file:
            _write(killer, "1")    # SIGKILL to the whole subtree at once (5.14+)
        deadline = time.monotonic() + wait
        while _populated(path):
            if time.monotonic() > deadline:
                return False
            if not use_kill_file:
                _kill_listed(path)
            time.sleep(0.005)
        return True

    def teardown(self):
        """Kill what is left, detach and close the program, remove the leaf.
        Idempotent; never raises (problems go to notes).  A leaf that cannot
        be emptied keeps its program attached (fail closed) and stays for the
        next launch's stale cleanup, whose rmdir makes the kernel release it."""
        if self._done:
            return
        self._done = True
        emptied = True
        if self.path is not None:
            try:
                emptied = self._kill_all()
            except Exception as e:   # noqa: BLE001 - teardown must finish every step
                emptied = False
                self.note(f"cgroup: teardown could not empty {self.path}: {e}")
            if not emptied:
                self.note(f"cgroup: {self.path} still has processes; left for a later cleanup")
        steps = []
        if self._attached and emptied:
            steps.append(("detach", self._detach))
        steps.append(("close", self._close))
        if self.path is not None and emptied:
            steps.append(("remove", lambda: _rmtree(self.path)))
        for what, fn in steps:
            try:
                fn()
            except Exception as e:   # noqa: BLE001 - teardown must finish every step
                self.note(f"cgroup: teardown could not {what} {self.path}: {e}")

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


def _kill_pid(pid):
    try:
        os.kill(pid, 9)
    except OSError:
        pass


# --- prepare ---------------------------------------------------------------------
def prepare(parent=None, limits=None, device_rules=None, best_effort=False,
            name_prefix="gpusandbox", verbose=None, *, proc="/proc"):
    """Create the sandbox's cgroup; see the module docstring.  Raises
    UsageError (bad limits or parent) or CgroupError; never leaves a partial
    setup behind."""
    h = CgroupHandle(verbose)
    try:
        _prepare(h, parent, limits, device_rules, best_effort, name_prefix, proc)
    except BaseException:
        h.teardown()
        raise
    return h


def _fail_or_note(h, best_effort, err):
    if not best_effort:
        raise err
    line = f"{err.line()} (continuing: {BEST_EFFORT_OPTION})"
    h.note(line)
    h.warnings.append(line)


def _rootless_filter_note(h):
    why = "device isolation rests on the bind-mounted nodes alone"
    if os.environ.get("SLURM_JOB_ID"):
        why += " and on the Slurm job's own device cgroup"
    h.note(f"device filter: not applied (rootless: {why})")


def _prepare(h, parent, limits, rules, best_effort, prefix, proc):
    files = limits.files() if limits is not None else []
    privileged = _privileged(proc)
    mounts = _mounts(proc)
    cg2 = _cgroup2(mounts)
    if cg2 is None:
        return _prepare_v1(h, mounts, parent, files, rules, privileged, best_effort, prefix, proc)
    mount, mount_root = cg2
    pdir = _resolve_parent(mount, mount_root, _own_cgroups(proc).get(""), parent)
    missing = [f for f in (pdir, f"{pdir}/cgroup.procs", f"{pdir}/cgroup.subtree_control")
               if not _writable(f)]
    if missing:
        why = f"{', '.join(missing)} not writable by uid {os.getuid()}"
        if files:
            _fail_or_note(h, best_effort, CgroupError(
                f"cgroup: cannot create a cgroup for {', '.join(OPTION[f] for _, f, _ in files)}",
                why, hint="run inside a delegated cgroup (systemd-run --user --scope -p Delegate=yes), "
                          f"pass --cgroup-parent naming one, or run without limits ({BEST_EFFORT_OPTION})"))
        h.note(f"cgroup: none ({why})")
        if privileged:
            _fail_or_note(h, best_effort, CgroupError(
                "device filter: no cgroup to attach it to", why,
                hint=f"make {pdir} writable or pass --cgroup-parent"))
        else:
            _rootless_filter_note(h)
        return
    clean_stale(pdir, prefix, proc, h.notes)
    files = _usable(h, files, pdir, mount, proc, mounts, best_effort)
    leaf = os.path.join(pdir, f"{prefix}-{os.getpid()}-{os.urandom(4).hex()}")
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
                f"cgroup: cannot set {OPTION[name]} ({name} = {value}) in {leaf}", why,
                hint=f"drop the option, or run without it ({BEST_EFFORT_OPTION})"))
    if privileged:
        _attach_bpf(h, pdir, rules, best_effort)
    else:
        _rootless_filter_note(h)


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
        what = ", ".join(f"{c} ({', '.join(OPTION[f] for c2, f, _ in files if c2 == c)})"
                         for c in bad)
        hints = "; ".join(dict.fromkeys(hint for _, hint in bad.values()))
        _fail_or_note(h, best_effort, CgroupError(
            f"cgroup: controller not available for the limits: {what}",
            "; ".join(f"{c}: {why}" for c, (why, _) in bad.items()),
            hint=f"{hints}; or drop the option, or run without it ({BEST_EFFORT_OPTION})"))
    return [f for f in files if f[0] not in bad]


def _attach_bpf(h, pdir, rules, best_effort):
    """Load, attach with BPF_F_ALLOW_MULTI, verify by query; fail closed.

    Flags: a device check runs the leaf's effective programs, which include
    every ancestor program attached with BPF_F_ALLOW_MULTI whatever flags the
    leaf uses, and all must return 1 (kernel/bpf/cgroup.c
    compute_effective_progs; include/uapi/linux/bpf.h).  MULTI rather than
    none: a program attached below ours (a nested runtime) then runs in
    addition to ours and cannot replace it, and detaching ours needs our
    program fd.  An ancestor attached with BPF_F_ALLOW_OVERRIDE yields to any
    program below it; that is checked and refused (best effort: noted)."""
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
        return _fail_or_note(h, best_effort, err)
    h.prog_id = bpfdev.prog_id(h._prog_fd)
    try:
        bpfdev.attach(h._fd, h._prog_fd, bpfdev.BPF_F_ALLOW_MULTI)
    except OSError as e:
        hint = "check the kernel has CONFIG_CGROUP_BPF"
        if e.errno == errno.EPERM:
            hint = (f"either an ancestor of {pdir} has a device program attached without "
                    "BPF_F_ALLOW_MULTI/OVERRIDE, which forbids programs below it, or the "
                    "launcher lacks CAP_NET_ADMIN")
        return _fail_or_note(h, best_effort, CgroupError(
            f"device filter: cannot attach to {h.path}", e.strerror, hint=hint))
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
        _fail_or_note(h, best_effort, CgroupError(
            f"device filter: attaching below {pdir} would disable its device program(s) {lost}",
            "they were attached with BPF_F_ALLOW_OVERRIDE and yield to any program below",
            hint="choose another --cgroup-parent"))
    h.filter = "bpf"
    h.note(f"device filter: BPF program id {h.prog_id} attached ({len(insns)} insns)")


def _prepare_v1(h, mounts, parent, files, rules, privileged, best_effort, prefix, proc):
    """No cgroup2 mount: limits cannot be set; root gets the v1 devices list."""
    why = "no cgroup2 filesystem is mounted (no line of type cgroup2 in /proc/self/mountinfo)"
    if files:
        _fail_or_note(h, best_effort, CgroupError(
            "cgroup: resource limits need cgroup v2", why,
            hint=f"mount cgroup2 (boot with systemd.unified_cgroup_hierarchy=1), or drop the limits"))
    if not privileged:
        h.note(f"cgroup: none ({why})")
        _rootless_filter_note(h)
        return
    devmount = _v1_mounts(mounts).get("devices")
    if devmount is None:
        return _fail_or_note(h, best_effort, CgroupError(
            "device filter: cannot be applied", why + ", nor the v1 devices controller",
            hint="mount cgroup2 or the v1 devices hierarchy"))
    own = next((p for c, p in _own_cgroups(proc).items() if "devices" in c.split(",")), "/")
    pdir = _resolve_parent(devmount, "/", own, parent)
    clean_stale(pdir, prefix, proc, h.notes)
    leaf = os.path.join(pdir, f"{prefix}-{os.getpid()}-{os.urandom(4).hex()}")
    from gpusandbox.linux import bpfdev
    try:
        lines = bpfdev.v1_lines(list(bpfdev.DEFAULT_RULES) + list(rules or ()))
    except ValueError as e:
        raise CgroupError("device filter: bad device rule", str(e)) from None
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


# --- status (info / doctor) -----------------------------------------------------------
def status(proc="/proc"):
    """Facts for `info` and `doctor`; never raises.  `error` says why the
    cgroup2 side could not be read, `bpf_why` why the filter is unavailable."""
    out = {"cgroup2": None, "hybrid": False, "own_cgroup": None, "leaf_parent": None,
           "delegated": False, "controllers": [], "controllers_v1": [], "v1_devices": None,
           "bpf_filter": False, "bpf_why": None, "error": None}
    try:
        mounts = _mounts(proc)
    except OSError as e:
        out["error"] = f"cannot read {proc}/self/mountinfo: {e.strerror}"
        return out
    v1 = _v1_mounts(mounts)
    out["controllers_v1"] = sorted(set(v1) | _v1_bound(proc))
    out["v1_devices"] = v1.get("devices")
    cg2 = _cgroup2(mounts)
    out["hybrid"] = bool(cg2 and out["controllers_v1"])
    if cg2:
        out["cgroup2"] = cg2[0]
        try:
            out["own_cgroup"] = _own_cgroups(proc).get("")
            pdir = out["leaf_parent"] = _resolve_parent(cg2[0], cg2[1], out["own_cgroup"], None)
            out["delegated"] = all(_writable(f) for f in (
                pdir, f"{pdir}/cgroup.procs", f"{pdir}/cgroup.subtree_control"))
            out["controllers"] = _words(f"{pdir}/cgroup.controllers")
        except OSError as e:
            out["error"] = e.strerror
        except (CgroupError, UsageError) as e:
            out["error"] = e.line()
    if not _privileged(proc):
        out["bpf_why"] = "needs CAP_SYS_ADMIN (or CAP_BPF and CAP_NET_ADMIN) in the initial user namespace"
    elif not cg2:
        out["bpf_why"] = "no cgroup2 mount" + (" (v1 devices fallback)" if out["v1_devices"] else "")
    else:
        from gpusandbox.linux import bpfdev
        try:
            os.close(bpfdev.load(bpfdev.assemble(bpfdev.DEFAULT_RULES)))
            out["bpf_filter"] = True
        except OSError as e:
            out["bpf_why"] = f"BPF_PROG_LOAD: {e.strerror}"
    return out
