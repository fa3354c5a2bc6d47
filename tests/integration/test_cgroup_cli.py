"""The sandbox's cgroup as a user sees it (issue 4, 'Verified'): the BPF
device filter, its cleanup, resource limits and --cgroup-parent, through the
installed CLI, as root and as an unprivileged user.

The filter is observed where only it can decide: the command reopens, through
/proc/self/fd/0, a device node the caller passed as an O_PATH stdin.  The
node lives on a host filesystem mounted without nodev, so the open reaches
the device cgroup check and then the driver: EPERM means the filter refused
it, ENXIO that it let it through to a major without a driver (the simulated
host's nodes).  A -v bind cannot serve here: the launcher mounts every bind
nodev, so any node under it fails with EACCES before the filter is asked
(test_bound_device_nodes_are_nodev).

The filter, leaf, cleanup and --cgroup-parent tests run in both host layouts
(cg_layout): hybrid (cgroup2 at /sys/fs/cgroup/unified beside v1 hierarchies)
and pure cgroup v2 (cgroup2 at /sys/fs/cgroup, what current HPC nodes run).
A machine with one of them shows the launcher the other where it can: on a
hybrid host the launch runs in a private mount namespace whose
/sys/fs/cgroup is the cgroup2 hierarchy alone (nsrun.py).
"""
import ctypes
import os
import re
import signal
import stat
import struct
import subprocess
import time

import pytest

from . import nsrun
from .conftest import Runner, kill_quietly, pids_with, wait_for

UNIFIED = "/sys/fs/cgroup/unified"
REOPEN = ("import errno, os\n"
          "try:\n"
          "    os.open('/proc/self/fd/0', os.O_RDWR)\n"
          "    print('OK')\n"
          "except OSError as e:\n"
          "    print(errno.errorcode[e.errno])\n")


def _cgroup2_at_unified():
    try:
        with open("/proc/self/mountinfo") as f:
            return any(ln.split()[4] == UNIFIED and " - cgroup2 " in ln for ln in f)
    except OSError:
        return False


def _v1_bound(controller):
    try:
        with open("/proc/cgroups") as f:
            for line in f:
                fields = line.split()
                if fields and fields[0] == controller:
                    return fields[1] != "0"
    except OSError:
        pass
    return False


needs_hybrid = pytest.mark.skipif(not _cgroup2_at_unified(),
                                  reason=f"needs the hybrid layout (cgroup2 at {UNIFIED})")


@pytest.fixture(params=["hybrid", "pure-v2"])
def cg_layout(request):
    lay, why = nsrun.layout(request.param)
    if lay is None:
        pytest.skip(f"{request.param} cgroup layout: {why}")
    return lay


class LayoutRunner(Runner):
    """A Runner whose launches see the cgroup layout `layout`."""

    def __init__(self, runner, layout):
        super().__init__(runner.cli, runner.mode, runner.user)
        self.layout = layout

    def argv(self, args):
        return self.layout.wrap(super().argv(args))


@pytest.fixture
def lrunner(runner, cg_layout):
    return LayoutRunner(runner, cg_layout)


@pytest.fixture
def lroot_runner(root_runner, cg_layout):
    return LayoutRunner(root_runner, cg_layout)


def notes(stderr):
    """(leaf path, BPF program id) from --verbose lines."""
    leaf = re.search(r"^gpusandbox: cgroup: (/\S+)$", stderr, re.M)
    prog = re.search(r"^gpusandbox: device filter: BPF program id (\d+) attached", stderr, re.M)
    return (leaf.group(1) if leaf else None), (int(prog.group(1)) if prog else None)


def read_verbose(proc, want=2, timeout=20):
    """stderr lines of a running launcher until `want` setup notes arrived."""
    lines = []
    end = time.monotonic() + timeout
    while time.monotonic() < end and len([ln for ln in lines if "cgroup: /" in ln
                                          or "BPF program id" in ln]) < want:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
    return "".join(lines)


def sandbox_pids(marker):
    """{comm: pid} of the sandbox's init and command once the command runs
    (the launcher and init share the launcher's command line)."""
    def found():
        out = {}
        for pid in pids_with(marker):
            try:
                with open(f"/proc/{pid}/comm") as f:
                    out[f.read().strip()] = pid
            except OSError:
                pass
        return out if {"sleep", "gpusandbox-init"} <= set(out) else None
    return wait_for(found) or {}


def prog_alive(ident):
    from gpusandbox.linux import bpfdev
    return bpfdev.prog_alive(ident)


