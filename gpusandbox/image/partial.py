"""Resumable blob downloads: what a cut-off or killed pull fetched of a blob
stays in the store's staging area, and the next pull (any process) goes on
from there with an HTTP Range request.

  ROOT/tmp/partial-<alg>-<hex>    the first bytes of blob <alg>:<hex>

One file per blob, not per writer: it is only opened, written, truncated or
removed while its blob's lock (locks/blob-<hex>) is held, so two pullers
never append to one, and a writer killed with SIGKILL leaves the file with
what reached it.  tmp/ is 0700 like the rest of the store; the file is
reused only when it is a regular file of the caller, mode 0600, one link,
and no longer than the blob, otherwise it is removed and the blob fetched
from its start.  Nothing in it is trusted: the resumed prefix is hashed
again with the rest, and a blob that fails its digest after a resume is
fetched once more from byte 0 before the pull gives up.  The file goes
when the blob is published, when the failure was not a transfer that may
succeed later (wrong digest, oversize, a write error), and at prune.

Only a source that can resume (the registry client, `resumable = True`)
keeps partial files; a local archive or layout is read again from its
start."""
import errno
import os
import stat

from . import digest as digestmod
from .digest import ImageError

PREFIX = "partial-"
_READ = 1 << 20


def rel_name(dig):
    alg, hexpart = digestmod.parse(dig)
    return f"tmp/{PREFIX}{alg}-{hexpart}"


def is_partial(name):
    return name.startswith(PREFIX)


def _discard(st, rel):
    try:
        os.unlink(rel, dir_fd=st.fd)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ImageError(f"cannot remove the stale partial download {st.root}/{rel}",
                         e.strerror, "remove it by hand, or run gpusandbox prune") from None


def _open(st, desc):
    """(fd, bytes already there) of the blob's partial file, opened O_RDWR;
    created empty when there is none or the one there is unusable."""
    rel = rel_name(desc["digest"])
    try:
        fd = os.open(rel, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
                     | os.O_NOCTTY, dir_fd=st.fd)
    except FileNotFoundError:
        fd = None
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.EACCES, errno.EPERM, errno.ENXIO,
                           errno.EISDIR, errno.ETXTBSY):
            raise
        fd = None           # a symlink, someone else's file, a socket: not ours to use
        _discard(st, rel)
    if fd is not None:
        s = os.fstat(fd)
        if stat.S_ISREG(s.st_mode) and s.st_uid == os.geteuid() and s.st_nlink == 1 \
                and stat.S_IMODE(s.st_mode) == 0o600 and 0 < s.st_size <= desc["size"]:
            return fd, s.st_size
        os.close(fd)
        _discard(st, rel)
    fd = os.open(rel, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=st.fd)
    return fd, 0


def _keep(exc):
    """Whether a failed fetch's bytes are worth resuming from: a transfer
    that broke (the client marks those) or the process being stopped."""
    if isinstance(exc, ImageError):
        return bool(getattr(exc, "resumable", False))
    return not isinstance(exc, (OSError, MemoryError))


def fetch(st, source, desc, writer_class, progress=None):
    """Fetch blob `desc` from `source` into the store (the blob lock held by
    the caller), resuming a partial file; publish it by rename."""
    rel = rel_name(desc["digest"])
    fd, have = _open(st, desc)
    try:
        for attempt in (0, 1):
            with os.fdopen(os.dup(fd), "r+b") as f:
                w = writer_class(f, desc, progress)
                if have:
                    _rehash(fd, w, have)
                    f.seek(have)
                    w.resumed = have
                    if progress:
                        progress("bytes", have)
                try:
                    # A whole blob kept (killed between the last write and
                    # the rename) needs no request: a Range past its end
                    # would be answered 416.
                    if have < desc["size"]:
                        source.blob(desc, w)
                    w.v.check()
                except ImageError:
                    if not have or attempt:
                        raise
                    # The kept prefix was not the blob's (a crash left a
                    # torn tail, or the registry's bytes changed): once more
                    # from the start.
                    f.seek(0)
                    f.truncate()
                    have = 0
                    continue
                st._publish_mode(f.fileno(), False)
                f.flush()
                os.fsync(f.fileno())
            os.rename(rel, st.blob_path(desc["digest"]), src_dir_fd=st.fd, dst_dir_fd=st.fd)
            return
    except BaseException as e:
        if not _keep(e):
            try:
                os.unlink(rel, dir_fd=st.fd)
            except OSError:
                pass
        raise
    finally:
        os.close(fd)


def _rehash(fd, w, have):
    """Feed the kept prefix through the writer's verifier (not through its
    file: the bytes are already there)."""
    off = 0
    while off < have:
        data = os.pread(fd, min(_READ, have - off), off)
        if not data:
            raise ImageError("a partial download shrank while it was read", None)
        w.v.update(data)
        off += len(data)
