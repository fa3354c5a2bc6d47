"""Facts about the caller as the host sees it, and its namespaces.

- its uid outside any user namespace it runs in, whether it is real root
  (the initial user namespace's uid 0), which owners stand for root here,
  whether its user namespace denies setgroups(2);
- the one way to join namespaces (open_ns, join_ns), by the one table of
  namespace types (OCI name, /proc/PID/ns name, clone flag), which lives in
  linux/__init__.py and is named here too;
- the one rule for a directory taken from a shared or user-writable place
  (trusted_dir, ensure_dir; rundir.py's, docs/runtime.md): walked from / by
  descriptor, without following a link, each component root's or the
  caller's and closed to others' writes.

Rootless podman and docker run hooks and runtimes as uid 0 of a user
namespace: the euid says root, the host says the user.  Every part that
names a per-user place or picks a privileged path asks here.

bin/gpusandbox-oci computes host_uid and initial_userns in sh (its
`host_ids` function) and bin/gpusandbox-runtime real_root and root_uids (its
settings lookup); tests hold them to these functions.

Light on purpose: the OCI fast paths import this before anything else
(os and stat only; join_ns loads the ctypes layer when it is called).
"""
import os
import stat

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


def same_ns(fd, t):
    """Whether the namespace open at `fd` is the caller's own of type `t`."""
    st = os.fstat(fd)
    own = os.stat(f"/proc/self/ns/{NS_PROC[t]}")
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def join_ns_owned(fds):
    """setns(2) into each of [(type, descriptor)], the user namespace among
    them joined where it works (runc's two passes): each other one is tried
    first with the caller's own capabilities; one that refuses (EPERM: owned
    by the user namespace to join, which a user reaches only from inside it)
    is joined again after the user namespace.  Namespaces the process then
    makes belong to the joined user namespace.  NamespaceError as join_ns."""
    user = [(t, fd) for t, fd in fds if t == "user"]
    late = []
    for t, fd in sorted(fds, key=lambda x: NS_RANK[x[0]]):
        if t == "user":
            continue
        try:
            join_ns([(t, fd)])
        except NamespaceError as e:
            if e.errno != 1 or not user:
                raise
            late.append((t, fd))
    join_ns(user)
    join_ns(late)


def userns_maps(path):
    """([uid rows], [gid rows]) of the user namespace at `path`, as ints
    (container id, id of the caller's namespace, count), read from inside it
    by a short-lived child (its maps are /proc/self/*_map there: no path
    names them otherwise).  NamespaceError when it cannot be joined."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        os.close(r)
        os.close(w)
        raise NamespaceError("user", e) from None
    try:
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                try:
                    join_ns([("user", fd)])
                    out = "\0".join(" ".join(" ".join(row) for row in id_map(kind)) + " "
                                     for kind in ("uid", "gid")).encode()
                except NamespaceError as e:
                    out = f"E{e.errno}".encode()
                os.write(w, out)
            finally:
                os._exit(0)
        os.close(w)
        w = -1
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.waitpid(pid, 0)
    finally:
        os.close(fd)
        os.close(r)
        if w >= 0:
            os.close(w)
    if data[:1] == b"E" or not data:
        err = int(data[1:] or 22)
        raise NamespaceError("user", OSError(err, os.strerror(err)))
    out = []
    for part in data.decode().split("\0"):
        v = [int(x) for x in part.split()]
        out.append([tuple(v[i:i + 3]) for i in range(0, len(v) - 2, 3)])
    return out[0], out[1]


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Taken(Exception):
    """A directory is not the caller's or not closed to others: (path, why)."""

    def __init__(self, path, why, foreign):
        super().__init__(path, why)
        self.path, self.why, self.foreign = path, why, foreign


# --- the one rule for shared places (rundir.py, docs/runtime.md) --------------------------------------------------------------
def _check_step(fd, path, last, uid, roots=(0,)):
    st = os.fstat(fd)
    if (st.st_uid not in roots and st.st_uid != uid) or (last and st.st_uid != uid):
        raise Taken(path, f"owned by uid {st.st_uid}, not by you (uid {uid})", True)
    if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and not last):
        raise Taken(path, f"mode {st.st_mode & 0o7777:04o} lets others write to it",
                    st.st_uid != uid or not last)
    return st