def prog_info(ident):
    """(type, name) of a loaded BPF program, by id (struct bpf_prog_info:
    type at 0, name[16] at 64)."""
    from gpusandbox.linux import bpfdev
    from gpusandbox.linux import sys as k
    attr = ctypes.create_string_buffer(128)
    struct.pack_into("=I", attr, 0, ident)
    fd = k.syscall("bpf", ctypes.c_int(bpfdev.BPF_PROG_GET_FD_BY_ID), ctypes.byref(attr),
                   ctypes.c_uint(len(attr)))
    try:
        info = ctypes.create_string_buffer(80)
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("=IIQ", attr, 0, fd, len(info), ctypes.addressof(info))
        k.syscall("bpf", ctypes.c_int(bpfdev.BPF_OBJ_GET_INFO_BY_FD), ctypes.byref(attr),
                  ctypes.c_uint(len(attr)))
    finally:
        os.close(fd)
    return struct.unpack_from("=I", info, 0)[0], info.raw[64:80].split(b"\0")[0].decode()


def attached(leaf):
    from gpusandbox.linux import bpfdev
    fd = os.open(leaf, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return bpfdev.query(fd)[1]
    finally:
        os.close(fd)


def assert_released(leaf, prog):
    assert wait_for(lambda: not os.path.exists(leaf), timeout=10), f"{leaf} left behind"
    # cgroup_bpf_release runs from a workqueue once the cgroup is freed.
    assert wait_for(lambda: not prog_alive(prog), timeout=10), f"BPF program {prog} still loaded"


# --- the device filter ------------------------------------------------------------------

@pytest.fixture
def block_node(runner, shared_tmp):
    """A block device node (loop0's numbers) on a filesystem without nodev,
    owned by the user the launch runs as."""
    path = shared_tmp / "blk"
    os.mknod(path, 0o600 | stat.S_IFBLK, os.makedev(7, 0))
    os.chown(path, runner.uid, runner.gid)
    return path


def reopen_in_sandbox(runner, sim, rootfs, node):
    fd = os.open(node, os.O_PATH | os.O_CLOEXEC)
    try:
        r = subprocess.run(runner.argv(["--verbose", "--driver-root", sim.root, "--gpus", "0,1",
                                        str(rootfs), "python3", "-c", REOPEN]),
                           stdin=fd, capture_output=True, text=True, timeout=60,
                           env=runner.env(), cwd="/")
    finally:
        os.close(fd)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip(), r.stderr


def test_filter_refuses_unselected_nodes(lrunner, sim_host, rootfs, block_node):
    runner = lrunner
    gpu2, why2 = reopen_in_sandbox(runner, sim_host, rootfs, f"{sim_host.root}/dev/nvidia2")
    gpu0, why0 = reopen_in_sandbox(runner, sim_host, rootfs, f"{sim_host.root}/dev/nvidia0")
    blk, _ = reopen_in_sandbox(runner, sim_host, rootfs, str(block_node))
    # GPU 0 is selected: the filter lets it through, the (absent) driver answers.
    assert gpu0 == "ENXIO"
    if runner.mode == "root":
        assert gpu2 == "EPERM" and blk == "EPERM"
        leaf, prog = notes(why2)
        assert prog is not None, why2
        assert os.path.dirname(leaf) == runner.layout.mount, why2
    else:
        # Rootless: no filter, and --verbose says so rather than hiding it.
        assert gpu2 == "ENXIO" and blk != "EPERM"
        assert "gpusandbox: device filter: not applied (rootless" in why2, why2
        assert "BPF program" not in why2


def test_bound_device_nodes_are_nodev(runner, sim_host, rootfs):
    dev = f"{sim_host.root}/dev"
    code = ("import errno, os\n"
            "for p in ('/dev/nvidia0', '/dev/nvidia2', '/hostdev/nvidia0'):\n"
            "    try:\n        os.open(p, os.O_RDWR); print('OK')\n"
            "    except OSError as e:\n        print(errno.errorcode[e.errno])\n")
    r = runner.run(["--driver-root", sim_host.root, "--gpus", "0", "-v", f"{dev}/nvidia2:/dev/nvidia2",
                    "-v", f"{dev}:/hostdev", str(rootfs), "python3", "-c", code])
    assert r.returncode == 0, r.stderr
    # The injected node reaches the driver; -v binds never open a device.
    assert r.stdout.split() == ["ENXIO", "EACCES", "EACCES"]


# --- leaf and program lifecycle (root) ------------------------------------------------

def test_running_sandbox_sits_in_our_leaf_with_our_program(lroot_runner, rootfs):
    marker = "876.54321"
    lay = lroot_runner.layout
    p = lroot_runner.popen(["--verbose", str(rootfs), "sleep", marker])
    try:
        seen, prog = notes(read_verbose(p))
        assert seen and prog, "no cgroup/BPF notes under --verbose"
        assert os.path.dirname(seen) == lay.mount and os.path.basename(seen).startswith(
            f"gpusandbox-{p.pid}-")
        leaf = lay.host(seen)
        pids = sandbox_pids(marker)
        with open(f"{leaf}/cgroup.procs") as f:
            members = f.read().split()
        assert sorted(members) == sorted([str(pids["gpusandbox-init"]), str(pids["sleep"])])
        with open(f"/proc/{pids['sleep']}/cgroup") as f:
            assert f"0::/{os.path.basename(leaf)}\n" in f.read()
        assert attached(leaf) == [prog]
        assert prog_info(prog) == (15, "gpusandbox_dev")   # BPF_PROG_TYPE_CGROUP_DEVICE
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 143
    finally:
        kill_quietly(p)
    assert_released(leaf, prog)


def test_cleanup_after_command_killed(lroot_runner, rootfs):
    r = lroot_runner.run(["--verbose", str(rootfs), "sh", "-c", "kill -9 $$"])
    assert r.returncode == 137, r.stderr
    leaf, prog = notes(r.stderr)
    assert leaf and prog, r.stderr
    assert os.path.dirname(leaf) == lroot_runner.layout.mount, r.stderr
    assert_released(lroot_runner.layout.host(leaf), prog)


def test_cleanup_after_launcher_sigkill(lroot_runner, rootfs):
    marker = "765.43219"
    lay = lroot_runner.layout
    p = lroot_runner.popen(["--verbose", str(rootfs), "sleep", marker])
    try:
        leaf, prog = notes(read_verbose(p))
        assert leaf and prog
        assert os.path.dirname(leaf) == lay.mount
        assert wait_for(lambda: pids_with(marker))
    finally:
        kill_quietly(p)
    assert wait_for(lambda: not pids_with(marker)), "sandbox survived its launcher"
    # The next launch under the same parent removes the orphaned leaf (or a
    # concurrent launch under the same parent did already).
    r = lroot_runner.run(["--verbose", str(rootfs), "true"])
    assert r.returncode == 0, r.stderr
    assert_released(lay.host(leaf), prog)
    new_leaf, new_prog = notes(r.stderr)
    assert new_leaf != leaf
    assert_released(lay.host(new_leaf), new_prog)


# --- limits -----------------------------------------------------------------------

# Root's limits on this hybrid host go to v1 leaves: tests/integration/test_cgroup_v1.py
# (with a parent of the test's own, never the cgroups the test runner sits in).

@needs_hybrid
def test_memory_limit_rootless_on_hybrid_host(rootless_runner, rootfs):
    r = rootless_runner.run(["--memory", "256m", str(rootfs), "true"])
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("gpusandbox: error: "), r.stderr
    # No writable cgroup: the limit cannot be set, and the user is told how to get one.
    assert "memory (--memory)" in lines[0] and "not writable" in lines[0]
    assert lines[1].startswith("hint: ") and "--cgroup-parent" in lines[1]


@needs_hybrid
def test_best_effort_pids_limit_rootless(rootless_runner, rootfs):
    r = rootless_runner.run(["--verbose", "--pids-limit", "50", "--best-effort-limits",
                             str(rootfs), "true"])
    assert r.returncode == 0, r.stderr
    assert re.search(r"pids \(--pids-limit\).*continuing: --best-effort-limits", r.stderr), \
        r.stderr
    r = rootless_runner.run(["--pids-limit", "50", "--best-effort-limits", str(rootfs), "true"])
    assert r.returncode == 0 and "--pids-limit" in r.stderr, r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--memory", "bogus"], "--memory bogus: not a size"),
    (["--memory", "1k"], "--memory 1k: below the 6 MiB minimum"),
    (["--pids-limit", "0"], "--pids-limit 0: not a positive number"),
    (["--cpus", "abc"], "--cpus abc: out of range"),
])
def test_bad_limit_is_a_usage_error(runner, rootfs, args, needle):
    r = runner.run([*args, str(rootfs), "true"])
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert lines[0] == f"gpusandbox: error: {needle}"
    assert lines[1].startswith("hint: ")


