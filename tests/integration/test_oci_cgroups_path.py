"""gpusandbox-oci places a container's cgroup v1 leaves at linux.cgroupsPath
in every hierarchy, as runc's and crun's cgroupfs placement (issue 25:
runtime-tools' linux_cgroups_* and delete_resources read them there): an
absolute path from the hierarchy's root, a relative one under the root too
(the spec leaves its base to the runtime), the cgroups above made as needed,
an existing leaf joined; '..' refused."""
import os
import uuid

import pytest

from .test_cgroup_v1 import RESOURCES, TOP, _bundle, _oci, _v1_mounted

pytestmark = pytest.mark.skipif(not _v1_mounted("pids"), reason="needs a cgroup v1 pids hierarchy")


@pytest.fixture
def top():
    """/gsbx-oci3-path-<rand> in the v1 hierarchies: removed at the end."""
    name = f"gsbx-cgpath-{uuid.uuid4().hex[:8]}"
    yield name
    for ctl in os.listdir(TOP):
        d = f"{TOP}/{ctl}/{name}"
        for sub in sorted((t for t, _, _ in os.walk(d)), key=len, reverse=True):
            try:
                os.rmdir(sub)
            except OSError:
                pass


@pytest.mark.parametrize("relative", [False, True])
def test_leaves_at_cgroups_path(cli, rootfs, top, tmp_path, relative):
    st = str(tmp_path / "state")
    path = f"{top}/a/c1" if relative else f"/{top}/a/c1"
    b = _bundle(tmp_path / "b", rootfs, {"pids": {"limit": 33}}, cgroups_path=path)
    cid = f"cgpath-{uuid.uuid4().hex[:6]}"
    r = _oci(st, "create", "--bundle", b, cid)
    assert r.returncode == 0, r.stderr
    try:
        pid = open(f"{st}/{cid}/state.json").read().split('"pid": ')[1].split(",")[0]
        cg = open(f"/proc/{pid}/cgroup").read()
        assert f":pids:/{top}/a/c1\n" in cg, cg
        assert open(f"{TOP}/pids/{top}/a/c1/pids.max").read().strip() == "33"
        # A second container at the same path joins the leaf (runc's rule).
        b2 = _bundle(tmp_path / "b2", rootfs, {"pids": {"limit": 33}}, cgroups_path=path)
        r = _oci(st, "create", "--bundle", b2, cid + "-2")
        assert r.returncode == 0, r.stderr
        assert _oci(st, "delete", "--force", cid + "-2").returncode == 0
    finally:
        r = _oci(st, "delete", "--force", cid)
    assert r.returncode == 0, r.stderr
    # delete removes the leaf, not the cgroups above it (as runc).
    assert not os.path.exists(f"{TOP}/pids/{top}/a/c1")
    assert os.path.isdir(f"{TOP}/pids/{top}/a")


def test_dotdot_refused(cli, rootfs, tmp_path):
    st = str(tmp_path / "state")
    b = _bundle(tmp_path / "b", rootfs, RESOURCES, cgroups_path="/x/../../y")
    r = _oci(st, "create", "--bundle", b, "cgpath-dotdot")
    assert r.returncode != 0
    assert "linux.cgroupsPath: '/x/../../y': '..' is not allowed" in r.stderr, r.stderr
    assert not os.path.exists(f"{st}/cgpath-dotdot")
