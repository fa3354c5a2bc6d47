"""Layers unpacked once each, images merged from them by hard links.

  ROOT/layers/<alg>-<diff_id hex>/diff/     the layer alone, as a diff: its
                                            members, plus `.wh.NAME` and
                                            `.wh..wh..opq` marker files
  ROOT/layers/<alg>-<diff_id hex>/implied   directories the layer needs but
                                            does not list (NUL-terminated)
  ROOT/layers/<alg>-<diff_id hex>/usage     the diff's apparent and disk bytes
  ROOT/layers/<alg>-<diff_id hex>/sealed    in a store other users read: the
                                            layer is sealed, and its directories'
                                            own metadata (the package's SEAL)

In a store other users read, the layer is unpacked sealed (unpack.py: no
owner but root or the publisher, no group or other write bit), and only a
sealed layer counts as present: one an older gpusandbox unpacked there
keeps the image's owners and modes, and is unpacked again over it.

A layer is unpacked by unpack.apply_layer(record=...) into a staging
directory, its diff_id checked against the image config, and published by
rename under locks/layer-<hex>, so concurrent pulls unpack each layer once;
the layers an image lacks are unpacked in parallel (threads: zlib, zstd and
the file writes release the GIL), at most MAX_WORKERS at a time.

An image's rootfs/ is then the merge of its diffs with overlayfs' lookup
rules, top layer first: the first layer holding a name decides it; a
non-directory ends the lookup, a directory merges with the same directory
of lower layers until a layer whites the name out (`.wh.NAME`, which hides
lower layers only), holds a non-directory there, or marks it opaque.
Files, symlinks and FIFOs are hard links to the layer's own inodes (no data
is copied); directories are made anew with the metadata of the topmost
layer that lists them.  Both trees are the store's own, written by this
module from checked member names; they are still walked only through
directory fds, never through a symlink.

docs/images.md says why this and not per-layer overlay lowers at run time."""
import os
import stat
import threading

from . import SEAL, digest as digestmod, dump_seal, load_seal
from .digest import ImageError
from .store import _DIR, rmtree_at
from ..linux import sys as k

_RES = k.RESOLVE_BENEATH | k.RESOLVE_NO_SYMLINKS | k.RESOLVE_NO_MAGICLINKS
_WH = ".wh."
_OPQ = ".wh..wh..opq"
MAX_WORKERS = 4
MAX_IMPLIED = 64 << 20
USAGE = "usage"         # layers/<id>/usage: "APPARENT DISK\n", the diff's bytes


def layer_dir(diff_id):
    alg, hexpart = digestmod.parse(diff_id, "diff_id")
    return f"layers/{alg}-{hexpart}"