# --- --cgroup-parent ----------------------------------------------------------------

@pytest.fixture
def test_parent(cg_layout):
    """A parent cgroup made for the test, as the test process reaches it."""
    path = os.path.join(cg_layout.host_mount,
                        f"gsbx-test-parent-{os.getpid()}-{os.urandom(3).hex()}")
    os.mkdir(path)
    yield path
    rmdir_tree(path)


def rmdir_tree(path):
    """Remove a test's cgroup directory and every cgroup below it, deepest
    first (cgroup directories go with rmdir only), leaving what is busy."""
    for d in sorted((top for top, _, _ in os.walk(path)), key=len, reverse=True):
        try:
            os.rmdir(d)
        except OSError:
            pass


def test_cgroup_parent_holds_the_leaf(lroot_runner, rootfs, test_parent):
    marker = "654.32198"
    lay = lroot_runner.layout
    name = os.path.basename(test_parent)
    parent = lay.launcher(test_parent)
    p = lroot_runner.popen(["--verbose", "--cgroup-parent", parent, str(rootfs), "sleep",
                            marker])
    try:
        leaf, prog = notes(read_verbose(p))
        assert leaf and os.path.dirname(leaf) == parent
        pids = sandbox_pids(marker)
        with open(f"/proc/{pids['sleep']}/cgroup") as f:
            line = next(ln for ln in f.read().splitlines() if ln.startswith("0::"))
        assert line == f"0::/{name}/{os.path.basename(leaf)}"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 143
    finally:
        kill_quietly(p)
    assert_released(lay.host(leaf), prog)
    # The parent as /proc/<pid>/cgroup names it works too.
    r = lroot_runner.run(["--verbose", "--cgroup-parent", f"/{name}", str(rootfs), "true"])
    assert r.returncode == 0, r.stderr
    assert os.path.dirname(notes(r.stderr)[0]) == parent
    assert not [n for n in os.listdir(test_parent) if n.startswith("gpusandbox-")]


