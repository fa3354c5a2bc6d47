"""cgroup filesystem facts for cgroup.py: what making and removing a leaf needs.

Everything here reads the host through a proc root (`proc`, default /proc)
and paths under the cgroup mount, so tests point it at a fake tree: any v1
controllers from <proc>/self/mountinfo and <proc>/cgroups, interface files,
the leaves a launcher killed with SIGKILL left behind, and the facts `info`
and `doctor` show.  Where a leaf goes (the cgroup2 mount, the launcher's own
cgroup, delegation, capabilities) is cgplace.py's; limits and their
interface files are cgroupres.py's."""
import errno
import os

from gpusandbox.errors import CgroupError, UsageError

# The placement facts are cgplace.py's (a launch without a leaf loads only
# that module); they are part of this module's API for cgroup.py, cgempty.py,
# cgroupv1.py and cgroupupdate.py.
from .cgplace import (  # noqa: F401
    _read, _mounts, _cgroup2, cgroup2_mount, _own_cgroups, _privileged, _writable,
    _resolve_parent, unwritable)


def __getattr__(name):
    """Limits and _size, cgroupres's, re-exported (hpc/pod.py, siterun.py)
    and loaded when first asked: a launch without limits never does."""
    if name in ("Limits", "_size"):
        from . import cgroupres
        return getattr(cgroupres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- host facts ----------------------------------------------------------------
def _write(path, text):
    # No O_CREAT: every cgroup interface file exists; a missing one means the
    # controller or feature is absent, which the caller reports.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


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
            out["delegated"] = unwritable(pdir) is None
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
