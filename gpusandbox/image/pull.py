"""Store.pull: fetch an image's blobs and unpack it into the store.

The manifest is checked against its digest, the config against the
platform, every layer's diff_id against the config; an image is built in a
staging directory and published by one rename (store.py describes the
layout, the locks and the staging rules)."""
import fcntl
import json
import os
import time

from . import config as cfgmod
from . import digest as digestmod
from . import manifest as mf
from . import runrec
from .digest import ImageError
from .store import _DIR, bundle_config
from .storegc import rmtree_at


def pull(st, source, names=None, platform=None, asked=False, progress=None):
    """Fetch and unpack the image `source` offers for `platform` and name
    it: `names` is a list of refs or a function of the source giving one
    (a docker-archive's names are known after its manifest is read); the
    refs are written under the gc lock, so no prune sees the image
    unnamed.  Returns its image record.  A full store is one line naming
    the store and the space needed (diskfull.py)."""
    seen = {}
    try:
        return _pull(st, source, names, platform, asked, progress, seen)
    except OSError as e:
        from .diskfull import full_error
        err = full_error(st, e, seen.get("manifest"))
        if err is None:
            raise
        raise err from None


def _pull(st, source, names, platform, asked, progress, seen):
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
    if present:
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
            _build(st, source, dig, man, raw, want, asked, progress)
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
        needed = set()
        for d in st.image_digests():
            rec = st.image_record(d) or {}
            needed.update([d, rec.get("config")] + list(rec.get("layers") or []))
        for d in st._fetched:
            if d not in needed:
                try:
                    os.unlink(st.blob_path(d), dir_fd=st.fd)
                except OSError:
                    pass
    finally:
        os.close(gc)


def _build(st, source, dig, man, raw, want, asked, progress):
    st.put_bytes(dig, raw)
    st.ensure_blob(source, man["config"])
    conf = cfgmod.parse(st.read_blob(man["config"]["digest"]))
    cfgmod.check_platform(conf, want, asked)
    layers = man["layers"]
    if len(conf.diff_ids) != len(layers):
        raise ImageError(f"image {dig}: {len(layers)} layers but "
                         f"{len(conf.diff_ids)} diff_ids in its config", None)
    if progress:
        progress("start", {"layers": len(layers),
                           "total": sum(d["size"] for d in layers
                                        if not st.has_blob(d))})
    for d in layers:
        if st.has_blob(d) and progress:
            progress("cached", d)
        st.ensure_blob(source, d, progress)
    from .layers import ensure_layers
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
        from .testpause import pause
        pause("pull-unpack")        # tests: an interrupt with the tree half-built
        size = sum(d["size"] for d in man["layers"])
        from .sizes import tree_bytes
        # "size" is the compressed layers' (what a pull fetches), "unpacked"
        # the tree's (what docker calls the image's size): `images` shows both.
        rec = {"digest": dig, "config": man["config"]["digest"], "size": size,
               "unpacked": tree_bytes(sfd, "rootfs"),
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
