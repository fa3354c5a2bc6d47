"""Applying an OCI layer to a directory, securely.

apply_layer(rootfd, fileobj, ...) applies one layer blob on top of the tree
that layers 1..N-1 left in the same directory (a flattened image), with the
OCI image-spec changeset rules: whiteouts (`.wh.NAME`), opaque directories
(`.wh..wh..opq`), type changes and duplicates (the later entry replaces),
hard links.

Nothing in a layer is trusted.  Every operation is relative to a directory
descriptor reached from `rootfd` with openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS): a symlink the layer (or an earlier one) planted is
never followed, whatever its target, so no member, link, whiteout or
metadata change can reach outside the root.  Member names are plain
components: a leading `/` is dropped (names are relative to the root, as
docker and containerd read them), a `..` component, a NUL or an overlong
name is an error.  A member whose parent is a symlink is an error, not
followed.  New files are created with O_CREAT|O_EXCL|O_NOFOLLOW after the
old entry is removed; modes are set with fchmod on the opened file.

Decisions (docs/images.md repeats them):
- Hard links: the target must be a regular file that an earlier member of
  the same layer created (layer writers only link within a layer; the spec
  says links to outside the layer may fail).  A link to a symlink, a
  directory, a name from an earlier layer or outside the root is an error.
- Device nodes (block, char) are never created, as root or rootless: the
  sandbox mounts its own /dev and image trees are mounted nodev, so a node
  could only be a hazard in the store.  They are counted and reported with
  one warn() line.  FIFOs are created (mkfifo needs no privilege).
- setuid/setgid bits are kept: the store is 0700 and image mounts are
  nosuid, so they are never effective; keeping them keeps the image exact.
- No extended attribute of a layer is applied (security.capability,
  trusted.*, overlay and LSM labels, user.*): none is needed to run, and
  file capabilities are the dangerous ones.
- Ownership: as root, the member's numeric uid/gid (fchown); rootless, the
  caller owns everything, and (as Charliecloud does) directories get u+rwx
  and files u+rw added so the caller can always update and remove its tree.
- Sealed (seal=dict: a store other users read): nothing may give another
  host user write access, since the tree is every user's image.  Owners are
  root (as root) or the caller, group and other write bits are cleared
  (1777 directories too), and a file given to root loses setuid/setgid
  (they meant "run as the image's user").  The directories whose owner or
  mode this changed are recorded with what the layer said, so the sandbox
  can show them as the image had them (image/layers.py, linux/mounts.py).
- Directory mtimes are set after the layer, as the last member's write
  would change them."""
import errno
import os
import shutil
import stat

from ..errors import printable
from ..linux import sys as k
from .digest import ImageError
from .pathset import PathSet
from .tarstream import CHUNK, Limits, TarReader

__all__ = ["apply_layer", "Limits", "MEDIA_TYPES"]

_RES = k.RESOLVE_BENEATH | k.RESOLVE_NO_SYMLINKS | k.RESOLVE_NO_MAGICLINKS
_WH = b".wh."
_OPQ = b".wh..wh..opq"
_REG = (b"0", b"7", b"\0")
_DIRTIMES_BUDGET = 64 << 20

MEDIA_TYPES = frozenset(
    [f"application/vnd.oci.image.layer.{d}v1.tar{c}"
     for d in ("", "nondistributable.") for c in ("", "+gzip", "+zstd")]
    + ["application/vnd.docker.image.rootfs.diff.tar",
       "application/vnd.docker.image.rootfs.diff.tar.gzip",
       "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"])


