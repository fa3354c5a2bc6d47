"""The error channel from the sandbox's stages to the launcher.

A CLOEXEC pipe: init and the command write at most one record and exit;
a successful execve closes the command's copy, so EOF with no record means
the command started.  Record: code, what failed, why, hint, separated by
0x1f and ended by a newline.
"""
import os

SEP = "\x1f"


def fail(err_w, code, what, why, hint=None):
    rec = f"{code}{SEP}{what}{SEP}{why or ''}{SEP}{hint or ''}\n"
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
    SIGKILL the launcher there and check that nothing is left behind."""
    if plan.spec.pause_at == name:
        os.write(2, f"gpusandbox: paused at {name}\n".encode())
        import _signal
        while True:
            _signal.pause()
