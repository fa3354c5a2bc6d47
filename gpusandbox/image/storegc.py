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
        for d, _ in held:
            remove_image(st, d)
        if held:
            # Layers only the removed images listed go with them; a layer
            # another image lists stays.
            remove_unneeded(st)
        return [(n or d, d) for n, d in plan]
    finally:
        for _, fd in held:
            if fd >= 0:
                os.close(fd)
        st.release_owner()
        os.close(gc)


def prune(st):
    """Remove images no ref names, blobs no image needs, dead staging.
    Returns (images removed, blobs removed, bytes freed)."""
    gc = st.lock("gc")
    try:
        st.clean_staging(partials=True)
        named = {d for _, d in st.refs()}
        n_img = 0
        keep = set()
        for d in st.image_digests():
            if d not in named:
                fd = st.try_exclusive(d)
                if fd is not None:           # else in use: kept with its blobs
                    remove_image(st, d)
                    n_img += 1
                    if fd >= 0:
                        os.close(fd)
                    continue
            rec = st.image_record(d) or {}
            keep.add(d)
            keep.add(rec.get("config"))
            keep.update(rec.get("layers") or [])
        remove_unneeded(st)
        n_blob, freed = 0, 0
        for alg in ("sha256", "sha512"):
            bfd = os.open(f"blobs/{alg}", _DIR, dir_fd=st.fd)
            try:
                for hexpart in os.listdir(bfd):
                    if f"{alg}:{hexpart}" in keep:
                        continue
                    try:
                        bst = os.stat(hexpart, dir_fd=bfd, follow_symlinks=False)
                        os.unlink(hexpart, dir_fd=bfd)
                    except OSError:
                        continue
                    n_blob += 1
                    freed += bst.st_size
            finally:
                os.close(bfd)
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