def apply_layer(rootfd, fileobj, *, media_type, rootless, limits=None, warn=None,
                record=None, seal=None):
    """Apply one layer blob (a binary stream, compressed or not) to the tree
    under `rootfd` (an O_PATH directory fd).  Returns the diff_id,
    "sha256:<hex>" of the uncompressed tar stream.  Raises ImageError on
    any violation; the tree is then half-applied and the caller discards it.

    media_type: one of MEDIA_TYPES or None; the compression actually used is
    taken from the stream's magic bytes (as docker does), so a layer whose
    descriptor says gzip but holds plain tar still unpacks.

    record: a set, to unpack the layer alone into an empty directory as a
    diff (image/layers.py merges diffs): whiteouts and opaque markers are
    then kept as empty `.wh.NAME` / `.wh..wh..opq` files instead of acting
    on the tree (no real member can have such a name), and the set is
    filled with the directories the layer implies without listing them, so
    their made-up metadata never overrides a lower layer's.

    seal: a dict, for a store other users read: the tree is sealed (see the
    module docstring) and the dict maps each directory whose owner or mode
    that changed to the layer's (uid, gid, mode); uid and gid are None
    rootless (the caller owned the tree whatever the layer said)."""
    if media_type is not None and media_type not in MEDIA_TYPES:
        raise ImageError(f"unsupported layer media type {printable(media_type)[:200]}",
                         hint="encrypted and foreign layer formats are not supported")
    try:
        reader = TarReader(fileobj, limits or Limits())
        app = _Applier(rootfd, rootless, reader.lim, record, seal)
        try:
            for e in reader.entries():
                app.entry(e, reader)
            app.finish()
        finally:
            app.close()
    except OSError as err:  # reading the blob (member operations are wrapped per member)
        raise ImageError("cannot read layer", os.strerror(err.errno) if err.errno
                         else str(err)) from None
    if app.skipped and warn:
        warn(f"skipped {app.skipped} device node{'s' if app.skipped > 1 else ''} of the "
             "layer (the sandbox provides its own /dev)")
    return reader.diff_id


def _show(path):
    return printable(os.fsdecode(path))[:200] or "/"


