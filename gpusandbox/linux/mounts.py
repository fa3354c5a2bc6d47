"""Mount operations that never follow a symlink out of the new root.

Every target inside the root is reached through an O_PATH fd obtained with
openat2(RESOLVE_IN_ROOT): an absolute or `../..` symlink planted in the image
resolves inside the root, never on the host (CVE-2024-0132 class).  Mounts
are attached to those fds with move_mount(MOVE_MOUNT_T_EMPTY_PATH), so there
is no window between "check the path" and "mount on the path" for a second
sandbox sharing a writable image to swap a component (check-then-mount race).

Sources are host paths only (options and discovery), opened by the init
stage before the image's tree is attached.
"""
import errno
import os
import stat

from . import sys as k

_RES_IN_ROOT = k.RESOLVE_IN_ROOT | k.RESOLVE_NO_MAGICLINKS
# System mount points (/proc, /dev, ...) must be real directories of the
# image: a symlink there is refused rather than followed anywhere.
_RES_STRICT = k.RESOLVE_BENEATH | k.RESOLVE_NO_SYMLINKS | k.RESOLVE_NO_MAGICLINKS


class MountError(OSError):
    """An OSError with the container path it concerns."""


def _open(rootfd, rel, flags, resolve):
    return k.openat2(rootfd, rel, flags | k.O_PATH, 0, resolve)


def open_target(rootfd, path, kind="dir", create=True, strict=False):
    """O_PATH fd of `path` inside the root, creating it (and its parents)
    when missing: a directory, or an empty regular file for kind="file".

    strict=True refuses symlinks on the way (used for the system mount
    points).  A missing target whose parent exists is created in that
    parent, held by descriptor (resolved like the target), with O_NOFOLLOW
    or mkdirat: a file is held by the open that made it, a directory
    reopened from the parent without following any symlink; other
    missing parts are created where the image's own symlinks lead (inside
    the root), one component at a time with O_NOFOLLOW, so a racing
    symlink swap can only make the call fail, never escape."""
    rel = path.strip("/")
    resolve = _RES_STRICT if strict else _RES_IN_ROOT
    if not rel:
        return os.dup(rootfd)
    # A directory is asked for by O_DIRECTORY: the kernel checks the type of
    # what it opens, no fstat needed.
    want_dir = kind == "dir"
    dflag = os.O_DIRECTORY if want_dir else 0
    try:
        fd = _open(rootfd, rel, dflag, resolve)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EXDEV) and strict:
            raise MountError(e.errno, f"the image has a symlink at or above {path}; "
                             "refusing to mount over it") from None
        if e.errno == errno.ENOTDIR and want_dir:
            _refuse_not_dir(rootfd, rel, path, resolve)
        if e.errno != errno.ENOENT or not create:
            raise MountError(e.errno, f"cannot resolve {path} in the root: "
                             f"{os.strerror(e.errno)}") from None
        fd = _create_in_parent(rootfd, rel, path, kind, resolve, dflag)
        if fd is None:
            fd = _create_walking(rootfd, rel, path, kind, resolve, strict, dflag)
    # A file asked for to mount on (create=True) is not checked here: the
    # kernel refuses to attach a file's mount on a directory (move_mount:
    # EINVAL, named by attach).  Without create the caller tries another
    # kind or skips the path (the masks): the type is checked now.
    if not want_dir and not create and stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        raise MountError(errno.EISDIR, f"mount point {path} in the image is not a file")
    return fd


def _refuse_not_dir(rootfd, rel, path, resolve):
    """ENOTDIR from an O_DIRECTORY open: the target itself is not a
    directory (the message says so), or a component above it is not."""
    try:
        os.close(_open(rootfd, rel, 0, resolve))
    except OSError:
        return
    raise MountError(errno.ENOTDIR, f"mount point {path} in the image is not a directory")


