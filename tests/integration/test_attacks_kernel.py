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


# 4. --best-effort-limits never removes the device filter ---------------------------

def _cgroup2_mount():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            if " - cgroup2 " in line:
                return line.split()[4]
    return None


@pytest.fixture
def guarded_parent():
    """A cgroup of our own with an allow-all device program attached by the
    test: exclusively (no flags: nothing may attach below) or with
    BPF_F_ALLOW_OVERRIDE (a program below replaces it).  Yields a function
    that attaches with the given flags and returns the parent's path."""
    from gpusandbox.linux import bpfdev
    mount = _cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 mount on this host")
    path = os.path.join(mount, f"gsbx-test-guard-{os.getpid()}-{os.urandom(3).hex()}")
    os.mkdir(path)
    held = []

    def attach(flags):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        prog = bpfdev.load(bpfdev.assemble([("c", None, None, "rwm"), ("b", None, None, "rwm")]))
        bpfdev.attach(fd, prog, flags)
        held.append((fd, prog))
        return path
    yield attach
    for fd, prog in held:
        try:
            bpfdev.detach(fd, prog)
        finally:
            os.close(fd)
            os.close(prog)
    for d in sorted((top for top, _, _ in os.walk(path)), key=len, reverse=True):
        os.rmdir(d)


@pytest.mark.parametrize("flags,needle", [
    (0, "device filter: cannot attach to"),
    (1, "would disable its device program"),       # BPF_F_ALLOW_OVERRIDE
])
def test_best_effort_limits_never_drops_the_device_filter(root_runner, rootfs, guarded_parent,
                                                          flags, needle):
    parent = guarded_parent(flags)
    r = root_runner.run(["--best-effort-limits", "--cgroup-parent", parent, str(rootfs),
                         "echo", "RAN"])
    assert r.returncode == 125 and "RAN" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("gpusandbox: error: ") and needle in r.stderr, r.stderr
    assert not [n for n in os.listdir(parent) if n.startswith("gpusandbox-")]


# E. no leases: F_SETLEASE is refused, other fcntl commands work ---------------------

LEASE = ("import errno, fcntl, os\n"
         "fd = os.open('/tmp/own', os.O_RDONLY | os.O_CREAT, 0o644)\n"
         "print('GETFL', fcntl.fcntl(fd, fcntl.F_GETFL) & 3)\n"
         "try:\n"
         "    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)\n"
         "    print('SETLEASE ok')\n"
         "except OSError as e:\n"
         "    print('SETLEASE', errno.errorcode[e.errno])\n"
         "print('GETLEASE', fcntl.fcntl(fd, fcntl.F_GETLEASE))\n"
         "print('uid', os.getuid(), 'owner', os.fstat(fd).st_uid)\n")


def test_setlease_refused_inside(runner, rootfs):
    r = runner.run([str(rootfs), "python3", "-c", LEASE])
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert "GETFL 0" in out and "SETLEASE EPERM" in out, r.stdout
    assert "GETLEASE 2" in out, r.stdout          # F_UNLCK: the call works, no lease held
    uid = "0" if runner.mode == "root" else str(runner.uid)
    assert f"uid {uid} owner {uid}" in out, r.stdout   # the kernel itself would allow it
