"""Fabric selection without privileges (issue 29): the request's precedence,
the image kept out of it, NCCL's PCI-distance rule on a sysfs tree written
here, and the variables the injection sets."""
import pytest

from gpusandbox import plandev
from gpusandbox.errors import UsageError
from gpusandbox.fabric import discover, inject, select


def test_precedence_option_then_mellanox_then_mofed_then_auto():
    env = {"MELLANOX_VISIBLE_DEVICES": "0", "NVIDIA_MOFED": "enabled"}
    assert select.from_caller("none", env, True).hcas == "none"
    req = select.from_caller(None, env, True)
    assert (req.hcas, req.source) == (["0"], "MELLANOX_VISIBLE_DEVICES")
    assert select.from_caller(None, {"NVIDIA_MOFED": "enabled"}, False).hcas == "all"
    assert select.from_caller(None, {"NVIDIA_MOFED": "yes"}, True).hcas == "auto"
    assert select.from_caller(None, {}, False).hcas == "none"
    assert not select.from_caller(None, {}, False)
    assert select.from_caller(None, {"MELLANOX_VISIBLE_DEVICES": "void"}, True).hcas == "none"


def test_toolkit_switches_need_exactly_enabled():
    req = select.from_caller("none", {"NVIDIA_GDRCOPY": "enabled", "NVIDIA_GDS": "true",
                                      "NVIDIA_NVSWITCH": "Enabled"}, True)
    assert (req.gdrcopy, req.gds, req.nvswitch) == (True, False, False)


@pytest.mark.parametrize("value,want", [("1,3,1", [1, 3]), ("all", "all"), ("none", None),
                                        ("", None)])
def test_imex_channels(value, want):
    assert select.from_caller("none", {"NVIDIA_IMEX_CHANNELS": value}, True).imex == want


@pytest.mark.parametrize("value", ["x", "-1", str(1 << 20)])
def test_bad_imex_channel_names_the_item(value):
    with pytest.raises(UsageError) as e:
        select.from_caller("none", {"NVIDIA_IMEX_CHANNELS": value}, True)
    assert e.value.what == f"invalid NVIDIA_IMEX_CHANNELS item {value!r}"


def test_the_image_cannot_widen_the_callers_request():
    # plandev.fabric passes the caller's environment and its -e rows only: the
    # image's rows never reach from_caller.
    env = plandev.caller_env({"NVIDIA_GDRCOPY": "no"}, [("NVIDIA_IMEX_CHANNELS", "0")])
    assert env == {"NVIDIA_GDRCOPY": "no", "NVIDIA_IMEX_CHANNELS": "0"}
    env = plandev.caller_env({"MELLANOX_VISIBLE_DEVICES": "all"},
                                [("MELLANOX_VISIBLE_DEVICES", "none")])
    assert select.from_caller(None, env, True).hcas == "none"


class _Gpu:
    def __init__(self, index, bus_id):
        self.index, self.bus_id = index, bus_id


def _dev(sysd, path, bdf, numa):
    d = sysd / "devices" / path / bdf
    d.mkdir(parents=True)
    (d / "numa_node").write_text(f"{numa}\n")
    link = sysd / "bus/pci/devices" / bdf
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(d)
    return d


def _hca(sysd, path, bdf, numa, name, state="4: ACTIVE"):
    d = _dev(sysd, path, bdf, numa)
    c = sysd / "class/infiniband" / name
    (c / "ports/1").mkdir(parents=True)
    (c / "ports/1/state").write_text(state + "\n")
    (c / "ports/1/link_layer").write_text("InfiniBand\n")
    (c / "device").symlink_to(d)


@pytest.fixture
def topo(tmp_path):
    """GPU 0 and mlx5_0 under one switch; GPU 1 alone on root complex 00;
    GPU 2 on another root complex of NUMA node 1 with mlx5_1; mlx5_2 down."""
    sysd = tmp_path / "sys"
    _dev(sysd, "pci0000:00/0000:00:01.0/0000:10:00.0/0000:11:00.0", "0000:06:00.0", 0)
    _hca(sysd, "pci0000:00/0000:00:01.0/0000:10:00.0/0000:11:01.0", "0000:40:00.0", 0, "mlx5_0")
    _dev(sysd, "pci0000:00/0000:00:02.0", "0000:07:00.0", 0)
    _dev(sysd, "pci0000:80/0000:80:01.0", "0000:86:00.0", 1)
    _hca(sysd, "pci0000:81/0000:81:01.0", "0000:c0:00.0", 1, "mlx5_1")
    _hca(sysd, "pci0000:82/0000:82:01.0", "0000:c1:00.0", 2, "mlx5_2", state="1: DOWN")
    host = discover.FabricHost()
    host.sys_root, host.dev_root, host.problems = str(sysd), str(tmp_path / "dev"), []
    host.hcas = discover._hcas(host)
    for h in host.hcas:     # no mknod without root: the nodes by number only
        h.uverbs = discover.Node(f"/dev/infiniband/uverbs{h.index}", "/x", 231, 192 + h.index)
    host.rdma_cm = None
    host.gdrdrv, host.nvfs, host.nvswitch, host.imex = None, [], [], {}
    return host


