"""Facts about the caller as the host sees it, and its namespaces.

- its uid outside any user namespace it runs in, whether it is real root
  (the initial user namespace's uid 0), which owners stand for root here,
  whether its user namespace denies setgroups(2);
- the one way to join namespaces (open_ns, join_ns), by the one table of
  namespace types (OCI name, /proc/PID/ns name, clone flag), which lives in
  linux/__init__.py and is named here too.

Rootless podman and docker run hooks and runtimes as uid 0 of a user
namespace: the euid says root, the host says the user.  Every part that
names a per-user place or picks a privileged path asks here.

bin/gpusandbox-oci computes host_uid and initial_userns in sh (its
`host_ids` function) and bin/gpusandbox-runtime real_root and root_uids (its
settings lookup); tests hold them to these functions.

Light on purpose: the OCI fast paths import this before anything else
(os only; join_ns loads the ctypes layer when it is called).
"""
import os

# The one table of namespace types is the package's (linux/__init__.py),
# below both this module and sys.py; its names are this module's API too.
from . import NAMESPACES, NS_FLAGS, NS_PROC, NS_RANK

INITIAL_UID_MAP = [["0", "0", "4294967295"]]


# --- ids ------------------------------------------------------------------------
def id_map(kind="uid", pid="self", proc="/proc"):
    """/proc/PID/uid_map (or gid_map) as rows of strings; [] when unreadable."""
    try:
        with open(f"{proc}/{pid}/{kind}_map", "rb") as f:
            return [ln.split() for ln in f.read().decode().splitlines() if ln.strip()]
    except OSError:
        return []


def uid_map(proc="/proc"):
    """/proc/self/uid_map as rows of strings; [] when unreadable."""
    return id_map("uid", "self", proc)


def map_id(ident, rows):
    """`ident` of this namespace as the parent namespace sees it, through
    the map `rows`; None when the map does not cover it."""
    for row in rows:
        try:
            inside, outside, count = (int(x) for x in row)
        except ValueError:
            continue
        if inside <= ident < inside + count:
            return outside + ident - inside
    return None


def initial_userns(proc="/proc"):
    """Whether the caller runs in the initial user namespace (its map is the
    identity over all ids)."""
    return uid_map(proc) == INITIAL_UID_MAP


def real_root():
    """uid 0 in the initial user namespace: root of the host, not of a
    user namespace."""
    return os.geteuid() == 0 and initial_userns()


def host_uid(proc="/proc"):
    """The caller's effective uid as the initial user namespace sees it
    (its own euid where the map does not cover it or cannot be read)."""
    uid = os.geteuid()
    out = map_id(uid, uid_map(proc))
    return uid if out is None else out


def gid_mapped(gid):
    """Whether `gid` has a mapping in the caller's user namespace (True when
    the map cannot be read: the kernel then decides)."""
    rows = id_map("gid")
    return not rows or map_id(gid, rows) is not None


def root_uids():
    """The owners that stand for root here: 0, and the owner / shows, the
    host's root as this namespace sees it (inside a user namespace that does
    not map it: the overflow uid, as any owner the namespace does not map)."""
    try:
        return tuple(sorted({0, os.stat("/").st_uid}))
    except OSError:
        return (0,)


def setgroups_denied(pid="self"):
    """Whether the user namespace of `pid` denies setgroups(2) (a map written
    after "deny", user_namespaces(7)): its processes keep the groups they
    have."""
    try:
        with open(f"/proc/{pid}/setgroups") as f:
            return f.read().strip() == "deny"
    except OSError:
        return False


# --- namespaces -----------------------------------------------------------------
class NamespaceError(OSError):
    """Opening or joining the namespace of type `ns` failed (errno and
    strerror as the kernel said)."""

    def __init__(self, ns, err):
        super().__init__(err.errno, err.strerror)
        self.ns = ns


def open_ns(pid, types=None, skip_own=True):
    """[(type, descriptor)] of /proc/PID/ns/* for `types`, in that order
    (default: every type, in join order); with skip_own, those the caller is
    already in are left out (nothing to join).  NamespaceError names the one
    that failed; the descriptors opened before it are closed."""
    want = [t for t, _, _ in NAMESPACES] if types is None else types
    out = []
    try:
        for t in want:
            path = f"/proc/{pid}/ns/{NS_PROC[t]}"
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                if skip_own and os.fstat(fd).st_ino == \
                        os.stat(f"/proc/self/ns/{NS_PROC[t]}").st_ino:
                    os.close(fd)
                    continue
            except OSError as e:
                raise NamespaceError(t, e) from None
            out.append((t, fd))
    except BaseException:
        close_ns(out)
        raise
    return out


def close_ns(fds):
    for _, fd in fds:
        os.close(fd)


def join_ns(fds):
    """setns(2) into each of [(type, descriptor)], in the table's order
    whatever the list's; the descriptors stay open (the caller's).
    NamespaceError names the one that failed."""
    from . import sys as k
    for t, fd in sorted(fds, key=lambda x: NS_RANK[x[0]]):
        try:
            k.syscall("setns", fd, NS_FLAGS[t])
        except OSError as e:
            raise NamespaceError(t, e) from None