def _create_in_parent(rootfd, rel, path, kind, resolve, dflag):
    """The missing target made under its deepest existing ancestor: that
    ancestor opened as the target would be (inside the root), each missing
    directory below it made with mkdirat and opened from the one before
    without following any symlink (RESOLVE_BENEATH|NO_SYMLINKS, one plain
    name), the last name created there with O_CREAT|O_EXCL|O_NOFOLLOW (a
    file, held by that open) or mkdirat.  None where this does not apply
    (a `.` or `..` in the path, a link of the image where a name is
    missing, a race, an error): the walk decides then, as before."""
    comps = rel.split("/")
    for comp in comps:
        if comp in ("", ".", "..") or "\0" in comp:
            return None
    i = len(comps) - 1
    pfd = rootfd
    while i > 0:
        try:
            pfd = _open(rootfd, "/".join(comps[:i]), os.O_DIRECTORY, resolve)
            break
        except OSError as e:
            if e.errno != errno.ENOENT:
                return None
            i -= 1
    try:
        for comp in comps[i:-1]:
            try:
                os.mkdir(comp, 0o755, dir_fd=pfd)
            except FileExistsError:
                pass
            nfd = _open(pfd, comp, os.O_DIRECTORY, _RES_STRICT)
            if pfd != rootfd:
                os.close(pfd)
            pfd = nfd
        fd = _create(pfd, comps[-1], kind, path, held=True)
        return _open(pfd, comps[-1], dflag, _RES_STRICT) if fd is None else fd
    except OSError:
        return None
    finally:
        if pfd != rootfd:
            os.close(pfd)


def _create_walking(rootfd, rel, path, kind, resolve, strict, dflag):
    have, missing = _canonical(rootfd, path, follow=not strict)
    if missing:
        pfd = _walk_create(rootfd, have + missing[:-1])
        try:
            _create(pfd, missing[-1], kind, path)
        finally:
            os.close(pfd)
    # else: it appeared between the open and the walk (the image's own
    # command renaming it back): open it again below like any other.
    try:
        return _open(rootfd, rel, dflag, resolve)
    except OSError as e:
        if e.errno == errno.ENOTDIR and dflag:
            _refuse_not_dir(rootfd, rel, path, resolve)
        raise MountError(e.errno, f"cannot resolve {path} in the root: "
                         f"{os.strerror(e.errno)}") from None


