"""A detached sandbox's log: live/NAME/log, bounded.

The launcher's stdout and stderr (and so the command's, and the launcher's
own messages) are a pipe into one small writer process, forked before the
sandbox, which appends what it reads to the log and, once the file passes
LOG_MAX, keeps its newest half (rewritten beside it and renamed over it:
`logs -f` notices the new file).  The writer ends when every writer of the
pipe has: the launcher, and with it the sandbox.  It sits in the launcher's
session with every signal blocked, so a signal meant for the sandbox never
loses its output.
"""
import os

from . import record

LOG_MAX = 8 << 20
_OPEN = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


def start_writer(dfd, limit=LOG_MAX):
    """Fork the writer; returns the pipe's write end (the caller's)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid:
        os.close(r)
        return w
    try:
        import _signal
        _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals() - {9, 19})
        os.close(w)
        # Nothing of the launcher's stays open here but the pipe and the
        # record's directory (the ready pipe above all: the foreground
        # waits for its writers).
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and fd not in (r, dfd):
                try:
                    os.close(fd)
                except OSError:
                    pass
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        _write_loop(r, dfd, limit)
    finally:
        os._exit(0)


def _write_loop(r, dfd, limit):
    out = os.open(record.LOG, _OPEN, 0o600, dir_fd=dfd)
    size = os.fstat(out).st_size
    while True:
        data = os.read(r, 65536)
        if not data:
            return
        os.write(out, data)
        size += len(data)
        if size > limit:
            os.close(out)
            size = _keep_tail(dfd, limit // 2)
            out = os.open(record.LOG, _OPEN, 0o600, dir_fd=dfd)


def _keep_tail(dfd, keep):
    """The log's newest `keep` bytes, from the start of a line, renamed
    over it; returns the new size."""
    fd = os.open(record.LOG, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    try:
        size = os.fstat(fd).st_size
        tail = os.pread(fd, keep, max(0, size - keep))
    finally:
        os.close(fd)
    nl = tail.find(b"\n")
    if 0 <= nl < len(tail) - 1:
        tail = tail[nl + 1:]
    record.replace(dfd, record.LOG, tail)
    return len(tail)


def read_log(dfd, follow=False, out=1, alive=None):
    """Copy the log to `out`; with `follow`, keep copying what is appended
    (and across a rotation) while alive() says the sandbox runs."""
    import time
    fd = _open(dfd)
    if fd is None and not follow:
        return
    try:
        while True:
            if fd is not None:
                while True:
                    data = os.read(fd, 65536)
                    if not data:
                        break
                    os.write(out, data)
            if not follow:
                return
            if alive is not None and not alive():
                if fd is not None:
                    _drain(fd, out)
                return
            time.sleep(0.2)
            now = _open(dfd)
            if now is not None and (fd is None or os.fstat(now).st_ino != os.fstat(fd).st_ino):
                if fd is not None:
                    _drain(fd, out)
                    os.close(fd)
                fd = now
            elif now is not None:
                os.close(now)
    finally:
        if fd is not None:
            os.close(fd)


def _drain(fd, out):
    while True:
        data = os.read(fd, 65536)
        if not data:
            return
        os.write(out, data)


def _open(dfd):
    from .. import rundir
    try:
        fd = os.open(record.LOG, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=dfd)
    except FileNotFoundError:
        return None
    import stat
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise rundir.Taken(record.LOG, "not a regular file of yours", True)
    return fd
