"""Ranks of one node running the same FILE.sqsh share one squashfs mount
(gpusandbox/hpc/nodeimage.py), here outside Slurm with GPUSANDBOX_NODE_IMAGE=1:
one loop device for concurrent launches, and none, no keeper and no file once the
last launcher is gone, SIGKILL included.  The multi-node case is in
test_slurm_multinode.py."""
import os
import shutil
import signal
import subprocess

import pytest

from .conftest import REPO, kill_quietly, wait_for
from .test_slurm_multinode import live_keepers, loops_backed_by

NODEIMAGE_DIR = "/run/gpusandbox/nodeimage"


def key_files(path):
    st = os.stat(path)
    mark = f"-{st.st_dev:x}-{st.st_ino:x}-"
    try:
        return [f for f in os.listdir(NODEIMAGE_DIR) if mark in f]
    except FileNotFoundError:
        return []


@pytest.fixture
def sqsh(shared_tmp):
    """A small squashfs image of its own (the loop devices counted are this test's),
    stored uncompressed: mksquashfs then takes a fraction of a second."""
    if not shutil.which("mksquashfs"):
        pytest.skip("mksquashfs not installed (squashfs-tools)")
    root = shared_tmp / "root"
    subprocess.run([str(REPO / "scripts" / "mkrootfs"), str(root), "--no-python"],
                   check=True, capture_output=True)
    (root / "etc" / "marker").write_text("inside the sqsh\n")
    path = shared_tmp / "img.sqsh"
    subprocess.run(["mksquashfs", str(root), str(path), "-noappend", "-quiet", "-no-progress",
                    "-noI", "-noD", "-noF", "-noX"], check=True, capture_output=True)
    shutil.rmtree(root)
    return str(path)


def test_concurrent_launches_share_one_mount_until_the_last_is_killed(root_runner, sqsh):
    env = {"GPUSANDBOX_NODE_IMAGE": "1"}
    procs = [root_runner.popen([str(sqsh), "sh", "-c", "cat /etc/marker; sleep 60"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(3)]
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line == "inside the sqsh\n", p.stderr.readline()
        assert len(loops_backed_by(sqsh)) == 1
        assert live_keepers() and key_files(sqsh)
        # Each launcher killed: the sandboxes go with them, and with the last
        # reference the keeper, the mount and the loop device.
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=10)
        wait_for(lambda: not loops_backed_by(sqsh), timeout=10)
        wait_for(lambda: not key_files(sqsh), timeout=10)
    finally:
        for p in procs:
            kill_quietly(p)

