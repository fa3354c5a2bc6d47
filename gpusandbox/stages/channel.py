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


def fail(err_w, code, what, why, hint=None):
    rec = f"{code}{SEP}{what}{SEP}{why or ''}{SEP}{hint or ''}\n"
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


# The test suite's install (tests/integration/conftest.py) puts this file
# next to this module; no other install has it, and the source tree never
# does (an editable install would otherwise carry it).
TEST_MARKER = "_pause_hook_enabled"


def pause_hook_enabled(pkg_dir=None):
    """Whether GPUSANDBOX_TEST_PAUSE may be honoured: only in an install
    holding TEST_MARKER as a regular file owned by root and writable by no one
    else, so that a variable in a user's (or a job's) environment can never
    freeze a real launch."""
    import stat
    pkg_dir = pkg_dir or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        st = os.lstat(os.path.join(pkg_dir, TEST_MARKER))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def pause_point(plan, name):
    """Test hook: GPUSANDBOX_TEST_PAUSE=<name> stops this stage so a test can
    SIGKILL the launcher there and check that nothing is left behind.  Only in
    the test suite's install (pause_hook_enabled)."""
    if plan.spec.pause_at == name:
        os.write(2, f"gpusandbox: paused at {name}\n".encode())
        import _signal
        while True:
            _signal.pause()