def _check_name(name, path):
    """A single directory entry name: never `.`, `..`, empty or with a `/`.
    O_NOFOLLOW does not stop `..`, and before the pivot the parent of the
    image's root is the host: a walk must never be able to climb."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise MountError(errno.EINVAL, f"invalid path {path} in the root: "
                         f"component {name!r} is not a plain name")


def _create(dirfd, name, kind, path, held=False):
    """A directory or an empty regular file made at name, never through a
    symlink (mkdirat, and mknodat/O_CREAT|O_EXCL, fail on any existing
    entry).  held=True: a file is made by an open that returns its fd
    (O_RDONLY, of the regular file just created: no side effect), which
    serves as the mount point; else None (also when name exists)."""
    _check_name(name, path)
    try:
        if kind == "dir":
            os.mkdir(name, 0o755, dir_fd=dirfd)
        elif held:
            return os.open(name, os.O_CREAT | os.O_EXCL | os.O_RDONLY | os.O_NOFOLLOW
                           | os.O_CLOEXEC, 0o644, dir_fd=dirfd)
        else:
            os.mknod(name, stat.S_IFREG | 0o644, dir_fd=dirfd)
    except FileExistsError:
        pass
    except OSError as e:
        raise MountError(e.errno, f"cannot create mount point {path} in the root: "
                         f"{os.strerror(e.errno)}") from None
    return None


def _close_all(fds):
    """Close fds, each run of consecutive numbers in one close_range."""
    fds = sorted(fds)
    i = 0
    while i < len(fds):
        j = i
        while j + 1 < len(fds) and fds[j + 1] == fds[j] + 1:
            j += 1
        if j > i:
            os.closerange(fds[i], fds[j] + 1)
        else:
            os.close(fds[i])
        i = j + 1


def _walk_create(basefd, comps, modes_fd=None, cache=None, lstat=None):
    """O_PATH fd of base/comps, creating missing directories one component at
    a time.  Every component must be a plain name (no `..`), and each step is
    opened with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) relative to the
    previous one, so no step can leave `base`.  Modes are copied from the same
    path under `modes_fd` when given (the image; read through `lstat`, a
    function of the relative path, when given).

    cache (a dict, prepare_upper's): each directory's fd kept under its
    components, the walk starting from the longest one already there; the
    fds it returns belong to the cache (basefd itself for no components).
    Without it the caller owns the returned fd."""
    for comp in comps:
        _check_name(comp, "/" + "/".join(comps))
    start, fd = 0, basefd
    if cache is not None:
        for i in range(len(comps), 0, -1):
            hit = cache.get(tuple(comps[:i]))
            if hit is not None:
                start, fd = i, hit
                break
    elif not comps:
        return os.dup(basefd)
    try:
        for i in range(start, len(comps)):
            comp = comps[i]
            mode = 0o755
            if modes_fd is not None:
                rel = "/".join(comps[:i + 1])
                try:
                    mode = stat.S_IMODE((lstat(rel) if lstat else
                                         os.lstat(rel, dir_fd=modes_fd)).st_mode)
                except OSError:
                    pass
            try:
                os.mkdir(comp, mode, dir_fd=fd)
            except FileExistsError:
                pass
            except OSError as e:
                raise MountError(e.errno, f"cannot create /{'/'.join(comps[:i + 1])} in the "
                                 f"root: {os.strerror(e.errno)}") from None
            try:
                nfd = _open(fd, comp, os.O_DIRECTORY, _RES_STRICT)
            except OSError as e:
                raise MountError(e.errno, f"/{'/'.join(comps[:i + 1])} changed while the "
                                 "sandbox was being set up") from None
            if cache is not None:
                cache[tuple(comps[:i + 1])] = nfd
            elif fd != basefd:
                os.close(fd)
            fd = nfd
    except BaseException:
        if cache is None and fd != basefd:
            os.close(fd)
        raise
    return fd


def attach(mntfd, targetfd, what):
    """Attach a detached mount (fsmount/open_tree fd) onto an O_PATH target.
    The kernel attaches a directory only on a directory and anything else
    only on a non-directory; a refusal of that kind is named."""
    try:
        k.move_mount(mntfd, targetfd, what)
    except OSError as e:
        if e.errno == errno.EINVAL:
            _refuse_kinds(mntfd, targetfd, what)
        raise
    finally:
        os.close(mntfd)
        os.close(targetfd)


def _refuse_kinds(mntfd, targetfd, what):
    src_dir = stat.S_ISDIR(os.fstat(mntfd).st_mode)
    dst_dir = stat.S_ISDIR(os.fstat(targetfd).st_mode)
    if src_dir != dst_dir:
        raise MountError(errno.EISDIR if dst_dir else errno.ENOTDIR,
                         f"{what}: the mount point in the image is "
                         f"{'a directory' if dst_dir else 'not a directory'}, "
                         f"the source {'is not' if dst_dir else 'is'}") from None


def new_fs(fstype, options=(), attrs=k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV):
    """A detached, fresh filesystem instance (tmpfs, proc, devpts, overlay)."""
    fsfd = k.fsopen(fstype)
    try:
        for opt in options:
            key, eq, val = opt.partition("=")
            k.fsconfig(fsfd, key, val if eq else None)
        return k.fsmount(fsfd, attrs)
    finally:
        os.close(fsfd)


def clone_tree(source, recursive=True, dirfd=k.AT_FDCWD):
    """A detached copy of a host mount subtree (a bind mount not yet attached)."""
    flags = k.OPEN_TREE_CLONE | k.OPEN_TREE_CLOEXEC
    if recursive:
        flags |= k.AT_RECURSIVE
    if source == "":
        flags |= k.AT_EMPTY_PATH
    return k.open_tree(dirfd, source, flags)


def clone_source(host_path, ident=None):
    """A detached bind of a mount's host path.  One with an ident
    (a directory checked by descriptor where other users can write) is
    walked again without following a symlink and bound only when it is the
    same inode: the checker's own descriptor may belong to another mount
    namespace, which mount calls refuse."""
    if not ident:
        return clone_tree(host_path, recursive=False)
    try:
        fd = k.openat2(k.AT_FDCWD, host_path, k.O_PATH | os.O_DIRECTORY, 0,
                       k.RESOLVE_NO_SYMLINKS | k.RESOLVE_NO_MAGICLINKS)
    except OSError as e:
        raise MountError(e.errno, f"{host_path} changed while the sandbox was being "
                         f"set up ({os.strerror(e.errno)})") from None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != tuple(ident):
            raise MountError(errno.ESTALE, f"{host_path} was replaced while the sandbox "
                             "was being set up")
        return clone_tree("", recursive=False, dirfd=fd)
    finally:
        os.close(fd)


def restrict(mntfd, ro=True, nosuid=True, nodev=True, noexec=False, recursive=True):
    attrs = ((k.MOUNT_ATTR_RDONLY if ro else 0) | (k.MOUNT_ATTR_NOSUID if nosuid else 0)
             | (k.MOUNT_ATTR_NODEV if nodev else 0) | (k.MOUNT_ATTR_NOEXEC if noexec else 0))
    if attrs:
        k.mount_setattr(mntfd, attrs, recursive)


def open_host_node(host_path, major, minor):
    """O_PATH fd of a host device node after checking its device number.

    The check runs on the opened inode (fstat), not on the path, so a node
    swapped between discovery and mount is refused (CVE-2021-1056 class)."""
    fd = os.open(host_path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISCHR(st.st_mode) or os.major(st.st_rdev) != major \
            or os.minor(st.st_rdev) != minor:
        os.close(fd)
        raise MountError(errno.EINVAL, f"host device {host_path} is not the character "
                         f"device {major}:{minor}")
    return fd


# --- mount points prepared in the overlay's upper layer ----------------------------
# A user without privileges cannot create anything in a directory of the image
# owned by another uid, even through an overlay (capabilities in a user
# namespace do not cover unmapped owners).  The upper layer is our own tmpfs,
# though: every mount point and link the image lacks is created there before
# the overlay is mounted, at the place the image's own symlinks lead to.


def _canonical(lowerfd, path, max_links=40, follow=True, lstat=None):
    """Split `path` into (existing canonical components, missing components),
    following the image's symlinks as the image would (inside its root).
    lstat(rel): prepare_upper's memo of the image's entries (os.lstat
    relative to lowerfd without it)."""
    if lstat is None:
        def lstat(rel):
            return os.lstat(rel, dir_fd=lowerfd)
    todo = [c for c in path.split("/") if c and c != "."]
    cur = []
    hops = 0
    while todo:
        comp = todo.pop(0)
        if comp == "..":
            if cur:
                cur.pop()
            continue
        rel = "/".join(cur + [comp])
        try:
            st = lstat(rel)
        except FileNotFoundError:
            if ".." in todo:
                # The kernel would not resolve `missing/..` either; a walk
                # that creates `missing` and then climbs must never happen.
                raise MountError(errno.ENOENT, f"{path} does not resolve in the image "
                                 "(`..` after a missing component)") from None
            return cur, [comp] + todo
        except NotADirectoryError:
            raise MountError(errno.ENOTDIR, f"a component of {path} in the image is "
                             "not a directory") from None
        if stat.S_ISLNK(st.st_mode):
            if not follow:
                raise MountError(errno.ELOOP, f"the image has a symlink at or above {path}; "
                                 "refusing to mount over it")
            hops += 1
            if hops > max_links:
                raise MountError(errno.ELOOP, f"too many symlinks resolving {path} in the image")
            target = os.readlink(rel, dir_fd=lowerfd)
            if target.startswith("/"):
                cur = []
            todo = [c for c in target.split("/") if c and c != "."] + todo
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            raise MountError(errno.ENOTDIR, f"a component of {path} in the image is "
                             "not a directory")
        cur.append(comp)
    return cur, []


def prepare_upper(lowerfd, upperfd, points, links, sealed=()):
    """Create in the upper layer every mount point in `points` ((path, kind)
    with kind "dir" or "file") that the image lacks, and every link in
    `links` ((path, target)).  Only the upper layer is written: it holds
    nothing but what this function creates, and the image is read with
    lstat/readlink relative to its root fd.  GPU injection puts dozens of
    files in one directory, so parents are resolved once.

    `sealed` ((path, uid or None, gid or None, mode)): directories of a
    shared store's image whose owner and mode the store keeps from other
    users (root's, no group/other write: image/unpack.py).  A merged
    directory takes its owner and mode from the upper layer (overlayfs),
    so each is made there as the image had it: a 1777 /var/tmp stays 1777
    in the sandbox, writable in its own overlay only."""
    parents = {}
    dirs = {}
    seen = {}

    def lstat(rel):
        # The image's entries as first read: the walks of every path share
        # its first components.  Only where to create in the upper layer
        # depends on them (the overlay resolves the merged tree itself).
        # An image written through (--rw: lower and upper are one tree)
        # is read afresh, as it changes under the walks.
        if lowerfd == upperfd:
            return os.lstat(rel, dir_fd=lowerfd)
        try:
            hit = seen[rel]
        except KeyError:
            try:
                hit = seen[rel] = os.lstat(rel, dir_fd=lowerfd)
            except OSError as e:
                hit = seen[rel] = e
        if isinstance(hit, OSError):
            raise hit
        return hit

    def parent_of(path):
        parent = path.rstrip("/").rpartition("/")[0]
        if parent not in parents:
            parents[parent] = _canonical(lowerfd, parent, lstat=lstat)
        return parents[parent]

    def upper_dir(comps):
        if not comps:
            return upperfd
        fd = dirs.get(tuple(comps))
        return fd if fd is not None else _walk_create(upperfd, comps, lowerfd, dirs, lstat)

    def resolve(path):
        have, missing = parent_of(path)
        name = path.rstrip("/").rpartition("/")[2]
        if missing:
            return have, missing + [name]
        try:
            st = lstat("/".join(have + [name]))
        except FileNotFoundError:
            return have, [name]
        if stat.S_ISLNK(st.st_mode):
            return _canonical(lowerfd, path, lstat=lstat)
        return have + [name], []

    try:
        for path, uid, gid, mode in sealed:
            comps = path.split("/") if path else []
            try:
                # Only where the image has that directory, reached without a symlink.
                os.close(_open(lowerfd, path or ".", os.O_DIRECTORY, _RES_STRICT))
            except OSError:
                continue
            fd = k.openat2(upper_dir(comps), ".", os.O_RDONLY | os.O_DIRECTORY, 0, _RES_STRICT)
            try:
                if uid is not None:
                    os.fchown(fd, uid, gid)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
        for path, kind in points:
            have, missing = resolve(path)
            if missing:
                _create(upper_dir(have + missing[:-1]), missing[-1], kind, path)
        for path, target in links:
            have, missing = parent_of(path)
            fd = upper_dir(have + missing)
            name = path.rstrip("/").rpartition("/")[2]
            # Made first, replaced only when the name exists: the upper layer
            # is ours and fresh, so a name is there only when this function
            # put it there (--rw writes through: the same replacement as before).
            try:
                os.symlink(target, name, dir_fd=fd)
            except FileExistsError:
                os.unlink(name, dir_fd=fd)
                os.symlink(target, name, dir_fd=fd)
    finally:
        _close_all(dirs.values())
