"""User-namespace id maps: single-id maps written directly, full ranges
through the setuid helpers newuidmap/newgidmap (shadow-utils).

user_namespaces(7): an unprivileged process may write a one-line map for its
own euid/egid into a child's namespace, and the gid map only after writing
"deny" to setgroups; anything wider needs CAP_SETUID/CAP_SETGID in the parent
namespace, which is what newuidmap/newgidmap provide from /etc/subuid and
/etc/subgid.
"""
import os

from ..errors import SandboxError
# The one-id maps and the map writer are linux/sys.py's: a rootless launch
# writes its own map from init and never loads this module.
from .sys import _fmt, write_proc as _write, write_single  # noqa: F401

SUBID_HINT = ("add a range for this user to /etc/subuid and /etc/subgid "
              "(e.g. 'usermod --add-subuids 100000-165535 --add-subgids 100000-165535 USER') "
              "and install the uidmap package, or use the default --userns single")


def subid_range(user, uid, path):
    """First (start, count) range for `user`/`uid` in /etc/subuid or /etc/subgid."""
    try:
        with open(path) as f:
            for line in f:
                parts = line.strip().split(":")
                if len(parts) != 3 or parts[0] not in (user, str(uid)):
                    continue
                try:
                    return int(parts[1]), int(parts[2])
                except ValueError:
                    continue
    except OSError:
        pass
    return None


def ranges(inside, outside, sub):
    """Map `inside` -> `outside` (the caller) plus a subordinate range around it.

    Inside ids 0..count are covered: ids below `inside` and above it come from
    the subordinate range in order, so files owned by the caller inside keep
    belonging to the caller on the host."""
    start, count = sub
    out = [(inside, outside, 1)]
    below = min(inside, count)
    if below:
        out.append((0, start, below))
    rest = count - below
    if rest > 0:
        out.append((inside + 1, start + below, rest))
    return out


def write_full(pid, uid_lines, gid_lines, root):
    """Multi-range maps: root writes them directly; a user goes through
    newuidmap/newgidmap, which check /etc/subuid and /etc/subgid.  uid 0
    of a user namespace (rootless podman runs its runtime so) holds
    CAP_SETUID over the namespaces it makes, for any id its own maps."""
    if root or os.geteuid() == 0:
        _write(f"/proc/{pid}/uid_map", _fmt(uid_lines))
        _write(f"/proc/{pid}/gid_map", _fmt(gid_lines))
        return
    import subprocess
    for tool, lines in (("newuidmap", uid_lines), ("newgidmap", gid_lines)):
        argv = [tool, str(pid)] + [str(x) for line in lines for x in line]
        try:
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                               env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"})
        except FileNotFoundError:
            raise SandboxError(f"--userns subids: {tool} not found", None, SUBID_HINT) from None
        if r.returncode != 0:
            msg = r.stderr.decode(errors="replace").strip().splitlines()
            raise SandboxError(f"--userns subids: {tool} failed",
                               msg[-1] if msg else f"exit {r.returncode}", SUBID_HINT)


# The launcher's own ids, read where this module is first imported: in the
# launcher before the clone (plan.py when it plans a full map, OCI create
# and stages/parent.py for one), so the init (a clone of it) still knows
# them once the new namespace shows its ids as the overflow id.
LAUNCHER_IDS = (os.geteuid(), os.getegid())


def _unmapped(uid_rows, gid_rows):
    def out(own, rows):
        return not any(o <= own < o + n for _, o, n in rows)
    return out(LAUNCHER_IDS[0], uid_rows), out(LAUNCHER_IDS[1], gid_rows)


def caller_unmapped(uid_rows, gid_rows):
    """Whether the maps leave out the launcher's uid or gid (become_mapped_root
    then switches)."""
    return any(_unmapped(uid_rows, gid_rows))


def become_mapped_root(uid_rows, gid_rows):
    """After the maps are written, a process whose own ids the new namespace
    does not map (root mapping the container's 0 to host 1000, as podman's
    --uidmap and --userns=auto do) becomes the namespace's 0: files it creates
    for mount points, and the mounts it makes, then belong to an id the
    namespace maps, where an unmapped creator gets EOVERFLOW from the kernel
    (fs/namei.c may_create: fsuidgid_has_mapping).  The switch keeps every
    capability (capabilities(7): the ids go to the namespace's root, not
    away from it).  A process whose ids are mapped keeps them."""
    uid_gone, gid_gone = _unmapped(uid_rows, gid_rows)
    if not uid_gone and not gid_gone:
        return
    for rows, what in ((uid_rows, "uid"), (gid_rows, "gid")):
        if not any(i == 0 for i, _, _ in rows):
            raise SandboxError(f"the user namespace maps neither the caller's {what} nor {what} 0",
                               None, f"map the container's {what} 0 in linux.{what}Mappings")
    if gid_gone:
        try:
            os.setgroups([])     # the host's groups map to nothing there
        except OSError:
            pass
        os.setresgid(0, 0, 0)
    if uid_gone:
        os.setresuid(0, 0, 0)
