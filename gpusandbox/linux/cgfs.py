"""cgroup filesystem facts and limit values, for cgroup.py.

Everything here reads the host through a proc root (`proc`, default /proc)
and paths under the cgroup mount, so tests point it at a fake tree: the
cgroup2 mount and any v1 controllers from <proc>/self/mountinfo, the
launcher's own cgroup, delegation, capabilities, and the leaves a launcher
killed with SIGKILL left behind.  Limits and their interface files are
cgroupres.py's."""
import errno
import os

from gpusandbox.errors import CgroupError, UsageError
from gpusandbox.linux import host
from gpusandbox.linux.sys import read_file

_CAP_NET_ADMIN, _CAP_SYS_ADMIN, _CAP_BPF = 12, 21, 39


def __getattr__(name):
    """Limits and _size, cgroupres's, re-exported (hpc/pod.py, siterun.py)
    and loaded when first asked: a launch without limits never does."""
    if name in ("Limits", "_size"):
        from . import cgroupres
        return getattr(cgroupres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- host facts ----------------------------------------------------------------
def _read(path):
    return read_file(path).decode("utf-8", "replace")


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


def cgroup2_mount(proc="/proc"):
    """Where this process sees the cgroup2 hierarchy, or None; OSError when
    mountinfo cannot be read."""
    found = _cgroup2(_mounts(proc))
    return found[0] if found else None


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
    except OSError:
        return False
    if not host.initial_userns(proc):
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
