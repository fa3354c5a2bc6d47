"""Selection: --gpus / NVIDIA_VISIBLE_DEVICES / --gpus auto -> Selection."""
import sys
import types

import pytest

from gpusandbox.errors import GpuError, UsageError
from gpusandbox.gpu import discover, select
from tests.unit import gpu_fixtures as fx

pytestmark = pytest.mark.skipif(not (fx.HAVE_GCC and fx.HAVE_LDCONFIG),
                                reason="the fake driver root needs gcc and ldconfig")


@pytest.fixture(scope="module")
def host():
    with fx.FakeDriver(gpus=3, mig={1: [(1, 0), (2, 0), (2, 1)]}) as fd:
        yield discover.discover(fd.root)


def idx(sel):
    return [g.index for g in sel.gpus]


def test_no_selector_means_no_gpu_support(host):
    assert select.resolve(None, None, {}, host) is None
    assert select.resolve(None, None, {"NVIDIA_VISIBLE_DEVICES": "void"}, host) is None
    assert select.resolve(None, None, {"NVIDIA_VISIBLE_DEVICES": " "}, host) is None


def test_none_gives_driver_files_without_gpus(host):
    sel = select.resolve("none", None, {}, host)
    assert sel.none and sel.gpus == [] and sel.migs == [] and sel.visible == "none"
    sel = select.resolve(None, None, {"NVIDIA_VISIBLE_DEVICES": "none"}, host)
    assert sel.none


def test_all_and_lists(host):
    sel = select.resolve("all", None, {}, host)
    assert idx(sel) == [0, 1, 2] and len(sel.migs) == 3 and sel.visible == "all"
    assert idx(select.resolve("2,0", None, {}, host)) == [0, 2]
    assert idx(select.resolve(None, None, {"NVIDIA_VISIBLE_DEVICES": "1"}, host)) == [1]


def test_uuid_and_bus_id_forms(host):
    assert idx(select.resolve(fx.gpu_uuid(2), None, {}, host)) == [2]
    assert idx(select.resolve(fx.gpu_uuid(2).upper().replace("GPU-", "gpu-"), None, {}, host)) == [2]
    short = fx.bus_id(1)[5:]                       # "26:00.0"
    assert idx(select.resolve(short, None, {}, host)) == [1]
    assert idx(select.resolve(fx.bus_id(1).upper(), None, {}, host)) == [1]
    assert idx(select.resolve("0000" + fx.bus_id(1), None, {}, host)) == [1]   # nvidia-smi's 8-digit domain


def test_mig_pairs_triples_and_legacy_names(host):
    sel = select.resolve("1:2", None, {}, host)
    assert [(m.gi, m.ci) for m in sel.migs] == [(2, 0), (2, 1)] and sel.gpus == []
    assert [g.index for g in sel.node_gpus()] == [1]
    sel = select.resolve("1:2:1", None, {}, host)
    assert [(m.gi, m.ci) for m in sel.migs] == [(2, 1)]
    sel = select.resolve(f"MIG-{fx.gpu_uuid(1)}/1/0", None, {}, host)
    assert [(m.gi, m.ci) for m in sel.migs] == [(1, 0)]
    assert sel.visible == f"MIG-{fx.gpu_uuid(1)}/1/0"


def test_mig_uuid_is_resolved_through_nvml(host):
    uuid = fx.mig_uuid(1, 2, 1)        # GPU index 1 has minor 1 in a 3-GPU fixture
    sel = select.resolve(f"0,{uuid}", None, {}, host)
    assert idx(sel) == [0] and [(m.gpu.index, m.gi, m.ci) for m in sel.migs] == [(1, 2, 1)]
    assert sel.visible == f"{fx.gpu_uuid(0)},{uuid}"


def test_unknown_items_name_the_item_and_what_exists(host):
    with pytest.raises(UsageError) as e:
        select.resolve("0,7", None, {}, host)
    assert "'7'" in e.value.why and fx.gpu_uuid(2) in e.value.hint and fx.bus_id(2) in e.value.hint
    for bad in ("GPU-deadbeef", "0000:99:00.0", "5:1", "MIG-00000000-0000-0000-0000-000000000000",
                "banana"):
        with pytest.raises(UsageError) as e:
            select.resolve(bad, None, {}, host)
        assert e.value.why == f"unknown device {bad!r}"
    with pytest.raises(GpuError, match="NVIDIA_VISIBLE_DEVICES"):
        select.resolve(None, None, {"NVIDIA_VISIBLE_DEVICES": "9"}, host)
    with pytest.raises(UsageError):
        select.resolve("", None, {}, host)


def test_capabilities(host):
    assert select.resolve("0", None, {}, host).caps == ("compute", "utility")
    env = {"NVIDIA_DRIVER_CAPABILITIES": "video,utility"}
    assert select.resolve("0", None, env, host).caps == ("utility", "video")
    assert select.resolve("0", "all", env, host).caps == discover.CAPABILITIES
    assert select.resolve("0", "compat32,compute", {}, host).caps == ("compute", "compat32")
    with pytest.raises(UsageError, match="--gpu-caps"):
        select.resolve("0", "compute,warp", {}, host)
    with pytest.raises(GpuError, match="NVIDIA_DRIVER_CAPABILITIES"):
        select.resolve("0", None, {"NVIDIA_DRIVER_CAPABILITIES": "gaming"}, host)


def test_mig_config_and_monitor_only_when_the_caller_asks(host):
    assert not select.resolve("1:1", None, {}, host).mig_config
    sel = select.resolve("1:1", None, {"NVIDIA_MIG_CONFIG_DEVICES": "all",
                                       "NVIDIA_MIG_MONITOR_DEVICES": "all"}, host)
    assert sel.mig_config and sel.mig_monitor


def test_auto_without_the_slurm_module_uses_the_callers_variables(host, monkeypatch):
    monkeypatch.setitem(sys.modules, "gpusandbox.slurm", None)
    assert idx(select.resolve("auto", None, {"CUDA_VISIBLE_DEVICES": "2"}, host)) == [2]
    assert idx(select.resolve("auto", None, {"NVIDIA_VISIBLE_DEVICES": "1",
                                             "CUDA_VISIBLE_DEVICES": "2"}, host)) == [1]
    assert select.resolve("auto", None, {}, host).none


def test_auto_asks_the_slurm_module(host, monkeypatch):
    calls = []
    fake = types.ModuleType("gpusandbox.slurm")

    def resolve_auto(environ, h):
        calls.append((dict(environ), h))
        return "0,2"
    fake.resolve_auto = resolve_auto
    monkeypatch.setitem(sys.modules, "gpusandbox.slurm", fake)
    import gpusandbox
    monkeypatch.setattr(gpusandbox, "slurm", fake, raising=False)
    sel = select.resolve("auto", None, {"SLURM_JOB_ID": "5"}, host)
    assert idx(sel) == [0, 2] and calls and calls[0][1] is host