def test_hcas_read_from_sysfs(topo):
    assert [(h.name, h.bus_id, h.numa, h.active_ports()) for h in topo.hcas] == [
        ("mlx5_0", "0000:40:00.0", 0, [1]), ("mlx5_1", "0000:c0:00.0", 1, [1]),
        ("mlx5_2", "0000:c1:00.0", 2, [])]


def test_nearest_switch_then_host_bridge_then_numa_then_all(topo):
    near = lambda *gpus: [(h.name, why) for h, why in select.nearest(topo, list(gpus))]
    assert near(_Gpu(0, "0000:06:00.0")) == [
        ("mlx5_0", "the same PCIe switch as GPU 0 (0000:06:00.0)")]
    assert near(_Gpu(1, "0000:07:00.0")) == [
        ("mlx5_0", "the same host bridge as GPU 1 (0000:07:00.0)")]
    assert near(_Gpu(2, "0000:86:00.0")) == [
        ("mlx5_1", "the same NUMA node as GPU 2 (0000:86:00.0)")]
    # A GPU sysfs does not know: every usable HCA (mlx5_2 has no ACTIVE port).
    assert [n for n, _ in near(_Gpu(3, "0000:99:00.0"))] == ["mlx5_0", "mlx5_1"]
    assert [n for n, _ in near(_Gpu(0, "0000:06:00.0"), _Gpu(2, "0000:86:00.0"))] == [
        "mlx5_0", "mlx5_1"]


def test_injection_nodes_rules_and_variables(topo):
    req = select.from_caller(None, {}, True)
    res = inject.build(req, topo, [_Gpu(2, "0000:86:00.0")], {})
    assert [n.path for n in res.edits.device_nodes] == ["/dev/infiniband/uverbs1"]
    assert res.rules == [("c", 231, 193, "rw")]
    assert res.edits.env == {"NCCL_IB_HCA": "=mlx5_1:1", "UCX_NET_DEVICES": "mlx5_1:1"}
    res = inject.build(req, topo, [_Gpu(2, "0000:86:00.0")], {"NCCL_IB_HCA": "mlx5_0"})
    assert res.edits.env == {"UCX_NET_DEVICES": "mlx5_1:1"}


def test_unknown_hca_is_one_line(topo):
    with pytest.raises(UsageError) as e:
        inject.build(select.from_caller("mlx5_0,ib9", {}, True), topo, [], {})
    assert e.value.line() == "--fabric: unknown HCA 'ib9': this host has mlx5_0, mlx5_1, mlx5_2"


def _plan_and_spec(oci, image_env):
    from types import SimpleNamespace
    from gpusandbox.edits import ContainerEdits
    plan = SimpleNamespace(gpu=None, edits=ContainerEdits(), device_rules=None, warnings=[],
                           notes=[], host_root=False, rootfd=None)
    spec = SimpleNamespace(fabric=None, fabric_libs=None, mpi=None, oci=oci,
                           image_env=(image_env, "/"), driver_root=None, dev_root=None)
    return plan, spec


def test_an_oci_configs_environment_is_the_callers_an_images_is_not(tmp_path):
    """NVIDIA_MOFED=enabled asks for every HCA; the driver root here has none,
    which the plan's warning says: the variable was read."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text("Character devices:\n195 nvidia\n")
    env = {"GPUSANDBOX_DRIVER_ROOT": str(tmp_path)}
    rows = [("NVIDIA_MOFED", "enabled")]
    plan, spec = _plan_and_spec(object(), rows)          # an OCI config's process.env
    plandev.fabric(plan, spec, [], env)
    assert plan.warnings and "asks for RDMA adapters" in plan.warnings[0]
    plan, spec = _plan_and_spec(None, rows)              # a store image's ENV
    assert plandev.fabric(plan, spec, [], env) == {}
    assert plan.warnings == [] and not plan.edits


def test_sysfs_view_keeps_the_chosen_hcas_only(tmp_path):
    """The edits that hide the HCAs a task did not get (fabric/sysview.py), on
    the simulated host's sysfs layout: the class directories covered and the
    chosen HCA's entries put back with the host's own link targets; the other
    HCAs' PCI directories covered; nothing when /sys is another tree."""
    from gpusandbox.fabric import sysview
    from gpusandbox.sim import fabric as simfab
    simfab.write_sys(str(tmp_path), 4, simfab.describe(4, 4, "ib", False, 0, 0))
    host = discover.FabricHost()
    host.sys_root, host.dev_root, host.problems = str(tmp_path / "sys"), str(tmp_path / "dev"), []
    host.hcas = discover._hcas(host)
    chosen = [h for h in host.hcas if h.name == "mlx5_2"]
    edits, notes = sysview.view(host, chosen, launcher_sys=host.sys_root)
    pci = {h.name: h.pci_path.split("/sys/", 1)[1] for h in host.hcas}
    assert [t.path for t in edits.tmpfs] == [
        "/sys/class/infiniband", "/sys/class/infiniband_verbs", "/sys/class/infiniband_mad"] + [
        f"/sys/{pci[n]}" for n in ("mlx5_0", "mlx5_1", "mlx5_3")]
    assert all(t.ro for t in edits.tmpfs)
    links = {ln.path: ln.target for ln in edits.symlinks}
    assert links == {
        "/sys/class/infiniband/mlx5_2": f"../../{pci['mlx5_2']}/infiniband/mlx5_2",
        "/sys/class/infiniband_verbs/uverbs2": f"../../{pci['mlx5_2']}/infiniband_verbs/uverbs2",
        "/sys/class/infiniband_mad/umad2": f"../../{pci['mlx5_2']}/infiniband_mad/umad2",
        "/sys/class/infiniband_mad/issm2": f"../../{pci['mlx5_2']}/infiniband_mad/issm2"}
    assert [(m.path, m.options) for m in edits.mounts] == [
        ("/sys/class/infiniband_verbs/abi_version", sysview.RO),
        ("/sys/class/infiniband_mad/abi_version", sysview.RO)]
    assert notes == ["fabric: /sys hides the 3 adapter(s) this task did not get"]
    # The launcher's /sys is not the tree discovery read: nothing to hide there.
    edits, notes = sysview.view(host, chosen)
    assert not edits and notes[0].startswith("fabric: /sys left as it is")


