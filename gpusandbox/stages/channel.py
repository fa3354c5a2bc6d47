"""The error channel from the sandbox's stages to the launcher.

A CLOEXEC pipe: init and the command write at most one record and exit;
a successful execve closes the command's copy, so EOF with no record means
the command started.  Record: code, what failed, why, hint, separated by
0x1f and ended by a newline.
"""
import os

SEP = "\x1f"


# Set in a detached (OCI) init once its `create` has gone: failures are then
# written as text to the container's own stderr, where conmon logs them.
PLAIN = []
# Set in an OCI init after `start`: the exec fifo's write end (CLOEXEC),
# held until the execve, on which a setup failure (exit 125) is also written
# as one line for `start`, which reads the fifo to EOF (oci/runtime/ops.py,
# bin/gpusandbox-oci).  The workload's own 126 and 127 are its status.
AFTER_START = []


# A record is at most RECORD_MAX bytes: written in one piece that never
# waits, even when nobody reads the channel until init has exited (the
# launcher without a terminal reads it then: stages/parent._supervise).  Two
# records (init's and the command's) fit in a pipe of a single page, the
# least a pipe holds (pipe(7): a user past pipe-user-pages-soft gets that).
RECORD_MAX = 2048


def record(code, what, why, hint=None):
    """The record's bytes; a what, why or hint that would not fit (an
    argv[0] of 100 KB in "command not found") is cut short with "..."."""
    def clip(s):
        return "" if s is None else s if len(s) <= 400 else s[:400] + "..."
    data = f"{code}{SEP}{what}{SEP}{why or ''}{SEP}{hint or ''}".encode("utf-8", "replace")
    if len(data) >= RECORD_MAX:
        data = f"{code}{SEP}{clip(what)}{SEP}{clip(why)}{SEP}{clip(hint)}" \
            .encode("utf-8", "replace")[:RECORD_MAX - 1]
    return data + b"\n"


def fail(err_w, code, what, why, hint=None):
    rec = record(code, what, why, hint)
    if AFTER_START and code == 125:
        from ..errors import SandboxError, printable
        try:
            os.write(AFTER_START[0], (printable(SandboxError(what, why).line()) + "\n")
                     .encode("utf-8", "replace"))
        except OSError:
            pass
    if PLAIN:
        from ..errors import SandboxError, message
        rec = message(SandboxError(what, why, hint)).encode("utf-8", "replace")
    try:
        os.write(err_w, rec)
    except OSError:
        pass
    os._exit(code)


def parse(buf):
    """(code, what, why, hint) of the first record, or None."""
    if not buf:
        return None
    line = buf.decode("utf-8", "replace").split("\n", 1)[0]
    parts = line.split(SEP)
    if len(parts) != 4 or not parts[0].isdigit():
        return (125, "sandbox setup failed", line.strip() or None, None)
    return int(parts[0]), parts[1], parts[2] or None, parts[3] or None


def pause_point(plan, name):
    """Test hook: GPUSANDBOX_TEST_PAUSE=<name> stops this stage so a test can
    SIGKILL the launcher there and check that nothing is left behind.  Only in
    the test suite's install (pause_hook_enabled)."""
    if plan.spec.pause_at == name:
        from ..testhook import stop
        stop(name)