def trusted_dir(path, uid=None, own=True, links=False, make=None):
    """A descriptor of directory `path`, opened from / one component at a
    time without following a symlink; every component owned by root or
    `uid` (default: the caller) and writable by no one else unless sticky,
    the last one `uid`'s when `own` (else root's or `uid`'s, closed to
    writes).  Taken when not; OSError (ENOENT, ELOOP, ENOTDIR) as the
    kernel says.

    `links`: for a path the caller names itself (gpusandbox-oci --root), a
    symlink of root's or `uid`'s is followed and its target walked by the
    same rule (a link in a directory that passed is as fixed as that
    directory: /var/run -> /run); anyone else's is refused.  `make`: the
    mode a missing component is made with (ensure_dir)."""
    uid = os.geteuid() if uid is None else uid
    if not path.startswith("/"):
        raise Taken(path, "not an absolute path", False)
    todo = [p for p in path.split("/") if p and p != "."]
    if ".." in todo:
        raise Taken(path, "has '..' in it", False)
    todo.reverse()
    # Inside a user namespace the host's root shows as the overflow uid (any
    # unmapped owner does: a path through a directory of another user is the
    # caller's own choice, never one made here).
    roots = root_uids()
    # (descriptor, path) of each directory on the way down: a link's '..'
    # goes back up to one already checked.
    walk = [(os.open("/", _DIR), "/")]
    hops = 0
    try:
        _check_step(walk[0][0], "/", False, uid, roots)
        while todo:
            name = todo.pop()
            fd, cur = walk[-1]
            if name == "..":
                if len(walk) > 1:
                    os.close(walk.pop()[0])
                continue
            sub = cur.rstrip("/") + "/" + name
            try:
                nfd = os.open(name, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if make is None:
                    raise
                nfd = ensure_dir(fd, cur, name, make)
            except OSError as e:
                import errno
                if not links or e.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(st.st_mode):
                    raise
                if st.st_uid not in roots and st.st_uid != uid:
                    raise Taken(sub, f"a symbolic link owned by uid {st.st_uid}, not by root "
                                f"or you (uid {uid})", True) from None
                hops += 1
                if hops > 40:       # the kernel's own limit (path_resolution(7))
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), sub) from None
                target = os.readlink(name, dir_fd=fd)
                if target.startswith("/"):
                    while len(walk) > 1:
                        os.close(walk.pop()[0])
                todo.extend(reversed([p for p in target.split("/") if p and p != "."]))
                continue
            walk.append((nfd, sub))
            _check_step(nfd, sub, False, uid, roots)
        fd, cur = walk[-1]
        st = os.fstat(fd)
        if own:
            _check_step(fd, cur, True, uid, roots)
        elif (st.st_uid not in roots and st.st_uid != uid) or st.st_mode & 0o022:
            raise Taken(cur, f"owned by uid {st.st_uid} with mode {st.st_mode & 0o7777:04o}: "
                        "not root's or yours, closed to others", st.st_uid != uid)
        walk.pop()
        return fd
    finally:
        for fd, _ in walk:
            os.close(fd)


def ensure_dir(parent_fd, parent, name, mode):
    """parent/name as a directory of the caller's with exactly `mode`: made
    when missing, repaired when the caller's with another mode; Taken when
    it is anything else.  Returns its descriptor."""
    path = os.path.join(parent, name)
    try:
        os.mkdir(name, mode, dir_fd=parent_fd)
    except FileExistsError:
        pass
    try:
        fd = os.open(name, _DIR, dir_fd=parent_fd)
    except OSError as e:
        # ELOOP/ENOTDIR: a link or a file under that name.
        raise Taken(path, "not a directory (a link or a file is there)", True) from e
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise Taken(path, f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()})", True)
        if st.st_mode & 0o7777 != mode:
            # A mode an older version left is repaired; one that let others
            # write may hold what they planted: not ours to trust.
            if st.st_mode & 0o022:
                raise Taken(path, f"mode {st.st_mode & 0o7777:04o} lets others write to it",
                            False)
            os.fchmod(fd, mode)
        return fd
    except BaseException:
        os.close(fd)
        raise
