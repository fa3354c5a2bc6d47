"""Where a sandbox's cgroup leaf would go, and the handle a launch holds.

The decision every launch makes before clone3(): is the caller privileged
(bpf() in the initial user namespace), where is the cgroup2 mount (from
<proc>/self/mountinfo), which cgroup is the launcher's own, which directory
the leaf goes under (--cgroup-parent or the launcher's own), and can the
launcher write there.  A rootless launch without limits on a host whose
cgroup is not delegated to the caller ends here (without_leaf): a handle
with no leaf and the notes saying why, and neither cgroup.py (leaf making,
limits, the BPF filter, v1) nor cgfs.py (stale leaves, v1 facts, status) is
loaded.  Every other launch goes on to cgroup.prepare(), which uses the same
pieces from here.

Everything reads the host through a proc root (`proc`, default /proc), so a
test points it at a fake tree."""
import os

from gpusandbox.errors import CgroupError, UsageError
from gpusandbox.linux import host
from gpusandbox.linux.sys import read_file

_CAP_NET_ADMIN, _CAP_SYS_ADMIN, _CAP_BPF = 12, 21, 39

NO_CGROUP2 = "no cgroup2 filesystem is mounted (no line of type cgroup2 in /proc/self/mountinfo)"


# --- host facts ----------------------------------------------------------------
def _read(path):
    return read_file(path).decode("utf-8", "replace")


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


# --- the decision ----------------------------------------------------------------
def leaf_parent(cg2, parent, proc):
    """The v2 leaf's parent directory: `parent` (--cgroup-parent) or the
    launcher's own cgroup, under the cgroup2 mount cg2 = (point, root)."""
    mount, mount_root = cg2
    return _resolve_parent(mount, mount_root, _own_cgroups(proc).get(""), parent)


def unwritable(pdir):
    """Why the launcher cannot make a leaf under pdir (its directory,
    cgroup.procs or cgroup.subtree_control not writable), or None."""
    missing = [f for f in (pdir, f"{pdir}/cgroup.procs", f"{pdir}/cgroup.subtree_control")
               if not _writable(f)]
    if not missing:
        return None
    return f"{', '.join(missing)} not writable by uid {os.getuid()}"


def rootless_filter_note(h):
    why = "device isolation rests on the bind-mounted nodes alone"
    if os.environ.get("SLURM_JOB_ID"):
        why += " and on the Slurm job's own device cgroup"
    h.note(f"device filter: not applied (rootless: {why})")


def no_leaf(h, why, privileged, pdir):
    """The end of a launch that gets no leaf: a note saying why; a
    privileged caller's device filter has nowhere to go, which is fatal."""
    h.note(f"cgroup: none ({why})")
    if privileged:
        raise CgroupError("device filter: no cgroup to attach it to", why,
                          hint=f"make {pdir} writable or pass --cgroup-parent")
    rootless_filter_note(h)


def without_leaf(parent=None, verbose=None, proc="/proc"):
    """What cgroup.prepare(parent) without limits gives when it makes no
    leaf: that handle, with the same notes (and the same errors: a
    privileged caller without a writable parent, a bad --cgroup-parent);
    None when prepare() would make a leaf (a writable parent, or root on a
    host without cgroup2: the v1 devices fallback)."""
    privileged = _privileged(proc)
    cg2 = _cgroup2(_mounts(proc))
    if cg2 is None:
        if privileged:
            return None
        h = Handle(verbose)
        no_leaf(h, NO_CGROUP2, False, None)
        return h
    pdir = leaf_parent(cg2, parent, proc)
    why = unwritable(pdir)
    if why is None:
        return None
    h = Handle(verbose)
    no_leaf(h, why, privileged, pdir)
    return h


# --- the handle ------------------------------------------------------------------
class Handle:
    """A launch's cgroup as the launcher holds it.  This class is the
    handle of a launch without a leaf (without_leaf); cgroup.CgroupHandle,
    what prepare() returns, adds the leaf's join and teardown."""

    def __init__(self, verbose=None):
        self.dirfd = -1          # O_PATH fd of the v2 leaf for CLONE_INTO_CGROUP
        self.path = None         # the leaf, v2 or (fallback) v1 devices
        self.notes = []
        self.warnings = []       # always shown: what the user asked for and did not get
        self.filter = None       # 'bpf' | 'v1' | None
        self.prog_id = None
        self.version = None      # 2 or 1 when a leaf exists
        self.v1 = []             # cgroup v1 leaves of the limits (cgroupv1.py)
        self.v1_at = {}          # {v1 controller: its leaf}
        self.v1_view = []        # [(directory name, controllers)] of their hierarchies
        self.v1_path = None      # the OCI runtime's cgroupsPath for them (prepare)
        self._fd = -1            # O_RDONLY fd of the leaf: bpf() refuses O_PATH fds
        self._prog_fd = -1
        self._reaper = -1        # write end of the reaper's pipe (reaper.py)
        self._reaper_pid = 0
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
        return [fd for fd in (self.dirfd, self._fd, self._prog_fd, self._reaper) if fd >= 0]

    @property
    def needs_join(self):
        """Whether the launcher must join() the init by pid: v1 leaves, or
        no dirfd for clone3(CLONE_INTO_CGROUP)."""
        return bool(self.v1) or bool(self.dirfd < 0 and self.path)

    def view(self):
        """What the sandbox's /sys/fs/cgroup shows (plan.own_cgroup, for
        stages/sysmounts.py): False (none of its own), True (its cgroup2
        leaf), or [(name, controllers)] of its v1 hierarchies, with
        ("unified", None) for its cgroup2 leaf beside them (hybrid)."""
        if not self.v1_view:
            return self.version == 2 and self.dirfd >= 0
        view = list(self.v1_view)
        if self.version == 2 and self.dirfd >= 0:
            view.append(("unified", None))
        return view

    def teardown(self, wait=None):
        """Nothing was made: no leaf, no program, no reaper, no fd."""
        self._done = True
