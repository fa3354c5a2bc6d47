"""Changing the limits of a running sandbox (the OCI runtime's `update`).

The same Limits and interface files as at creation (cgroupres.py): each
setting goes to the v1 leaf of its controller where the sandbox has one
(cgroupv1.py), else to its cgroup2 leaf.  A controller bound to cgroup v1
that the sandbox has no leaf for yet (it was created without a limit of it)
gets one now: named as the main leaf, under the cgroup the sandbox's init
still sits in in that hierarchy (where `create` would have made it), and the
sandbox's processes are moved in.  A setting whose controller reaches
neither fails with one line naming the option; the settings before it stay
applied (runc's behaviour too).
"""
import errno
import os

from gpusandbox.errors import CgroupError

from . import cgfs, cgroupv1
from .cgfs import _mounts, _read, _v1_bound, _write, _words
from .cgroupres import option

MOVE_ROUNDS = 50     # passes over the members while they fork during the move


def v1_controllers(leaves, proc="/proc"):
    """{controller: leaf} for the v1 leaves, by the hierarchy each sits in."""
    out = {}
    at = cgroupv1.hierarchies(_mounts(proc))
    for leaf in leaves:
        for ctl, (point, _) in at.items():
            if leaf.startswith(point.rstrip("/") + "/"):
                out.setdefault(ctl, leaf)
    return out


def update(path, version, v1, limits, proc="/proc", pid=None, record=None):
    """Apply `limits` to the sandbox whose main leaf is `path` (cgroup
    `version`) with v1 leaves `v1` and init `pid`.  record(leaf) is called
    before a new v1 leaf is made (the caller keeps the list its teardown
    removes).  Raises UsageError (a bad value) or CgroupError (a setting that
    cannot be applied); returns the lines written."""
    leaves = list(v1 or ()) + ([path] if path and version == 1 else [])
    at = v1_controllers(leaves, proc)
    if path and pid and record is not None:
        for leaf in _new_leaves(path, at, limits, pid, proc, record):
            at.update(v1_controllers([leaf], proc))

    def current(name):
        try:
            return _read(f"{path}/{name}").strip()
        except OSError:
            return ""

    files1 = limits.files(1)
    files2 = limits.files(2, current=current if path and version == 2 else None)
    done = []

    def fail(err):
        raise err

    for ctl in limits.controllers():
        if ctl in at:
            h = _Notes()
            cgroupv1.write(h, [f for f in files1 if f[0] == ctl], at[ctl], fail)
            done += h.notes
            continue
        mine = [f for f in files2 if (f[0] if f[0] != "io" else "blkio") == ctl]
        if not path or version != 2:
            names = ", ".join(dict.fromkeys(option(n) for _, n, _ in mine))
            raise CgroupError(f"update: cannot set {names}",
                              f"the container has no cgroup with the {ctl} controller",
                              hint="create the container as root or in a delegated cgroup")
        for _, name, value in mine:
            try:
                _write(f"{path}/{name}", value)
                done.append(f"cgroup: {name} = {value}")
            except OSError as e:
                why = e.strerror
                if e.errno == errno.ENOENT:
                    why = (f"the {ctl} controller is not enabled for {path} (its parent's "
                           "cgroup.subtree_control lacks it)")
                raise CgroupError(f"update: cannot set {option(name)} ({name} = {value}) in {path}",
                                  why, hint="drop the option") from None
    return done


def _new_leaves(path, at, limits, pid, proc, record):
    """Make the v1 leaves `limits` need and the sandbox lacks; yield each."""
    mounts = _mounts(proc)
    hier = cgroupv1.hierarchies(mounts)
    bound = _v1_bound(proc) | set(hier)
    need = [c for c in limits.controllers() if c in bound and c not in at and c in hier]
    if not need:
        return
    own = {}
    try:
        for line in _read(f"{proc}/{pid}/cgroup").splitlines():
            hid, _, rest = line.partition(":")
            ctls, _, cg = rest.partition(":")
            for c in ctls.split(","):
                own[c] = cg
    except OSError as e:
        raise CgroupError(f"update: cannot read the cgroups of the container's init {pid}",
                          e.strerror) from None
    done = set()
    for ctl in need:
        point, root = hier[ctl]
        if point in done:
            continue
        done.add(point)
        rel = own.get(ctl, "/")
        if root not in ("/", "") and rel.startswith(root):
            rel = rel[len(root):]
        parent = os.path.join(point, *[p for p in rel.split("/") if p not in ("", ".", "..")])
        leaf = os.path.join(parent, os.path.basename(path))
        record(leaf)
        try:
            cgfs._mkdir(leaf)
            if ctl == "cpuset" or "cpuset" in [c for c, (p, _) in hier.items() if p == point]:
                cgroupv1._inherit_cpuset(leaf)
            _move_members(path, leaf)
        except OSError as e:
            raise CgroupError(f"update: cannot make a cgroup v1 leaf for {ctl} at {leaf}",
                              e.strerror, hint="run update as the user who created the container")
        yield leaf


def _move_members(path, leaf):
    """Move every process of the main leaf `path` (and below) into `leaf`,
    again while new ones appear (a member forking during the move)."""
    for _ in range(MOVE_ROUNDS):
        members = set()
        for top, _, _ in os.walk(path):
            members.update(_words(f"{top}/cgroup.procs"))
        inside = set(_words(f"{leaf}/cgroup.procs"))
        todo = members - inside
        if not todo:
            return
        for p in todo:
            try:
                _write(f"{leaf}/cgroup.procs", p)
            except ProcessLookupError:
                pass     # gone meanwhile
    raise OSError(errno.EAGAIN, "the container's processes kept changing during the move")


class _Notes:
    def __init__(self):
        self.notes = []

    def note(self, line):
        self.notes.append(line)