def test_cxi_nics_chosen_like_hcas(tmp_path):
    """Slingshot NICs (sim --cxis): discovered from /sys/class/cxi_user with
    their ucxi numbers, chosen by PCI distance, told to libfabric; the
    Mellanox variables leave them to the default; /sys keeps the chosen one."""
    from gpusandbox.fabric import sysview
    from gpusandbox.sim import fabric as simfab
    fab = simfab.describe(4, 0, "ib", False, 0, 0, cxis=4)
    simfab.write_sys(str(tmp_path), 4, fab)
    host = discover.FabricHost()
    host.sys_root, host.dev_root, host.problems = str(tmp_path / "sys"), str(tmp_path / "dev"), []
    host.majors = {"ucxi": simfab.UCXI_MAJOR}
    host.rdma_cm, host.gdrdrv, host.nvfs, host.nvswitch, host.imex = None, None, [], [], {}
    host.cxis = discover._cxis(host)
    # No mknod without root: no node, one problem each, none usable.
    assert [c.name for c in host.cxis] == ["cxi0", "cxi1", "cxi2", "cxi3"]
    assert host.problems == [f"cxi{k}: no /dev/cxi{k} node" for k in range(4)]
    for c in host.cxis:
        c.node = discover.Node(f"/dev/{c.name}", "/x", simfab.UCXI_MAJOR, c.index)
    assert [(c.bus_id, c.numa, c.link_up) for c in host.cxis] == [
        ("0000:60:00.0", 0, True), ("0000:61:00.0", 0, True), ("0000:62:00.0", 1, True),
        ("0000:63:00.0", 1, True)]
    gpu = _Gpu(2, simfab.gpu_bdf(2))
    res = inject.build(select.from_caller(None, {}, True), host, [gpu], {})
    assert [(c.name, why) for c, why in res.cxis] == [
        ("cxi2", "the same PCIe switch as GPU 2 (0000:08:00.0)")]
    assert res.rules == [("c", simfab.UCXI_MAJOR, 2, "rw")] and res.hcas == []
    assert res.edits.env == {"FI_PROVIDER": "cxi", "FI_CXI_DEVICE_NAME": "cxi2"}
    res = inject.build(select.from_caller("cxi3,cxi1", {}, True), host, [gpu],
                       {"FI_PROVIDER": "cxi;tcp"})
    assert [c.name for c, _ in res.cxis] == ["cxi1", "cxi3"]
    assert res.edits.env == {"FI_CXI_DEVICE_NAME": "cxi1,cxi3"}
    req = select.from_caller(None, {"MELLANOX_VISIBLE_DEVICES": "none"}, True)
    assert [c.name for c, _ in inject.build(req, host, [gpu], {}).cxis] == ["cxi2"]
    with pytest.raises(UsageError) as e:
        inject.build(select.from_caller("cxi9", {}, True), host, [gpu], {})
    assert e.value.line() == "--fabric: unknown HCA 'cxi9': this host has cxi0, cxi1, cxi2, cxi3"
    edits, _ = sysview.view(host, [host.cxis[2]], launcher_sys=host.sys_root)
    assert sorted(ln.path for ln in edits.symlinks) == ["/sys/class/cxi/cxi2",
                                                        "/sys/class/cxi_user/cxi2"]
    assert len([t for t in edits.tmpfs if "/devices/" in t.path]) == 3