class _Applier:
    def __init__(self, rootfd, rootless, limits, record=None, seal=None):
        self.root = rootfd
        self.record = record
        self.record_bytes = 0
        self.seal = seal
        if record is not None:
            record.add(b"")
        self.rootless = rootless
        self.lim = limits
        # Paths this layer created or descended through (pathset.py: 16 to
        # 32 bytes an entry whatever the names): whiteouts and opaque
        # markers apply to lower layers only, and hard links must point at
        # this layer's own files.
        self.touched = PathSet()
        self.dirtimes = {}
        self.dirtime_bytes = 0
        self.count = 0
        self.skipped = 0
        self._pc = None  # (path, fd, rmdirs) of the last parent directory
        self.rmdirs = 0

    def close(self):
        if self._pc:
            os.close(self._pc[1])
            self._pc = None

    # --- names and directories -------------------------------------------
    def _comps(self, raw, what="member"):
        comps = []
        for c in raw.split(b"/"):
            if c in (b"", b"."):
                continue
            if c == b"..":
                raise ImageError("invalid layer", f"{what} {_show(raw)}: a '..' component "
                                 "(names are relative to the image root)")
            if len(c) > 255:
                raise ImageError("invalid layer", f"{what} {_show(raw)}: a component "
                                 "longer than 255 bytes")
            comps.append(c)
        if any(c.startswith(_WH) for c in comps[:-1]):
            raise ImageError("invalid layer", f"{what} {_show(raw)}: a whiteout name used "
                             "as a directory")
        if len(comps) > self.lim.max_depth:
            raise ImageError("invalid layer", f"{what} {_show(raw)}: deeper than "
                             f"{self.lim.max_depth} components")
        return comps

    def _touch(self, comps):
        for i in range(len(comps), 0, -1):
            if not self.touched.add(b"/".join(comps[:i])) and i < len(comps):
                break  # its ancestors were marked with it

    def _open_dir(self, comps, create):
        """O_PATH fd of the directory comps (never through a symlink); None
        when it is missing and create is False."""
        if not comps:
            return os.dup(self.root)
        path = b"/".join(comps)
        try:
            return k.openat2(self.root, path, k.O_PATH | os.O_DIRECTORY, 0, _RES)
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise self._walk_error(comps, e) from None
            if not create:
                return None

        def step(fd, i, c):
            try:
                return k.openat2(fd, c, k.O_PATH | os.O_DIRECTORY, 0, _RES)
            except FileNotFoundError:
                # Parents the layer does not list: 0755, as docker makes them.
                os.mkdir(c, 0o700, dir_fd=fd)
                if self.record is not None:
                    self._implied(b"/".join(comps[:i + 1]))
                nfd = k.openat2(fd, c, os.O_RDONLY | os.O_DIRECTORY, 0, _RES)
                os.fchmod(nfd, 0o755 | (0o700 if self.rootless else 0))
                return nfd
            except OSError as e:
                raise self._walk_error(comps[:i + 1], e) from None
        return k.walk_fd(self.root, comps, step)

    def _implied(self, path):
        self._budget(path)
        self.record.add(path)

    def _budget(self, path):
        self.record_bytes += len(path) + 64
        if self.record_bytes > _DIRTIMES_BUDGET:
            raise ImageError("invalid layer", "too many directories implied by its members "
                             "or given to other users")

    def _walk_error(self, comps, e):
        why = {errno.ELOOP: "is or passes through a symlink (never followed)",
               errno.EXDEV: "leads outside the image root",
               errno.ENOTDIR: "passes through something that is not a directory"
               }.get(e.errno, os.strerror(e.errno))
        return ImageError("invalid layer", f"parent directory /{_show(b'/'.join(comps))} "
                          f"{why}")

    def _parent(self, comps):
        path = b"/".join(comps)
        if not comps:
            return self.root
        # Reused only while no directory was removed since: a member may have
        # removed the cached one (replaced it by a file, whited it out).
        if self._pc and self._pc[0] == path and self._pc[2] == self.rmdirs:
            return self._pc[1]
        fd = self._open_dir(comps, True)
        self.close()
        self._pc = (path, fd, self.rmdirs)
        return fd

    def _clear(self, pfd, leaf, keep_dir=False):
        """Remove what is at leaf (a whole tree for a directory), unless it
        is a directory and keep_dir.  Returns True when a directory is kept."""
        try:
            st = os.lstat(leaf, dir_fd=pfd)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            if keep_dir:
                return True
            # The fd-based rmtree: opens each level O_NOFOLLOW-equivalent and
            # checks it is the directory it lstat'ed, never following a link.
            self.rmdirs += 1
            shutil.rmtree(leaf, dir_fd=pfd)
        else:
            os.unlink(leaf, dir_fd=pfd)
        return False

    def _owner_mode(self, fd, e, isdir, path=None):
        uid, gid, mode = self._sealed(e, isdir, path)
        # chown first: it clears setuid/setgid bits the mode then sets.
        if not self.rootless:
            os.fchown(fd, uid, gid)
        if self.rootless:
            mode |= 0o700 if isdir else 0o600
        os.fchmod(fd, mode)

    def _sealed(self, e, isdir, path):
        """(uid, gid, mode) a member gets: the layer's, or sealed."""
        if self.seal is None:
            return e.uid, e.gid, e.mode
        mode = e.mode & ~0o022
        if not self.rootless and (e.uid, e.gid) != (0, 0) and not isdir:
            mode &= ~0o6000
        if isdir:
            if mode != e.mode or not self.rootless and (e.uid, e.gid) != (0, 0):
                if path not in self.seal:
                    self._budget(path)
                self.seal[path] = (None, None, e.mode) if self.rootless else \
                    (e.uid, e.gid, e.mode)
            else:
                self.seal.pop(path, None)    # listed again, as the seal leaves it
        return 0, 0, mode

    # --- members ------------------------------------------------------------
    def entry(self, e, reader):
        self.count += 1
        if self.count > self.lim.max_entries:
            raise ImageError("invalid layer", f"more than {self.lim.max_entries} members "
                             "(the entry limit)")
        try:
            self._entry(e, reader)
        except OSError as err:
            raise ImageError("cannot apply layer", f"member {_show(e.name)}: "
                             f"{os.strerror(err.errno) if err.errno else err}") from None

    def _entry(self, e, reader):
        comps = self._comps(e.name)
        typ = e.type
        if typ == b"\0" and e.name.endswith(b"/"):
            typ = b"5"  # pre-POSIX tar marks directories by a trailing slash
        if not comps:
            if typ != b"5":
                raise ImageError("invalid layer", f"member {_show(e.name)} names the image "
                                 "root but is not a directory")
            fd = k.openat2(self.root, b".", os.O_RDONLY | os.O_DIRECTORY, 0, _RES)
            if self.record is not None:
                self.record.discard(b"")
            try:
                self._owner_mode(fd, e, True, b"")
            finally:
                os.close(fd)
            self._dirtime(b"", e.mtime_ns)
            return
        leaf, parent = comps[-1], comps[:-1]
        if leaf.startswith(_WH):
            return self._whiteout(parent, leaf, e)
        path = b"/".join(comps)
        self._touch(comps)
        pfd = self._parent(parent)
        if typ in _REG:
            self._clear(pfd, leaf)
            fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600, dir_fd=pfd)
            try:
                while True:
                    b = reader.data(CHUNK)
                    if not b:
                        break
                    view = memoryview(b)
                    while view:
                        view = view[os.write(fd, view):]
                self._owner_mode(fd, e, False)
                os.utime(fd, ns=(e.mtime_ns, e.mtime_ns))
            finally:
                os.close(fd)
        elif typ == b"5":
            if not self._clear(pfd, leaf, keep_dir=True):
                os.mkdir(leaf, 0o700, dir_fd=pfd)
            fd = k.openat2(pfd, leaf, os.O_RDONLY | os.O_DIRECTORY, 0, _RES)
            if self.record is not None:
                self.record.discard(path)
            try:
                self._owner_mode(fd, e, True, path)
            finally:
                os.close(fd)
            self._dirtime(path, e.mtime_ns)
        elif typ == b"2":
            if not e.linkname:
                raise ImageError("invalid layer", f"symlink {_show(path)} has an empty target")
            self._clear(pfd, leaf)
            os.symlink(e.linkname, leaf, dir_fd=pfd)
            self._meta_by_name(pfd, leaf, e, chmod=False)
        elif typ == b"1":
            self._hardlink(pfd, leaf, path, e)
        elif typ == b"6":
            self._clear(pfd, leaf)
            os.mkfifo(leaf, 0o600, dir_fd=pfd)
            self._meta_by_name(pfd, leaf, e, chmod=True)
        elif typ in (b"3", b"4"):
            # The lower entry is still replaced: the layer says something
            # else lives here now.
            self._clear(pfd, leaf)
            self.skipped += 1
            if self.record is not None and len(leaf) <= 255 - len(_WH):
                os.close(os.open(_WH + leaf, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600, dir_fd=pfd))
        else:
            raise ImageError("invalid layer", f"member {_show(path)} has the unsupported "
                             f"tar type {typ!r}")

    def _meta_by_name(self, pfd, leaf, e, chmod):
        """Owner, mode and mtime of a symlink or FIFO: by name relative to the
        parent fd, never following (a FIFO cannot be opened without
        blocking, a symlink not at all)."""
        uid, gid, mode = self._sealed(e, False, None)
        if not self.rootless:
            os.chown(leaf, uid, gid, dir_fd=pfd, follow_symlinks=False)
        if chmod:
            os.chmod(leaf, mode | (0o600 if self.rootless else 0), dir_fd=pfd,
                     follow_symlinks=False)
        os.utime(leaf, ns=(e.mtime_ns, e.mtime_ns), dir_fd=pfd, follow_symlinks=False)

    def _hardlink(self, pfd, leaf, path, e):
        tcomps = self._comps(e.linkname, "hard link target")
        tpath = b"/".join(tcomps)
        if not tcomps or tpath == path:
            raise ImageError("invalid layer", f"hard link {_show(path)} -> "
                             f"{_show(e.linkname)}: links to {'itself' if tcomps else 'the root'}")
        if tpath not in self.touched:
            raise ImageError("invalid layer", f"hard link {_show(path)} -> {_show(tpath)}: "
                             "the target is not an earlier member of this layer")
        tpfd = self._open_dir(tcomps[:-1], False)
        if tpfd is None:
            raise ImageError("invalid layer", f"hard link {_show(path)} -> {_show(tpath)}: "
                             "no such file")
        try:
            try:
                st = os.lstat(tcomps[-1], dir_fd=tpfd)
            except FileNotFoundError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode):
                what = "no such file" if st is None else (
                    "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file")
                raise ImageError("invalid layer", f"hard link {_show(path)} -> "
                                 f"{_show(tpath)}: the target is {what}")
            self._clear(pfd, leaf)
            os.link(tcomps[-1], leaf, src_dir_fd=tpfd, dst_dir_fd=pfd, follow_symlinks=False)
        finally:
            os.close(tpfd)

    def _whiteout(self, parent, leaf, e):
        where = b"/".join(parent + [leaf])
        if leaf == _OPQ:
            name = None
        elif leaf.startswith(_WH + _WH):
            return  # AUFS bookkeeping (.wh..wh.plnk, .wh..wh.aufs): not part of the tree
        else:
            name = leaf[len(_WH):]
            if name in (b"", b".", b".."):
                raise ImageError("invalid layer", f"whiteout {_show(where)} names "
                                 f"{'nothing' if not name else repr(name.decode())}")
        if parent:
            self._touch(parent)
        pfd = self._parent(parent)
        if self.record is not None:
            # A diff keeps the marker; the merge applies it to lower layers.
            os.close(os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600, dir_fd=pfd))
            return
        if name is None:
            return self._opaque(b"/".join(parent))
        path = b"/".join(parent + [name])
        if path in self.touched:
            # Whiteouts hide lower layers only: this layer's own entry stays,
            # and a directory of it loses the lower content under it.
            try:
                st = os.lstat(name, dir_fd=pfd)
            except FileNotFoundError:
                return
            if stat.S_ISDIR(st.st_mode):
                self._opaque(path)
            return
        self._clear(pfd, name)

    def _opaque(self, dirpath):
        """Remove everything under dirpath that this layer did not create,
        descending into the directories it did (their lower content goes
        too): the opaque marker applies to lower layers only, whichever
        order the layer lists the marker and its siblings in."""
        stack = [dirpath]
        while stack:
            p = stack.pop()
            fd = k.openat2(self.root, p or b".", os.O_RDONLY | os.O_DIRECTORY, 0, _RES)
            try:
                for n in os.listdir(fd):
                    name = os.fsencode(n)
                    cp = p + b"/" + name if p else name
                    if cp in self.touched:
                        if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                            stack.append(cp)
                    else:
                        self._clear(fd, name)
            finally:
                os.close(fd)

    def _dirtime(self, path, ns):
        if path not in self.dirtimes:
            self.dirtime_bytes += len(path) + 64
        if self.dirtime_bytes > _DIRTIMES_BUDGET:
            # Past the budget (a hostile layer of long directory names), set
            # it now: a later member in it may change it, nothing worse.
            self._set_dirtime(path, ns)
            return
        self.dirtimes[path] = ns

    def _set_dirtime(self, path, ns):
        comps = path.split(b"/") if path else []
        try:
            if not comps:
                fd = k.openat2(self.root, b".", os.O_RDONLY | os.O_DIRECTORY, 0, _RES)
                try:
                    os.utime(fd, ns=(ns, ns))
                finally:
                    os.close(fd)
                return
            pfd = self._open_dir(comps[:-1], False)
        except ImageError:
            return
        if pfd is None:
            return
        try:
            if stat.S_ISDIR(os.lstat(comps[-1], dir_fd=pfd).st_mode):
                os.utime(comps[-1], ns=(ns, ns), dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        finally:
            os.close(pfd)

    def finish(self):
        try:
            for path, ns in self.dirtimes.items():
                self._set_dirtime(path, ns)
        except OSError as err:
            raise ImageError("cannot apply layer", f"directory times: "
                             f"{os.strerror(err.errno) if err.errno else err}") from None
