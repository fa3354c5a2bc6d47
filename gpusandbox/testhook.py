"""The test suite's pause points: GPUSANDBOX_TEST_PAUSE=<name> stops a
launch stage or a pull at that point so a test can interrupt it there
(SIGINT, SIGTERM, SIGKILL) and check what is left.  Honoured only in the
test suite's install, never because of a variable in a user's or a job's
environment."""
import os

# The test suite's install (tests/testinstall.py) puts this file in the
# package directory; no other install has it, and the source tree never does
# (an editable install would otherwise carry it).
TEST_MARKER = "_pause_hook_enabled"


def pause_hook_enabled(pkg_dir=None):
    """Whether GPUSANDBOX_TEST_PAUSE may be honoured: only in an install
    holding TEST_MARKER as a regular file owned by root and writable by no one
    else."""
    import stat
    pkg_dir = pkg_dir or os.path.dirname(os.path.abspath(__file__))
    try:
        st = os.lstat(os.path.join(pkg_dir, TEST_MARKER))
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022


def stop(name):
    """Block here forever (until a signal ends the process), saying so."""
    os.write(2, f"gpusandbox: paused at {name}\n".encode())
    import _signal
    while True:
        _signal.pause()


def pause(name):
    """Stop at `name` when the environment asks for it and the install allows."""
    if os.environ.get("GPUSANDBOX_TEST_PAUSE") == name and pause_hook_enabled():
        stop(name)
