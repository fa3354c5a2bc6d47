"""Removal from the store: rmi, prune, a failed pull's blobs, and a
directory tree removed without following symlinks (images may hold
read-only directories)."""
import errno
import fcntl
import os

from .digest import ImageError
from .store import _DIR


def rmtree_at(dirfd, name):
    """Remove `name` under `dirfd` and everything below it, never following
    a symlink; directories an image made read-only are chmod'ed first."""
    stack = []
    try:
        os.unlink(name, dir_fd=dirfd)
        return
    except FileNotFoundError:
        return
    except (IsADirectoryError, PermissionError):
        pass
    except OSError as e:
        if e.errno != errno.EISDIR:
            raise
    fd = os.open(name, _DIR, dir_fd=dirfd)
    stack.append((dirfd, name, fd))
    while stack:
        pfd, pname, fd = stack[-1]
        try:
            os.fchmod(fd, 0o700)
        except OSError:
            pass
        descended = False
        for entry in os.listdir(fd):
            try:
                os.unlink(entry, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno not in (errno.EISDIR, errno.EPERM):
                    raise
                stack.append((fd, entry, os.open(entry, _DIR, dir_fd=fd)))
                descended = True
                break
        if descended:
            continue
        stack.pop()
        os.close(fd)
        os.rmdir(pname, dir_fd=pfd)


def unpublish(st, rel):
    """Rename a published directory (images/<hex>, layers/<id>) into tmp/,
    where no reader looks, then delete it; False when there was none."""
    tmp = st._staging_name("rm")
    try:
        os.rename(rel, tmp, src_dir_fd=st.fd, dst_dir_fd=st.fd)
    except FileNotFoundError:
        return False
    rmtree_at(st.fd, tmp)
    return True


def remove_image(st, dig):
    return unpublish(st, st.image_dir(dig))


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
            from .layers import remove_unneeded
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
        from .layers import remove_unneeded
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
