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


def fail(err_w, code, what, why, hint=None):
    rec = f"{code}{SEP}{what}{SEP}{why or ''}{SEP}{hint or ''}\n"
    if AFTER_START and code == 125:
        from ..errors import SandboxError, printable
        try:
            os.write(AFTER_START[0], (printable(SandboxError(what, why).line()) + "\n")
                     .encode("utf-8", "replace"))
        except OSError:
            pass
    if PLAIN:
        from ..errors import SandboxError, message
        rec = message(SandboxError(what, why, hint))
    try:
        os.write(err_w, rec.encode("utf-8", "replace"))
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