def test_missing_cgroup_parent(lrunner, rootfs):
    missing = f"{lrunner.layout.mount}/gsbx-test-no-such-parent"
    r = lrunner.run(["--cgroup-parent", missing, str(rootfs), "true"])
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert lines[0].startswith(f"gpusandbox: error: --cgroup-parent {missing}: no such cgroup "
                               f"({missing})"), r.stderr
    assert lines[1].startswith("hint: ")


def test_rootless_leaf_in_a_delegated_subtree(rootless_runner, rootfs, cg_layout):
    """A user whose cgroup is delegated (systemd Delegate=yes: the directory,
    cgroup.procs and cgroup.subtree_control are theirs) gets a leaf there;
    the device filter is still reported as not applied."""
    import shlex
    rootless_runner = LayoutRunner(rootless_runner, cg_layout)
    deleg = f"{cg_layout.host_mount}/gsbx-test-deleg-{os.getpid()}-{os.urandom(3).hex()}"
    os.mkdir(deleg)
    try:
        for name in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
            os.chown(os.path.join(deleg, name) if name else deleg,
                     rootless_runner.uid, rootless_runner.gid)
        # As a session manager would: the user's processes start inside it.
        launch = shlex.join(rootless_runner.argv(
            ["--verbose", str(rootfs), "sh", "-c", "cat /proc/self/cgroup"]))
        r = subprocess.run(["sh", "-c", f"echo $$ > {deleg}/cgroup.procs && exec {launch}"],
                           capture_output=True, text=True, timeout=60, env=rootless_runner.env())
        assert r.returncode == 0, r.stderr
        assert f"cgroup: {cg_layout.launcher(deleg)}/gpusandbox-" in r.stderr, r.stderr
        assert "device filter: not applied (rootless" in r.stderr
        # Inside, the cgroup namespace is rooted at the leaf.
        assert "0::/\n" in r.stdout
        assert not [n for n in os.listdir(deleg) if n.startswith("gpusandbox-")]
    finally:
        os.rmdir(deleg)


def test_device_option_adds_a_node_the_filter_allows(runner, sim_host, rootfs):
    """--device passes a host character device (e.g. an InfiniBand verbs node)
    by number: it opens inside (ENXIO: no driver behind it here), where a node
    that was not granted is refused by the filter (root) or absent."""
    node = os.path.join(str(sim_host), "dev", "nvidia2")
    r = runner.run(["--device", f"{node}:/dev/infiniband/uverbs0", str(rootfs), "python3", "-c",
                    "import os, errno\n"
                    "try:\n"
                    "    os.open('/dev/infiniband/uverbs0', os.O_RDWR)\n"
                    "    print('opened')\n"
                    "except OSError as e:\n"
                    "    print(errno.errorcode[e.errno])\n"
                    "print(sorted(os.listdir('/dev/infiniband')))\n"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["ENXIO", "['uverbs0']"]


@pytest.mark.parametrize("arg,needle", [
    ("/etc/passwd", "not a character device"),
    ("/no/such/node", "No such file or directory"),
    ("/dev/null:/opt/null", "DST under /dev"),
])
def test_device_option_bad_input(runner, rootfs, arg, needle):
    r = runner.run(["--device", arg, str(rootfs), "true"])
    assert r.returncode == 125
    assert r.stderr.startswith("gpusandbox: error: ") and needle in r.stderr.splitlines()[0]
