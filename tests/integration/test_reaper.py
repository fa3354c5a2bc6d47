"""A launcher killed with SIGKILL leaves nothing behind, with no later launch:
its reaper (gpusandbox/linux/reaper.py) removes the cgroup leaf and with it
the BPF device program.  The bound is the property itself (issue 16, item 5):
within 2 s of the launcher's death no process, leaf or program of the sandbox
remains; a member that takes its SIGKILL only later (uninterruptible sleep)
is waited for, and the leaf goes once it has.  Each test uses a cgroup parent of its own, so no other launch's
stale-leaf cleanup can do the reaper's work.
"""
import fcntl
import os
import shlex
import shutil
import signal
import subprocess

import pytest

from . import nsrun
from .conftest import comm, kill_quietly, pids_with, wait_for
from .test_cgroup_cli import notes, prog_alive, read_verbose, rmdir_tree

BOUND = 2.0


@pytest.fixture
def parent():
    mount = nsrun.cgroup2_mount()
    if mount is None:
        pytest.skip("no cgroup2 hierarchy")
    path = os.path.join(mount, f"gsbx-test-reaper-{os.getpid()}-{os.urandom(3).hex()}")
    os.mkdir(path)
    yield path
    rmdir_tree(path)


def _leaves(parent):
    return [n for n in os.listdir(parent) if n.startswith("gpusandbox-")]


def _kill_and_check(p, marker, leaf, prog=None):
    assert wait_for(lambda: len(pids_with(marker)) >= 3), "sandbox did not start"
    # The reaper names itself once it first runs, which on a loaded machine
    # can come after the sandbox's command has started.
    reapers = wait_for(lambda: [pid for pid in pids_with(marker)
                                if comm(pid) == "gpusandbox-reap"])
    assert len(reapers) == 1, "no reaper next to the launcher"
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    assert wait_for(lambda: not pids_with(marker), timeout=BOUND), \
        f"processes left: {[(x, comm(x)) for x in pids_with(marker)]}"
    assert wait_for(lambda: not os.path.exists(leaf), timeout=BOUND), f"{leaf} left behind"
    if prog is not None:
        # cgroup_bpf_release runs from a workqueue once the removed cgroup is freed.
        assert wait_for(lambda: not prog_alive(prog), timeout=BOUND), f"program {prog} left"



def test_launcher_sigkill_leaves_nothing_root(root_runner, rootfs, parent):
    marker = "543.21987"
    p = root_runner.popen(["--verbose", "--cgroup-parent", parent, str(rootfs), "sleep", marker])
    try:
        leaf, prog = notes(read_verbose(p))
        assert leaf and prog and os.path.dirname(leaf) == parent
        _kill_and_check(p, marker, leaf, prog)
        assert _leaves(parent) == []
    finally:
        kill_quietly(p)


