"""Changing the limits of a running sandbox (the OCI runtime's `update`).

The same Limits and interface files as at creation (cgroupres.py): each
setting goes to the v1 leaf of its controller where the sandbox has one
(cgroupv1.py), else to its cgroup2 leaf.  A setting whose controller reaches
neither fails with one line naming the option; the settings before it stay
applied (runc's behaviour too).
"""
import errno

from gpusandbox.errors import CgroupError

from . import cgroupv1
from .cgfs import _mounts, _read, _write
from .cgroupres import option


def v1_controllers(leaves, proc="/proc"):
    """{controller: leaf} for the v1 leaves, by the hierarchy each sits in."""
    out = {}
    at = cgroupv1.hierarchies(_mounts(proc))
    for leaf in leaves:
        for ctl, (point, _) in at.items():
            if leaf.startswith(point.rstrip("/") + "/"):
                out.setdefault(ctl, leaf)
    return out


def update(path, version, v1, limits, proc="/proc"):
    """Apply `limits` to the sandbox whose main leaf is `path` (cgroup
    `version`) with v1 leaves `v1`.  Raises UsageError (a bad value) or
    CgroupError (a setting that cannot be applied); returns the lines
    written, for --debug."""
    leaves = list(v1 or ()) + ([path] if path and version == 1 else [])
    at = v1_controllers(leaves, proc)

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


class _Notes:
    def __init__(self):
        self.notes = []

    def note(self, line):
        self.notes.append(line)
