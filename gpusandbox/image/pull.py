"""pull(store, source): fetch an image's blobs and unpack it into the store.

The manifest is checked against its digest, the config against the
platform, every layer's diff_id against the config; an image is built in a
staging directory and published by one rename (store.py describes the
layout, the locks and the staging rules).

A compressed layer is fetched only when the store lacks its unpacked
layer, and removed once the image is published (drop_layer_blobs): the
store then holds each image once, as its unpacked layers.  `keep_blobs`
(`pull --keep-blobs`) keeps the image's compressed layers instead, marked
by images/<hex>/keep-blobs, until rmi removes the image."""
import fcntl
import json
import os
import time

from . import config as cfgmod
from . import digest as digestmod
from . import manifest as mf
from . import runrec
from .digest import ImageError
from .layers import ensure_layers, has_layer
from .store import _DIR, KEEP, bundle_config, rmtree_at
from .storegc import needed_blobs


def pull(st, source, names=None, platform=None, asked=False, progress=None,
         keep_blobs=False):
    """Fetch and unpack the image `source` offers for `platform` and name
    it: `names` is a list of refs or a function of the source giving one
    (a docker-archive's names are known after its manifest is read); the
    refs are written under the gc lock, so no prune sees the image
    unnamed.  `keep_blobs`: its compressed layers stay in the store.
    Returns its image record.  A full store is one line naming the store
    and the space needed (diskfull.py)."""
    seen = {}
    try:
        return _pull(st, source, names, platform, asked, progress, keep_blobs, seen)
    except OSError as e:
        from .diskfull import full_error
        err = full_error(st, e, seen.get("manifest"))
        if err is None:
            raise
        raise err from None


def _pull(st, source, names, platform, asked, progress, keep_blobs, seen):
    want = platform or mf.host_platform()
    dig, man, raw = source.manifest(want)
    seen["manifest"] = man
    h = digestmod.hasher(dig)
    h.update(raw)
    if f"{dig.partition(':')[0]}:{h.hexdigest()}" != dig:
        raise ImageError(f"manifest {dig} does not match its digest", None)
    mf.check_manifest(man)
    # An image of a shared store without a seal (an older gpusandbox's) is
    # as good as absent here: this pull rebuilds it.
    present = st.has_image(dig) and not st.unsealed(dig)
    if present and (not keep_blobs or st.keeps_blobs(dig)
                    and all(st.has_blob(d) for d in man["layers"])):
        # Already here (a local layout run again): no lock when every
        # name already points at it.
        wanted = names(source) if callable(names) else list(names or ())
        if all(st.get_ref(n) == dig for n in wanted):
            st.touch(dig)
            return st.image_record(dig)
    gc = st.lock("gc", shared=True)
    st._fetched = []
    st._unpacked = []
    try:
        st.clean_staging()
        if not present:
            _build(st, source, dig, man, raw, want, asked, progress, keep_blobs)
        if keep_blobs:
            _keep_blobs(st, source, dig, man, progress)
        else:
            drop_layer_blobs(st, man["layers"])
        for name in (names(source) if callable(names) else names or ()):
            st.set_ref(name, dig)
        st.touch(dig)
        return st.image_record(dig)
    except BaseException:
        _forget(st, gc)
        gc = None
        raise
    finally:
        st.release_owner()
        if gc is not None:
            os.close(gc)


def drop_layer_blobs(st, descs):
    """Remove the compressed layers `descs` (each unpacked in the store by
    now, which no pull undoes while this one holds the gc lock) unless an
    image kept with --keep-blobs lists them.  Under each blob's lock, as a
    --keep-blobs pull checks them (_keep_blobs), so none is lost between."""
    for d in descs:
        if not st.has_blob(d):
            continue
        lk = st.lock("blob-" + st.blob_path(d["digest"]).rpartition("/")[2])
        try:
            if d["digest"] not in kept_blobs(st):
                try:
                    os.unlink(st.blob_path(d["digest"]), dir_fd=st.fd)
                except FileNotFoundError:
                    pass
        finally:
            os.close(lk)


def kept_blobs(st):
    """The layer blobs the images marked keep-blobs list."""
    out = set()
    for d in st.image_digests():
        if st.keeps_blobs(d):
            out.update((st.image_record(d) or {}).get("layers") or ())
    return out


def _keep_blobs(st, source, dig, man, progress):
    """The image marked keep-blobs, then each of its compressed layers
    fetched where missing.  Each blob's lock is taken once after the mark
    is published: a pull that checked the marks before (drop_layer_blobs)
    has removed the blob by then, and it is fetched again here."""
    try:
        st._write_new(st.fd, st.image_dir(dig) + "/" + KEEP, b"")
    except FileExistsError:
        pass
    for d in man["layers"]:
        os.close(st.lock("blob-" + st.blob_path(d["digest"]).rpartition("/")[2]))
        st.ensure_blob(source, d, progress)