def test_launcher_sigkill_leaves_nothing_rootless_delegated(rootless_runner, rootfs, parent):
    """A user's delegated subtree (systemd Delegate=yes), as in
    test_cgroup_cli.test_rootless_leaf_in_a_delegated_subtree."""
    for name in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
        os.chown(os.path.join(parent, name) if name else parent,
                 rootless_runner.uid, rootless_runner.gid)
    marker = "432.19876"
    launch = shlex.join(rootless_runner.argv(["--verbose", str(rootfs), "sleep", marker]))
    p = subprocess.Popen(["sh", "-c", f"echo $$ > {parent}/cgroup.procs && exec {launch}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=rootless_runner.env(), cwd="/")
    try:
        leaf, _ = notes(read_verbose(p, want=1))
        assert leaf and os.path.dirname(leaf) == parent, leaf
        _kill_and_check(p, marker, leaf)
        assert _leaves(parent) == []
    finally:
        kill_quietly(p)


def test_normal_exit_leaves_no_reaper_and_no_open_stdout(root_runner, rootfs, parent):
    """The reaper holds none of the caller's fds: a caller reading the
    launcher's stdout to EOF (`$(gpusandbox run ...)`) is not kept waiting,
    and the reaper is gone with the launcher."""
    marker = "321.98765"
    r = subprocess.run(["sh", "-c", 'out=$("$@"); echo "[$out]"', "sh",
                        *root_runner.argv(["--cgroup-parent", parent, str(rootfs), "sh", "-c",
                                           f"echo {marker}"])],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"[{marker}]\n"
    # The launcher reaps its reaper before it exits: nothing of it is left
    # for a caller that removes its cgroup at once.
    assert not pids_with(marker)
    assert _leaves(parent) == []
    os.rmdir(parent)


@pytest.mark.slow
def test_launcher_sigkill_beside_launches_binding_into_its_racing_image(
        root_runner, small_rootfs, shared_tmp, parent):
    """Issue 22's black-box case: a --rw sandbox renames a directory and a
    symlink in its own image in a loop while 15 launches bind a host
    directory below that path (some refused: the path changed under them),
    then only its launcher is killed.  Its leaf goes with it."""
    src = shared_tmp / "bindsrc"
    src.mkdir()
    (small_rootfs / "mnt" / "x").mkdir()
    marker = "987.65432"
    swapper = root_runner.popen(
        ["--cgroup-parent", parent, "--rw", str(small_rootfs), "sh", "-c",
         f"while :; do mv /mnt/x /mnt/x.d; ln -s {shared_tmp} /mnt/x; rm -f /mnt/x; "
         f"mv /mnt/x.d /mnt/x; done; : {marker}"], stdout=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(_leaves(parent)) == 1), "the swapper did not start"
        binders = [root_runner.popen(["-v", f"{src}:/mnt/x/sub", str(small_rootfs), "true"])
                   for _ in range(15)]
        for b in binders:
            _, err = b.communicate(timeout=120)
            assert b.returncode == 0 or (b.returncode == 125
                                         and err.startswith("gpusandbox: error:")), err
        leaf = _leaves(parent)
        assert leaf, "the swapper's leaf went before its launcher"
        os.kill(swapper.pid, signal.SIGKILL)
        swapper.wait(timeout=10)
        assert wait_for(lambda: not pids_with(marker), timeout=BOUND), \
            f"processes left: {[(x, comm(x)) for x in pids_with(marker)]}"
        assert wait_for(lambda: _leaves(parent) == [], timeout=BOUND), f"{leaf} left behind"
    finally:
        if swapper.poll() is None:
            kill_quietly(swapper)


FITHAW = 0xC0045878          # _IOWR('X', 120, int), linux/fs.h


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except OSError:
        return None


@pytest.mark.slow
def test_leaf_removed_once_a_member_that_outlives_sigkill_ends(root_runner, rootfs, parent):
    """A member can take its SIGKILL late: in uninterruptible sleep (here a
    write on a frozen filesystem; a congested disk, FUSE or NFS alike) it
    dies only when the sleep ends.  The reaper stays until the leaf is empty
    and removes it then, instead of giving up after the launcher's own short
    teardown wait and leaving the emptied leaf to some later launch."""
    for tool in ("mkfs.ext4", "fsfreeze"):
        if not shutil.which(tool, path="/usr/sbin:/sbin:/usr/bin:/bin"):
            pytest.skip(f"{tool} is not installed")
    if not os.path.exists("/dev/loop-control"):
        pytest.skip("no loop devices here")
    marker = "frozen-765.4321"
    work = nsrun.scratch_dir("frozen")
    img = work.parent / f"{work.name}.img"
    subprocess.run(["truncate", "-s", "32M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
    # The filesystem exists in the launcher's private mount namespace only,
    # frozen before the launch: the command's first write sleeps there.
    argv = nsrun.private_mounts(
        root_runner.argv(["--cgroup-parent", parent, "-v", f"{work}:/data", str(rootfs),
                          "sh", "-c", f"touch /data/{marker}"]),
        f"mount -o loop {img} {work}\nfsfreeze -f {work}")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=root_runner.env(), cwd="/")
    try:
        stuck = wait_for(lambda: [x for x in pids_with(marker)
                                  if comm(x) == "touch" and _state(x) == "D"], timeout=30)
        assert stuck, "the command did not reach the frozen filesystem"
        reaper = [x for x in pids_with(marker) if comm(x) == "gpusandbox-reap"]
        assert len(reaper) == 1, "no reaper next to the launcher"
        leaves = _leaves(parent)
        assert len(leaves) == 1
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        # Stuck for longer than the launcher's teardown waits (2 s), or until
        # the reaper has given up.
        wait_for(lambda: _state(reaper[0]) in (None, "Z"), timeout=5)
        assert _state(stuck[0]) == "D", "the member did not stay stuck"
        _thaw(marker)
        assert wait_for(lambda: not pids_with(marker), timeout=10), \
            f"processes left: {[(x, comm(x)) for x in pids_with(marker)]}"
        assert wait_for(lambda: _leaves(parent) == [], timeout=10), f"{leaves[0]} left behind"
    finally:
        _thaw(marker)
        if p.poll() is None:
            kill_quietly(p)
        wait_for(lambda: not pids_with(marker), timeout=10)
        img.unlink()
        os.rmdir(work)


def _thaw(marker):
    """Thaw the filesystem at /data as the sandbox's processes see it."""
    for pid in pids_with(marker):
        try:
            fd = os.open(f"/proc/{pid}/root/data", os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            fcntl.ioctl(fd, FITHAW, 0)
        except OSError:
            pass                 # EINVAL: not frozen (any more)
        finally:
            os.close(fd)
