"""Facts about the caller as the host sees it, and its namespaces.

- its uid outside any user namespace it runs in, whether it is real root
  (the initial user namespace's uid 0), which owners stand for root here,
  whether its user namespace denies setgroups(2);
- the one table of namespace types (OCI name, /proc/PID/ns name, clone
  flag) and the one way to join namespaces (open_ns, join_ns).

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

INITIAL_UID_MAP = [["0", "0", "4294967295"]]

# Every namespace type: (OCI linux.namespaces type, name under /proc/PID/ns,
# CLONE_NEW* flag), in the order they are joined: the user namespace first
# (it grants the capabilities the other joins need), pid after ipc, uts and
# net (it only applies to children), the mount namespace last (it changes
# root and cwd).
NAMESPACES = (
    ("user", "user", 0x10000000),
    ("ipc", "ipc", 0x08000000),
    ("uts", "uts", 0x04000000),
    ("network", "net", 0x40000000),
    ("pid", "pid", 0x20000000),
    ("cgroup", "cgroup", 0x02000000),
    ("mount", "mnt", 0x00020000),
)
NS_FLAGS = {t: flag for t, _, flag in NAMESPACES}
NS_PROC = {t: name for t, name, _ in NAMESPACES}
_NS_RANK = {t: i for i, (t, _, _) in enumerate(NAMESPACES)}
CLONE_NEWUSER, CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWCGROUP, \
    CLONE_NEWNS = (flag for _, _, flag in NAMESPACES)


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
    for t, fd in sorted(fds, key=lambda x: _NS_RANK[x[0]]):
        try:
            k.syscall("setns", fd, NS_FLAGS[t])
        except OSError as e:
            raise NamespaceError(t, e) from None
