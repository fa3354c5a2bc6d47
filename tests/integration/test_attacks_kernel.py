"""Kernel-facing holes of the security audit (issue 17, items 3-5, 7, 9, D, E).

Each test runs the installed CLI as root and as the unprivileged test user
and checks what the command inside (or the host around it) can observe."""
import os
import re
import shutil
import subprocess

import pytest

from .conftest import REPO


# 5. the launcher never signals a child it has already reaped -----------------------

def _launcher_syscalls(runner, args, tmp_path):
    """strace of the launcher process alone (not its children): its kill,
    pidfd_send_signal and wait4 calls, and the run's exit status."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (scripts/setup installs it)")
    out = tmp_path / "trace"
    argv = ["strace", "-qq", "-o", str(out), "-e", "trace=kill,pidfd_send_signal,wait4",
            "--"] + runner.argv(args)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=runner.env(),
                       cwd="/")
    return r, out.read_text().splitlines()


@pytest.mark.parametrize("args,code", [
    (["ROOT", "no-such-command-4711"], 127),   # error record from the command stage
    (["ROOT", "/etc/passwd"], 126),            # exists but is not executable
    (["-w", "/etc/passwd", "ROOT", "true"], 125),   # init fails before the command
])
def test_reaped_child_is_never_signalled(runner, rootfs, tmp_path, args, code):
    args = [str(rootfs) if a == "ROOT" else a for a in args]
    r, lines = _launcher_syscalls(runner, args, tmp_path)
    assert r.returncode == code, r.stderr
    reaped = set()
    for line in lines:
        m = re.match(r"wait4\((\d+),.*\) = (\d+)", line)
        if m and m.group(1) == m.group(2):
            reaped.add(m.group(1))
            continue
        m = re.match(r"kill\((\d+), ", line)
        assert not (m and m.group(1) in reaped), f"signal to reaped pid: {line}\n" + "\n".join(lines)
        assert not (reaped and line.startswith("pidfd_send_signal")), "\n".join(lines)
    assert reaped, "\n".join(lines)
