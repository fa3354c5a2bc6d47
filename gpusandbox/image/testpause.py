"""Test hook: GPUSANDBOX_TEST_PAUSE=<name> stops a pull at that point so a
test can interrupt it there (SIGINT, SIGTERM, SIGKILL) and check what is
left.  Honoured only in the test suite's install, as the launch's pause
points are (stages/channel.pause_hook_enabled)."""
import os


def pause(name):
    if os.environ.get("GPUSANDBOX_TEST_PAUSE") != name:
        return
    from ..stages.channel import pause_hook_enabled
    if not pause_hook_enabled():
        return
    os.write(2, f"gpusandbox: paused at {name}\n".encode())
    import _signal
    while True:
        _signal.pause()
