"""A launcher killed with SIGKILL leaves nothing behind, with no later launch:
its reaper (gpusandbox/linux/reaper.py) removes the cgroup leaf and with it
the BPF device program.  The bound is the property itself (issue 16, item 5):
within 2 s of the launcher's death no process, leaf or program of the sandbox
remains.  Each test uses a cgroup parent of its own, so no other launch's
stale-leaf cleanup can do the reaper's work.
"""
import os
import shlex
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
