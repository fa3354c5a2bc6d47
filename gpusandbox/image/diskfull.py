"""A full store as one line that helps: the store's path, what is free and
how much the image needs, instead of `No space left on device` from
whichever write hit it (a blob's partial file, a layer's file, a record)."""
import errno
import os

from .digest import ImageError

FULL = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(fd):
    """Bytes an unprivileged writer may still use on the filesystem of fd."""
    try:
        s = os.fstatvfs(fd)
    except OSError:
        return None
    return s.f_bavail * s.f_frsize


def full_error(st, e, man=None):
    """The ImageError for OSError `e` when it says the store `st` is full
    (ENOSPC, EDQUOT), else None.  `man`: the image's manifest when known;
    its compressed size is what the pull needs at the least (the unpacked
    tree is larger, and known only once unpacked).  Called after the pull's
    clean-ups, so `free` counts what they gave back."""
    if e.errno not in FULL:
        return None
    from .sizes import human
    why = "disk quota exceeded" if e.errno == errno.EDQUOT else "no space left on device"
    free = free_bytes(st.fd)
    if free is not None:
        why += f": {human(free)} free"
    if man is not None:
        need = sum(d.get("size", 0) for d in [man.get("config", {})] + man.get("layers", []))
        why += (", and the image needs at least " if free is not None else
                ": the image needs at least ") + f"{human(need)} (its layers " \
            "compressed; more once unpacked)"
    return ImageError(f"the image store {st.root} is full", why,
                      "free space there ('gpusandbox prune' removes what no image needs, "
                      "'gpusandbox rmi' images) or use a store on a larger filesystem "
                      "(--store DIR or GPUSANDBOX_STORE)")