def _forget(st, gc):
    """After a failed pull: remove the blobs it fetched that no image
    needs, so bad input leaves nothing behind.  Only when no other pull
    runs (gc taken exclusively without waiting); else prune does it."""
    try:
        fcntl.flock(gc, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(gc)
        return
    try:
        from .layers import remove_unneeded
        if st._unpacked:
            remove_unneeded(st, st._unpacked)
        needed = needed_blobs(st)
        for d in st._fetched:
            if d not in needed:
                try:
                    os.unlink(st.blob_path(d), dir_fd=st.fd)
                except OSError:
                    pass
    finally:
        os.close(gc)


def _build(st, source, dig, man, raw, want, asked, progress, keep_blobs=False):
    st.put_bytes(dig, raw)
    st.ensure_blob(source, man["config"])
    conf = cfgmod.parse(st.read_blob(man["config"]["digest"]))
    cfgmod.check_platform(conf, want, asked)
    layers = man["layers"]
    if len(conf.diff_ids) != len(layers):
        raise ImageError(f"image {dig}: {len(layers)} layers but "
                         f"{len(conf.diff_ids)} diff_ids in its config", None)
    # A layer already unpacked needs no compressed blob (unless kept).
    fetch = [(d, diff_id) for d, diff_id in zip(layers, conf.diff_ids)
             if keep_blobs or not has_layer(st, diff_id)]
    if progress:
        progress("start", {"layers": len(layers),
                           "total": sum(d["size"] for d, _ in fetch if not st.has_blob(d))})
    for d in layers:
        if progress and (st.has_blob(d) or not any(d is f for f, _ in fetch)):
            progress("cached", d)
    for d, diff_id in fetch:
        st.ensure_blob(source, d, progress, None if keep_blobs else
                       lambda diff_id=diff_id: has_layer(st, diff_id))
    warned = set()

    def warn(line):
        if line not in warned and progress:
            warned.add(line)
            progress("warn", line)
    # Each layer the store lacks is unpacked alone (once across concurrent
    # pulls, several at a time); the image is then their merge.
    ensure_layers(st, man, conf, progress, warn)
    lk = st.lock("image-" + dig.partition(":")[2])
    try:
        if st.has_image(dig) and not st.unsealed(dig):
            return
        _unpack(st, dig, man, conf, progress)
    finally:
        os.close(lk)


def _replace_unsealed(st, dig):
    """Remove the unsealed tree an older gpusandbox published under this
    digest (the caller holds its image lock), unless a sandbox runs it."""
    from .storegc import remove_image
    held = st.try_exclusive(dig)
    if held is None:
        raise ImageError(f"image {dig[:19]} has no seal and a sandbox is running it",
                         "it is rebuilt only when no sandbox uses it",
                         "pull again once its sandboxes have ended")
    try:
        remove_image(st, dig)
    finally:
        if held != -1:
            os.close(held)


def _unpack(st, dig, man, conf, progress):
    from . import SEAL, dump_seal, layers
    tmp = st._staging_name("image")
    os.mkdir(tmp, 0o700, dir_fd=st.fd)
    sfd = os.open(tmp, _DIR, dir_fd=st.fd)
    try:
        os.mkdir("rootfs", 0o755, dir_fd=sfd)
        rootfd = os.open("rootfs", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                         | os.O_CLOEXEC, dir_fd=sfd)
        try:
            seal = layers.merge(st, conf.diff_ids, rootfd, os.geteuid() != 0)
        finally:
            os.close(rootfd)
        from ..testhook import pause
        pause("pull-unpack")        # tests: an interrupt with the tree half-built
        size = sum(d["size"] for d in man["layers"])
        from .sizes import tree_usage
        # "size" is the compressed layers' (what a pull fetches), "unpacked"
        # the tree's (what docker calls the image's size), "disk" what the
        # tree holds of its own (its directories: the files are the layers'
        # inodes): `images` and `inspect` show them.
        unpacked, _disk, own = tree_usage(sfd, "rootfs")
        rec = {"digest": dig, "config": man["config"]["digest"], "size": size,
               "unpacked": unpacked, "disk": own,
               "created": conf.created, "platform": mf.format_platform(conf.platform()),
               "layers": [d["digest"] for d in man["layers"]],
               "diff_ids": list(conf.diff_ids), "pulled": int(time.time())}
        for fname, data in (("image.json", json.dumps(rec).encode()), ("used", b""),
                            ("config.json", bundle_config(conf)),
                            (runrec.NAME, runrec.dump(man["config"]["digest"], conf))):
            st._write_new(sfd, fname, data)
        if st.shared:
            st._write_new(sfd, SEAL, dump_seal(seal))
        st._publish_mode(sfd, True)
        os.fsync(sfd)
        if st.has_image(dig):
            _replace_unsealed(st, dig)
        os.rename(tmp, st.image_dir(dig), src_dir_fd=st.fd, dst_dir_fd=st.fd)
    except BaseException:
        try:
            rmtree_at(st.fd, tmp)
        except OSError:
            pass       # the next pull or prune removes it (its lock is free then)
        raise
    finally:
        os.close(sfd)
