"""`delete --force` of a container whose processes a cgroup v1 freezer holds
(a hybrid host; crun's test_delete does this to every runtime it tests): a
frozen task sleeps through SIGKILL, so teardown must thaw it, leaving the
freezer cgroup's own state alone, or the container's process and cgroup leaf
outlive the delete."""
import os
import time

import pytest

from .conftest import CLI
from .test_oci_fast_commands import Caller, _conf, tmp  # noqa: F401 (fixture)

FREEZER = "/sys/fs/cgroup/freezer"


def _gone(pid):
    """Ended: no such process, or a zombie (the init's caller has exited, so
    it waits for the host's pid 1 to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(") ")[2].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not os.access(f"{FREEZER}/cgroup.procs", os.W_OK),
                    reason="no writable cgroup v1 freezer on this host (pure cgroup v2)")
def test_delete_force_ends_a_v1_frozen_container(tmp, test_user, rootfs, cli):
    c = Caller("root", test_user, tmp)
    leaf = c.create("Z1", _conf(rootfs, "root", test_user))
    r = c.run([CLI, "oci", *c.g, "start", "Z1"])
    assert r.returncode == 0, r.stderr
    pid = c.state("Z1")["pid"]
    ours = f"{FREEZER}/gsbx-test-frozen-{os.getpid()}"
    os.mkdir(ours)
    try:
        with open(f"{ours}/cgroup.procs", "w") as f:
            f.write(str(pid))
        with open(f"{ours}/freezer.state", "w") as f:
            f.write("FROZEN")
        deadline = time.monotonic() + 10
        while open(f"{ours}/freezer.state").read().strip() != "FROZEN":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = c.run([CLI, "oci", *c.g, "delete", "--force", "Z1"])
        assert r.returncode == 0, r.stderr
        assert _gone(pid), "the frozen workload outlived delete --force"
        if leaf:
            assert not os.path.exists(leaf), f"{leaf} outlived delete --force"
        assert not (tmp / "root" / "s" / "Z1").exists()
        # The freezer cgroup itself was not thawed, only emptied of ours.
        assert open(f"{ours}/freezer.state").read().strip() == "FROZEN"
    finally:
        with open(f"{ours}/freezer.state", "w") as f:
            f.write("THAWED")
        for p in open(f"{ours}/cgroup.procs").read().split():
            with open(f"{FREEZER}/cgroup.procs", "w") as f:
                f.write(p)
        os.rmdir(ours)
