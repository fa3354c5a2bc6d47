"""Kernel-facing holes of the security audit (issue 17, items 3-5, 7, 9, D, E).

Each test runs the installed CLI as root and as the unprivileged test user
and checks what the command inside (or the host around it) can observe."""
import os
import re
import shutil
import subprocess

import pytest

from . import nsrun
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

@pytest.fixture
def guarded_parent():
    """A cgroup of our own with an allow-all device program attached by the
    test: exclusively (no flags: nothing may attach below) or with
    BPF_F_ALLOW_OVERRIDE (a program below replaces it).  Yields a function
    that attaches with the given flags and returns the parent's path."""
    from gpusandbox.linux import bpfdev
    mount = nsrun.cgroup2_mount()
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


# 3. capabilities that act on the host's network are dropped when it is shared --------

# Docker's default set minus CAP_MKNOD (capabilities(7) numbers), and what
# sharing the host's network namespace removes from it.
DOCKER_MINUS_MKNOD = (0, 1, 3, 4, 5, 6, 7, 8, 10, 13, 18, 29, 31)
HOST_NET_DROPPED = (10, 13)          # CAP_NET_BIND_SERVICE, CAP_NET_RAW

CAPS_AND_PACKET = (
    "import errno, socket\n"
    "print([l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0])\n"
    "try:\n"
    "    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)).close()\n"
    "    print('packet ok')\n"
    "except OSError as e:\n"
    "    print('packet', errno.errorcode[e.errno])\n")


def _mask(caps):
    return sum(1 << c for c in caps)


@pytest.mark.parametrize("net", [[], ["--net", "none"], ["--net", "host"]])
def test_root_caps_follow_the_network_namespace(root_runner, rootfs, net):
    r = root_runner.run([*net, str(rootfs), "python3", "-c", CAPS_AND_PACKET])
    assert r.returncode == 0, r.stderr
    cap_eff, packet = r.stdout.splitlines()
    if net == ["--net", "host"]:
        want = _mask(c for c in DOCKER_MINUS_MKNOD if c not in HOST_NET_DROPPED)
        assert packet == "packet EPERM", r.stdout     # no AF_PACKET on the host's interfaces
    else:                                              # root's default is a private namespace
        want = _mask(DOCKER_MINUS_MKNOD)
        assert packet == "packet ok", r.stdout         # only its own loopback to see
    assert int(cap_eff, 16) == want, (cap_eff, hex(want))


def test_rootless_root_shares_the_host_network_without_net_caps(rootless_runner, rootfs):
    r = rootless_runner.run(["--root", str(rootfs), "python3", "-c", CAPS_AND_PACKET])
    assert r.returncode == 0, r.stderr
    cap_eff, packet = r.stdout.splitlines()
    assert int(cap_eff, 16) == _mask(c for c in DOCKER_MINUS_MKNOD if c not in HOST_NET_DROPPED)
    assert packet == "packet EPERM", r.stdout
    assert _host_netns_inode() == _sandbox_netns_inode(rootless_runner, rootfs, ["--root"])


def _host_netns_inode():
    return os.stat("/proc/self/ns/net").st_ino


def _sandbox_netns_inode(runner, rootfs, opts=()):
    r = runner.run([*opts, str(rootfs), "python3", "-c",
                    "import os; print(os.stat('/proc/self/ns/net').st_ino)"])
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


# D. a root sandbox is not uid 0 to host daemons on abstract unix sockets ---------------

@pytest.fixture
def peercred_daemon():
    """A host daemon on an abstract unix socket in the host's network
    namespace that answers each client with the uid SO_PEERCRED gives it
    (what a daemon trusting uid-0 peers would check)."""
    import socket
    import struct
    import threading
    name = f"gsbx-test-peercred-{os.getpid()}-{os.urandom(3).hex()}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0" + name)
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except socket.timeout:
                continue
            with conn:
                cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
                conn.sendall(b"uid=%d\n" % struct.unpack("3i", cred)[1])
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield name
    stop.set()
    t.join()
    srv.close()


CONNECT = ("import errno, socket, sys\n"
           "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
           "try:\n"
           "    s.connect('\\0' + sys.argv[1])\n"
           "    print(s.recv(64).decode().strip())\n"
           "except OSError as e:\n"
           "    print('connect', errno.errorcode[e.errno])\n")