def has_layer(st, diff_id):
    try:
        mode = os.stat(layer_dir(diff_id) + ("/" + SEAL if st.shared else "/diff"),
                       dir_fd=st.fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return False
    return stat.S_ISREG(mode) if st.shared else stat.S_ISDIR(mode)


def ensure_layers(st, man, conf, progress=None, warn=None):
    """Unpack the image's layers the store lacks (each at most once across
    concurrent pulls, several at a time).  The diff_ids this call unpacked
    are appended to st._unpacked as each is published (a failed pull
    removes them again)."""
    todo, seen = [], set()
    for d, diff_id in zip(man["layers"], conf.diff_ids):
        if diff_id not in seen and not has_layer(st, diff_id):
            seen.add(diff_id)
            todo.append((d, diff_id, st._staging_name("layer")))
    done = st._unpacked
    if not todo:
        return done
    workers = min(len(todo), MAX_WORKERS, os.cpu_count() or 1)
    if workers == 1:
        for d, diff_id, tmp in todo:
            _unpack_one(st, d, diff_id, tmp, warn)
            if progress:
                progress("layer", d)
        return done
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
    lock = threading.Lock()

    def locked_warn(line):
        if warn:
            with lock:
                warn(line)
    with ThreadPoolExecutor(workers, thread_name_prefix="gsbx-unpack") as pool:
        futs = {pool.submit(_unpack_one, st, d, diff_id, tmp, locked_warn): (d, diff_id)
                for d, diff_id, tmp in todo}
        pending = set(futs)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for f in finished:
                if f.exception() is not None:
                    for p in pending:
                        p.cancel()
                    # The others finish (or fail) and clean up their staging.
                    wait(pending)
                    raise f.exception()
                d, diff_id = futs[f]
                if progress:
                    progress("layer", d)
    return done


def _unpack_one(st, desc, diff_id, tmp, warn):
    from . import unpack
    path = layer_dir(diff_id)
    lk = st.lock("layer-" + path.rpartition("/")[2])
    try:
        if has_layer(st, diff_id):
            return False
        os.mkdir(tmp, 0o700, dir_fd=st.fd)
        try:
            sfd = os.open(tmp, _DIR, dir_fd=st.fd)
            try:
                os.mkdir("diff", 0o755, dir_fd=sfd)
                rootfd = os.open("diff", k.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, dir_fd=sfd)
                implied = set()
                seal = {} if st.shared else None
                try:
                    with st.open_blob(desc["digest"]) as f:
                        got = unpack.apply_layer(rootfd, f, media_type=desc["mediaType"],
                                                 rootless=os.geteuid() != 0, warn=warn,
                                                 record=implied, seal=seal)
                finally:
                    os.close(rootfd)
                if got != diff_id:
                    raise ImageError(f"layer {desc['digest']} does not match the image "
                                     "config's diff_id", f"got {got}, config says {diff_id}")
                st._write_new(sfd, "implied", b"".join(p + b"\0" for p in sorted(implied)))
                # What the layer holds on disk, for `images` (usage.py).
                from .sizes import tree_usage
                apparent, disk, _own = tree_usage(sfd, "diff")
                st._write_new(sfd, USAGE, b"%d %d\n" % (apparent, disk))
                if seal is not None:
                    st._write_new(sfd, SEAL, dump_seal((p, *m) for p, m in seal.items()))
                st._publish_mode(sfd, True)
                os.fsync(sfd)
            finally:
                os.close(sfd)
            if st.shared:
                # An unsealed layer of an older gpusandbox: its inodes stay
                # with the images that link them, refused until rebuilt.
                st.unpublish(path)
            os.rename(tmp, path, src_dir_fd=st.fd, dst_dir_fd=st.fd)
            st._unpacked.append(diff_id)   # list.append: safe across threads
        except BaseException:
            try:
                rmtree_at(st.fd, tmp)
            except OSError:
                pass       # the next pull or prune removes it (its owner is gone then)
            raise
        return True
    finally:
        os.close(lk)


def _implied(st, diff_id):
    try:
        data = st.read_file(layer_dir(diff_id) + "/implied", MAX_IMPLIED + 1)
    except OSError as e:
        raise ImageError(f"layer {diff_id} in the store is damaged", e.strerror,
                         "gpusandbox prune, then pull again") from None
    return set(data.split(b"\0")[:-1])


def _seal(st, diff_id):
    """{path: (uid, gid, mode)} of a sealed layer's directories."""
    try:
        data = st.read_file(layer_dir(diff_id) + "/" + SEAL, MAX_IMPLIED + 1)
    except OSError:
        data = None
    dirs = load_seal(data)
    if dirs is None:
        raise ImageError(f"layer {diff_id} in the store is damaged", "its seal is unreadable",
                         "gpusandbox prune, then pull again")
    return {os.fsencode(p): (uid, gid, mode) for p, uid, gid, mode in dirs}


class _Tree:
    __slots__ = ("fd", "implied", "seal")

    def __init__(self, fd, implied, seal):
        self.fd, self.implied, self.seal = fd, implied, seal


def merge(st, diff_ids, dstfd, rootless):
    """Fill the empty directory `dstfd` (O_PATH) with the merge of the
    layers `diff_ids` (bottom first), all already in the store.  Returns,
    in a shared store, the image's seal: each directory of the merge whose
    metadata comes from a layer that sealed it, as that layer had it."""
    trees = []
    try:
        for diff_id in reversed(diff_ids):          # top first
            fd = os.open(layer_dir(diff_id) + "/diff", k.O_PATH | os.O_DIRECTORY
                         | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=st.fd)
            trees.append(_Tree(fd, None, None))
            trees[-1].implied = _implied(st, diff_id)
            trees[-1].seal = _seal(st, diff_id) if st.shared else {}
        dirs = [(b"", _meta_source(trees, b"", range(len(trees))))]
        stack = [(b"", list(range(len(trees))))]
        while stack:
            path, contrib = stack.pop()
            for name, srcs in _merge_dir(trees, path, contrib, dstfd):
                child = path + b"/" + name if path else name
                stack.append((child, srcs))
                dirs.append((child, _meta_source(trees, child, srcs)))
        # Last: a directory's mtime changes with every entry made in it.
        for path, i in dirs:
            _copy_dir_meta(trees[i].fd, dstfd, path, rootless)
        return [(path, *trees[i].seal[path]) for path, i in dirs if path in trees[i].seal]
    except OSError as e:
        raise ImageError("cannot merge the image's layers",
                         os.strerror(e.errno) if e.errno else str(e)) from None
    finally:
        for t in trees:
            os.close(t.fd)


def _meta_source(trees, path, srcs):
    """The topmost layer that lists the directory (else the topmost)."""
    for i in srcs:
        if path not in trees[i].implied:
            return i
    return srcs[0]


def _open(fd, path, flags=os.O_RDONLY):
    return k.openat2(fd, path or b".", flags | os.O_DIRECTORY, 0, _RES)


def _merge_dir(trees, path, contrib, dstfd):
    """Make the entries of directory `path` in the destination; returns
    [(name, layers top first)] of its subdirectories, made empty."""
    dfd = _open(dstfd, path, k.O_PATH)
    fds = []
    try:
        won, closed = {}, set()
        for i in contrib:
            fd = _open(trees[i].fd, path)
            fds.append(fd)
            names = os.listdir(fd)
            whiteouts = []
            opaque = False
            for n in names:
                if n.startswith(_WH):
                    if n == _OPQ:
                        opaque = True
                    elif not n.startswith(_WH + _WH):
                        whiteouts.append(n[len(_WH):])
                    continue
                if n in closed:
                    continue
                isdir = stat.S_ISDIR(os.lstat(n, dir_fd=fd).st_mode)
                cur = won.get(n)
                if cur is None:
                    won[n] = [i] if isdir else (fd, n)
                    if not isdir:
                        closed.add(n)
                elif isdir:
                    cur.append(i)
                else:
                    closed.add(n)       # a lower non-directory ends the lookup
            # A whiteout hides lower layers only: this layer's own entry stays.
            closed.update(whiteouts)
            if opaque:
                break
        subdirs = []
        for n, w in won.items():
            if isinstance(w, list):
                os.mkdir(n, 0o700, dir_fd=dfd)
                subdirs.append((os.fsencode(n), w))
            else:
                os.link(w[1], n, src_dir_fd=w[0], dst_dir_fd=dfd, follow_symlinks=False)
        return subdirs
    finally:
        os.close(dfd)
        for fd in fds:
            os.close(fd)


def _copy_dir_meta(srcroot, dstroot, path, rootless):
    sfd = _open(srcroot, path, k.O_PATH)
    try:
        sst = os.fstat(sfd)
    finally:
        os.close(sfd)
    dfd = _open(dstroot, path)
    try:
        # chown first: it clears setgid bits the mode then sets.
        if not rootless:
            os.fchown(dfd, sst.st_uid, sst.st_gid)
        os.fchmod(dfd, stat.S_IMODE(sst.st_mode) | (0o700 if rootless else 0))
        os.utime(dfd, ns=(sst.st_mtime_ns, sst.st_mtime_ns))
    finally:
        os.close(dfd)


# -- removal ----------------------------------------------------------------

def needed(st):
    """Layer directory names the store's images list (image.json diff_ids)."""
    keep = set()
    for d in st.image_digests():
        rec = st.image_record(d) or {}
        for diff_id in rec.get("diff_ids") or ():
            try:
                keep.add(layer_dir(diff_id).rpartition("/")[2])
            except ImageError:
                continue
    return keep


def remove_unneeded(st, only=None):
    """Remove layer directories no image lists (of `only`, diff_ids, when
    given); returns how many.  Under locks/gc taken exclusively: no pull is
    merging from them.  Images already merged keep their files (hard links)."""
    keep = needed(st)
    try:
        lfd = os.open("layers", _DIR, dir_fd=st.fd)
    except FileNotFoundError:
        return 0
    n = 0
    tfd = None
    try:
        tfd = os.open("tmp", _DIR, dir_fd=st.fd)
        names = os.listdir(lfd)
        if only is not None:
            wanted = {layer_dir(x).rpartition("/")[2] for x in only}
            names = [x for x in names if x in wanted]
        for name in names:
            if name not in keep:
                tmp = st._staging_name("rm")
                try:
                    os.rename(name, tmp.rpartition("/")[2], src_dir_fd=lfd, dst_dir_fd=tfd)
                except OSError:
                    continue
                rmtree_at(st.fd, tmp)
                n += 1
    finally:
        os.close(lfd)
        if tfd is not None:
            os.close(tfd)
    return n
