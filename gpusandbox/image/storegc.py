"""Removal from the store: rmi and prune (the store's own primitives,
Store.unpublish and rmtree_at, are in store.py; layer directories no image
lists are layers.remove_unneeded's)."""
import fcntl
import os

from .digest import ImageError
from .layers import remove_unneeded
from .store import _DIR


def remove_image(st, dig):
    return st.unpublish(st.image_dir(dig))


def needed_blobs(st):
    """The blobs the store's images need: each one's manifest and config,
    and the compressed layers of those pulled with --keep-blobs (an image
    needs no layer blob once built: its files are the layers' inodes)."""
    from .store import keeps_blobs
    out = set()
    for d in st.image_digests():
        rec = st.image_record(d) or {}
        out.update((d, rec.get("config")))
        if keeps_blobs(st, d):
            out.update(rec.get("layers") or ())
    return out


def _remove_blobs(st, digests):
    """Unlink the blobs `digests` that are there; returns (count, bytes)."""
    n, freed = 0, 0
    for dig in digests:
        alg, _, name = dig.partition(":")
        if alg not in ("sha256", "sha512") or not name or "/" in name or name in (".", ".."):
            continue
        rel = f"blobs/{alg}/{name}"
        try:
            bst = os.stat(rel, dir_fd=st.fd, follow_symlinks=False)
            os.unlink(rel, dir_fd=st.fd)
        except OSError:
            continue
        n += 1
        freed += bst.st_blocks * 512
    return n, freed


def rmi(st, names_or_digests):
    """Remove refs (by name or manifest digest) and the images no ref
    names any more; all or nothing: an unknown item, or an image a running
    sandbox holds (Store.hold), changes nothing.  Returns [(what, digest)]."""
    gc = st.lock("gc")
    held = []
    try:
        refs = st.refs()
        plan = []
        for item in names_or_digests:
            targets = [(n, d) for n, d in refs if n == item or d == item
                       or (len(item) >= 12 and d.partition(":")[2].startswith(item))]
            if not targets and (item in st.image_digests()):
                targets = [(None, item)]
            if not targets:
                raise ImageError(f"no image {item[:120]!r} in the store {st.root}",
                                 None, "'gpusandbox images' lists them")
            plan += [t for t in targets if t not in plan]
        going = {n for n, _ in plan if n is not None}
        left = {d for n, d in refs if n not in going}
        for d in sorted({d for _, d in plan if d not in left}):
            fd = st.try_exclusive(d)
            if fd is None:
                raise ImageError(f"image {d[:19]} is in use by a running sandbox", None,
                                 "remove it when that sandbox has ended")
            held.append((d, fd))
        for n in going:
            st.remove_ref(n)
        gone = set()
        for d, _ in held:
            rec = st.image_record(d) or {}
            gone.update([d, rec.get("config")] + list(rec.get("layers") or ()))
            remove_image(st, d)
        if held:
            # Layers and blobs only the removed images listed go with them
            # (no pull runs: gc is held exclusively); what another image
            # lists stays.
            remove_unneeded(st)
            _remove_blobs(st, sorted(x for x in gone - needed_blobs(st) if x))
        return [(n or d, d) for n, d in plan]
    finally:
        for _, fd in held:
            if fd >= 0:
                os.close(fd)
        st.release_owner()
        os.close(gc)


def prune(st):
    """Remove images no ref names, blobs no image needs (needed_blobs), dead
    staging.  Returns (images removed, blobs removed, blob bytes freed)."""
    gc = st.lock("gc")
    try:
        st.clean_staging(partials=True)
        named = {d for _, d in st.refs()}
        n_img = 0
        for d in st.image_digests():
            if d not in named:
                fd = st.try_exclusive(d)
                if fd is not None:           # else in use: kept
                    remove_image(st, d)
                    n_img += 1
                    if fd >= 0:
                        os.close(fd)
        remove_unneeded(st)
        keep = needed_blobs(st)
        going = []
        for alg in ("sha256", "sha512"):
            bfd = os.open(f"blobs/{alg}", _DIR, dir_fd=st.fd)
            try:
                going += [f"{alg}:{h}" for h in os.listdir(bfd) if f"{alg}:{h}" not in keep]
            finally:
                os.close(bfd)
        n_blob, freed = _remove_blobs(st, going)
        lfd = os.open("locks", _DIR, dir_fd=st.fd)
        try:
            for name in os.listdir(lfd):
                if name.startswith(("blob-", "image-", "layer-")):
                    os.unlink(name, dir_fd=lfd)
                elif name.startswith("owner-"):
                    # a dead process's (its lock is free): a live one's stays
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=lfd)
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        os.unlink(name, dir_fd=lfd)
                    except OSError:
                        pass
                    finally:
                        os.close(fd)
        finally:
            os.close(lfd)
        return n_img, n_blob, freed
    finally:
        st.release_owner()
        os.close(gc)