def test_root_sandbox_cannot_reach_host_abstract_sockets(root_runner, rootfs, peercred_daemon):
    r = root_runner.run([str(rootfs), "python3", "-c", CONNECT, peercred_daemon])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() in ("connect ECONNREFUSED", "connect ENOENT"), r.stdout
    assert _sandbox_netns_inode(root_runner, rootfs) != _host_netns_inode()
    # The explicit choice reaches it, as uid 0, and says nothing extra...
    r = root_runner.run(["--net", "host", str(rootfs), "python3", "-c", CONNECT, peercred_daemon])
    assert (r.returncode, r.stdout.strip(), r.stderr) == (0, "uid=0", "")
    # ...unless asked to.
    r = root_runner.run(["--verbose", "--net", "host", str(rootfs), "true"])
    assert "network: the host's (--net host)" in r.stderr, r.stderr


def test_root_with_user_and_rootless_keep_the_host_network(runner, rootfs, peercred_daemon,
                                                           test_user):
    # The command's uid on the host is not 0: a host daemon sees a uid it could
    # already talk to, so the host network stays the default.
    opts = ["--user", f"{test_user.pw_uid}:{test_user.pw_gid}"] if runner.mode == "root" else []
    r = runner.run([*opts, str(rootfs), "python3", "-c", CONNECT, peercred_daemon])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"uid={test_user.pw_uid}", r.stdout


# 7. /sys is sysfs alone; /sys/fs/cgroup shows only the sandbox's own cgroup ---------

KERNEL_FS = ("/sys/kernel/debug", "/sys/kernel/tracing", "/sys/kernel/security", "/sys/fs/bpf")

SYS_PROBE = (
    "import os, sys\n"
    "for p in sys.argv[1:]:\n"
    "    try:\n"
    "        print(p, sorted(os.listdir(p)))\n"
    "    except OSError as e:\n"
    "        print(p, 'absent', e.errno)\n"
    "cg = '/sys/fs/cgroup'\n"
    "print('cgdirs', sorted(n for n in os.listdir(cg) if os.path.isdir(os.path.join(cg, n))))\n"
    "print('cgfs', [l.split(' - ')[1].split()[0] for l in open('/proc/self/mountinfo')\n"
    "               if l.split()[4] == cg][-1:])\n"
    "print('procs', os.path.exists(cg + '/cgroup.procs'))\n"
    "print('pci', len(os.listdir('/sys/bus/pci/devices')) > 0, 'class', len(os.listdir('/sys/class')) > 0)\n")


def _with_kernel_mounts(runner, args):
    """argv that runs the CLI in a private mount namespace of the test whose
    /sys carries a canary tmpfs at each kernel interface's mount point (this
    host may have none mounted), as a host with debugfs & co. would."""
    setup = "; ".join(f"mount -t tmpfs -o size=64k gsbx-canary {p} && touch {p}/CANARY"
                      for p in KERNEL_FS)
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f"set -e; {setup}; exec \"$@\"", "sh"] + runner.argv(args)


def _host_cgroup_dirs():
    out = set()
    for base in ("/sys/fs/cgroup", nsrun.cgroup2_mount() or "/sys/fs/cgroup"):
        out |= {n for n in os.listdir(base) if os.path.isdir(os.path.join(base, n))}
    return out


def test_sys_has_no_kernel_interfaces_and_no_host_cgroups(runner, rootfs):
    assert _host_cgroup_dirs(), "the host shows no cgroup directories: nothing to hide"
    argv = _with_kernel_mounts(runner, [str(rootfs), "python3", "-c", SYS_PROBE, *KERNEL_FS])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=runner.env(),
                       cwd="/")
    assert r.returncode == 0, r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    for p in KERNEL_FS:
        assert out[p] == "[]" or out[p].startswith("absent"), (p, out[p])
    assert out["cgdirs"] == "[]", out["cgdirs"]           # no host cgroup, no v1 hierarchy
    assert out["pci"] == "True class True", out            # sysfs itself is there
    if runner.mode == "root":                              # its own leaf, as cgroup2
        assert (out["cgfs"], out["procs"]) == ("['cgroup2']", "True"), out


# 9. GPUSANDBOX_TEST_PAUSE is a test hook only the test install honours ----------------

def test_pause_variable_is_ignored_outside_the_test_install(rootfs, cli):
    import sys
    from gpusandbox.testhook import TEST_MARKER
    assert not (REPO / "gpusandbox" / TEST_MARKER).exists()
    # The project's own (editable) install, as any user's install would be.
    r = subprocess.run([sys.executable, "-m", "gpusandbox", "run", str(rootfs), "echo", "RAN"],
                       capture_output=True, text=True, timeout=60, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "GPUSANDBOX_TEST_PAUSE": "after-cgroup"})
    assert (r.returncode, r.stdout, r.stderr) == (0, "RAN\n", "")


def test_pause_variable_is_honoured_by_the_test_install(root_runner, rootfs):
    import signal
    p = root_runner.popen([str(rootfs), "true"], env={"GPUSANDBOX_TEST_PAUSE": "after-cgroup"})
    try:
        assert "paused at after-cgroup" in p.stderr.readline()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
