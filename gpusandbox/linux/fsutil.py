"""Atomic file replacement: readers see the old file or the new one, never a
part of either."""
import os


def write_atomic(path, data, mode, tmp=None, fsync=False, chmod=False, best_effort=False):
    """Write `data` to a temporary file beside `path` and rename it over `path`.

    The temporary file is created with O_EXCL|O_NOFOLLOW: a file or symlink
    planted under its name is never written through.  `tmp` names it
    (default "<path>.<pid>.tmp", in the same directory so the rename is
    atomic).  `chmod` sets `mode` past the umask; `fsync` makes the contents
    durable before the rename publishes them.

    With best_effort (a cache: a failure only costs recomputing the entry)
    an OSError is swallowed, the temporary name removed whatever made it
    fail, and False returned.  Otherwise the error propagates, and only a
    temporary file this call created is removed."""
    if tmp is None:
        tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode)
    except OSError:
        if not best_effort:
            raise
        _unlink(tmp)         # a stale one left by a dead writer of the same pid
        return False
    try:
        try:
            if chmod:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        _unlink(tmp)
        if not best_effort:
            raise
        return False
    except BaseException:
        _unlink(tmp)
        raise
    return True


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass
