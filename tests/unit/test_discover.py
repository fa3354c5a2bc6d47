"""Discovery against a hand-built driver root (and the simulator when present)."""
import importlib.util
import os
import shutil
import tempfile

import pytest

from gpusandbox.errors import GpuError
from gpusandbox.gpu import discover, report
from tests.unit import gpu_fixtures as fx

pytestmark = pytest.mark.skipif(not (fx.HAVE_GCC and fx.HAVE_LDCONFIG),
                                reason="the fake driver root needs gcc and ldconfig")
needs_root = pytest.mark.skipif(not fx.IS_ROOT, reason="creating device nodes needs root")


@pytest.fixture(scope="module")
def fake():
    with fx.FakeDriver(gpus=3, mig={1: [(1, 0), (2, 0)]}, compat32=True) as fd:
        yield fd


@pytest.fixture(scope="module")
def host(fake):
    return discover.discover(fake.root)


def test_driver_version_and_majors(host):
    assert host.version == fx.VERSION
    assert host.majors == {"nvidia": 195, "nvidia-uvm": fx.UVM_MAJOR,
                           "nvidia-caps": fx.CAPS_MAJOR}
    assert host.frontend_name == "nvidia"


def test_gpus_are_indexed_in_bus_order_with_their_minors(fake, host):
    assert [g.bus_id for g in host.gpus] == [fx.bus_id(i) for i in range(3)]
    assert [g.minor for g in host.gpus] == [2, 1, 0]
    assert [g.uuid for g in host.gpus] == [fx.gpu_uuid(i) for i in range(3)]
    assert host.gpus[0].model == "NVIDIA H100 80GB HBM3"
    assert host.gpus[0].proc_dir == fake.p(f"proc/driver/nvidia/gpus/{fx.bus_id(0)}")


@needs_root
def test_device_nodes_match(fake, host):
    assert host.problems == []
    assert host.gpus[0].node.host_path == fake.p("dev/nvidia2")
    assert (host.control["nvidiactl"].major, host.control["nvidiactl"].minor) == (195, 255)
    assert host.control["nvidia-uvm-tools"].minor == 1


def test_only_libraries_of_this_driver_version(fake, host):
    names = {(lib.name, lib.bits) for lib in host.libs}
    assert (f"libcuda.so.{fx.VERSION}", 64) in names
    assert (f"libcuda.so.{fx.VERSION}", 32) in names
    assert all(n.endswith(".so." + fx.VERSION) for n, _ in names)
    # the 535 leftover and a non-driver library with the same suffix are out
    assert not any(n.startswith(("libnvidia-fbc", "libfoo")) for n, _ in names)
    for lib in host.libs:
        assert lib.host_path.startswith(fake.root + "/")
        assert os.path.realpath(lib.host_path) == lib.host_path


def test_absolute_symlink_resolves_inside_the_driver_root(fake, host):
    # libnvidia-cfg.so.1 -> /usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.<v> (absolute)
    cfg = [lib for lib in host.libs if lib.family == "libnvidia-cfg"]
    assert cfg and cfg[0].host_path == fake.p(f"{fx.LIBDIR}/libnvidia-cfg.so.{fx.VERSION}")


def test_binaries_firmware_ipc(fake, host):
    assert host.bins["nvidia-smi"] == fake.p("usr/bin/nvidia-smi")
    assert host.firmware == [fake.p(f"lib/firmware/nvidia/{fx.VERSION}/gsp_ga10x.bin"),
                             fake.p(f"lib/firmware/nvidia/{fx.VERSION}/gsp_tu10x.bin")]
    assert host.ipc["persistenced"] == ("/var/run/nvidia-persistenced/socket",
                                        fake.p("var/run/nvidia-persistenced/socket"))
    assert "fabricmanager" not in host.ipc
    assert host.ipc["mps"][1] == fake.p("tmp/nvidia-mps")


def test_mps_pipe_directory_from_environment(fake):
    os.makedirs(fake.p("run/mps-elsewhere"), exist_ok=True)
    h = discover.discover(fake.root, environ={"CUDA_MPS_PIPE_DIRECTORY": "/run/mps-elsewhere"})
    assert h.ipc["mps"] == ("/run/mps-elsewhere", fake.p("run/mps-elsewhere"))


def _mps_env(fake, name, make):
    """discover() with CUDA_MPS_PIPE_DIRECTORY=/name, after make(host path)."""
    path = fake.p(name)
    if os.path.lexists(path):
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
        else:
            shutil.rmtree(path)
    make(path)
    return discover.discover(fake.root, environ={"CUDA_MPS_PIPE_DIRECTORY": "/" + name})


def test_mps_pipe_directory_is_held_by_its_inode(fake, host):
    path = fake.p("tmp/nvidia-mps")
    st = os.stat(path)
    assert host.pinned[path] == (st.st_dev, st.st_ino)
    assert host.notes == []


@pytest.mark.parametrize("kind, why", [
    ("link", "a symlink or a non-directory at or above it"),
    ("open", "mode 0777"),
    ("file", "a symlink or a non-directory at or above it"),
])
def test_mps_pipe_directory_others_could_plant_is_left_out(fake, kind, why):
    """/tmp/nvidia-mps is a name any user can take: a link (to a private
    directory), a directory others can write to, or no directory at all is
    never injected, and the note says why."""
    def make(path):
        if kind == "link":
            os.makedirs(fake.p("srv/private"), exist_ok=True)
            os.symlink("/srv/private", path)
        elif kind == "open":
            os.mkdir(path)
            os.chmod(path, 0o777)
        else:
            with open(path, "w"):
                pass
    h = _mps_env(fake, f"mps-{kind}", make)
    assert "mps" not in h.ipc and h.pinned == {}
    assert len(h.notes) == 1 and h.notes[0][0] == "compute", h.notes
    assert h.notes[0][1].startswith(f"MPS pipe directory {fake.p('mps-' + kind)} not injected: ")
    assert why in h.notes[0][1], h.notes


@pytest.mark.skipif(not fx.IS_ROOT, reason="giving a directory to another user needs root")
def test_mps_pipe_directory_of_another_user_is_left_out(fake):
    h = _mps_env(fake, "mps-other", lambda p: (os.mkdir(p, 0o755), os.chown(p, 65534, 65534)))
    assert "mps" not in h.ipc
    assert "owned by uid 65534" in h.notes[0][1], h.notes


def test_a_missing_mps_pipe_directory_is_left_out_without_the_walk(tmp_path, monkeypatch):
    from gpusandbox.linux import host as lhost

    def walked(*a, **k):
        raise AssertionError("walked")
    monkeypatch.setattr(lhost, "trusted_dir", walked)
    host = discover.GpuHost()
    host.driver_root, host.ipc, host.pinned, host.notes = "/", {}, {}, []
    discover._mps_dir(host, str(tmp_path / "nvidia-mps"))
    assert host.ipc == {} and host.notes == []
    os.symlink("/nonexistent", tmp_path / "nvidia-mps")    # a dangling link is there
    with pytest.raises(AssertionError, match="walked"):
        discover._mps_dir(host, str(tmp_path / "nvidia-mps"))


def test_mps_pipe_directory_walked_from_the_real_root(tmp_path):
    """The check walks the host path from /: with the driver root /, a link
    at the MPS path (`ln -s /root /tmp/nvidia-mps`) is not followed."""
    os.chmod(tmp_path, 0o755)
    os.symlink("/root", tmp_path / "nvidia-mps")
    host = discover.GpuHost()
    host.driver_root, host.ipc, host.pinned, host.notes = "/", {}, {}, []
    discover._mps_dir(host, str(tmp_path / "nvidia-mps"))
    assert host.ipc == {} and host.pinned == {}
    assert host.notes == [("compute", f"MPS pipe directory {tmp_path}/nvidia-mps not "
                           "injected: a symlink or a non-directory at or above it")]


def test_mig_devices(fake, host):
    assert [(m.gpu.index, m.gi, m.ci) for m in host.migs] == [(1, 1, 0), (1, 2, 0)]
    m = host.migs[1]
    assert (m.gi_node.minor, m.ci_node.minor) == fake.cap_minors(1, 2, 0)
    assert m.gi_node.major == fx.CAPS_MAJOR
    assert m.ci_access == fake.p("proc/driver/nvidia/capabilities/gpu1/mig/gi2/ci0/access")
    assert host.control["mig-config"].minor == 1


@needs_root
def test_swapped_node_is_reported_not_trusted():
    with fx.FakeDriver(gpus=2, stale_libs=False) as fd:
        fd.mknod("dev/nvidia1", 195, 0)       # claims to be GPU minor 1, is minor 0
        os.unlink(fd.p("dev/nvidia-uvm"))
        h = discover.discover(fd.root)
        assert any("nvidia1 is 195:0, expected 195:1" in p for p in h.problems)
        assert any("nvidia-uvm" in p for p in h.problems)
        gpu = [g for g in h.gpus if g.minor == 1][0]
        assert gpu.node.problem


def test_frontend_name_before_550():
    with fx.FakeDriver(gpus=1, version="535.104.05", frontend="nvidia-frontend",
                       stale_libs=False) as fd:
        h = discover.discover(fd.root)
        assert h.frontend_name == "nvidia-frontend" and h.version == "535.104.05"


def test_missing_layers_raise_gpu_error_naming_them():
    with fx.FakeDriver(gpus=1, stale_libs=False) as fd:
        # No cache and nothing in the library directories (a cache-less root
        # with the libraries in place is found by path: test_discover_partial).
        os.unlink(fd.p("etc/ld.so.cache"))
        os.rename(fd.p(fx.LIBDIR), fd.p("elsewhere"))
        with pytest.raises(GpuError, match="driver libraries") as e:
            discover.discover(fd.root)
        assert "ld.so.cache" in e.value.why and e.value.hint
        shutil.rmtree(fd.p("proc/driver/nvidia/gpus"))
        with pytest.raises(GpuError, match="no NVIDIA GPU"):
            discover.discover(fd.root)
        os.unlink(fd.p("proc/driver/nvidia/version"))
        with pytest.raises(GpuError, match="not loaded"):
            discover.discover(fd.root)
    empty = tempfile.mkdtemp(dir="/tmp")
    try:
        with pytest.raises(GpuError, match="not loaded"):
            discover.discover(empty)
    finally:
        os.rmdir(empty)


def test_userspace_driver_of_another_version_is_refused():
    with fx.FakeDriver(gpus=1, stale_libs=False) as fd:
        fd.write("proc/driver/nvidia/version",
                 "NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.35.03  Fri Aug 16 2024\n")
        with pytest.raises(GpuError) as e:
            discover.discover(fd.root)
        assert ".so.560.35.03" in e.value.why and "560.35.03" in e.value.hint


def test_hidden_uuid_is_recorded_as_unknown():
    with fx.FakeDriver(gpus=1, stale_libs=False) as fd:
        info = fd.p(f"proc/driver/nvidia/gpus/{fx.bus_id(0)}/information")
        with open(info) as f:
            text = f.read().replace(fx.gpu_uuid(0), "GPU-????????-????-????-????-????????????")
        with open(info, "w") as f:
            f.write(text)
        h = discover.discover(fd.root)
        assert h.gpus[0].uuid is None and any("hides" in p for p in h.problems)


def test_discovery_among_2000_cache_entries():
    # Timing is the benchmark's business (scripts/bench); here: the right libraries.
    with fx.FakeDriver(gpus=8, filler=2000) as fd:
        with open(fd.p("etc/ld.so.cache"), "rb") as f:
            assert f.read().count(b"libfill") >= 2000
        h = discover.discover(fd.root)
        assert len(h.gpus) == 8
        assert h.libs and not any("libfill" in lib.name for lib in h.libs)
        assert all(lib.name.endswith(".so." + h.version) for lib in h.libs)


def test_info_report(fake, capsys):
    report.INFO_EXTRA.append(lambda h: [("device isolation", "test hook")])
    try:
        assert report.main_info(["--driver-root", fake.root]) == 0
    finally:
        report.INFO_EXTRA.pop()
    out = capsys.readouterr().out
    assert f"driver version: {fx.VERSION}" in out
    assert "cuda version: 12.4" in out
    assert f"gpu 2: NVIDIA H100 80GB HBM3  {fx.gpu_uuid(2)}  bus {fx.bus_id(2)}  minor 0" in out
    assert "mig 1:2:0" in out and "device isolation: test hook" in out


def test_info_json_and_errors(fake, capsys):
    import json
    assert report.main_info(["--driver-root", fake.root, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["driver_version"] == fx.VERSION and len(data["gpus"]) == 3
    assert report.main_info(["--driver-root", "/nonexistent-gsb"]) == 125
    err = capsys.readouterr().err
    assert err.startswith("gpusandbox: error: ") and "\nhint: " in err


@pytest.mark.skipif(importlib.util.find_spec("gpusandbox.sim") is None,
                    reason="gpusandbox.sim (the simulated host) is not written yet")
def test_discovery_of_the_simulated_host():
    from gpusandbox import sim
    d, made = None, False
    try:
        for parent in ("/tmp", "/var/tmp"):   # the simulator refuses nodev filesystems
            d = tempfile.mkdtemp(prefix="gpusandbox-sim-", dir=parent)
            try:
                info = sim.create(d, gpus=4, pad_ldcache=2000, mig="2:1:0,2:2:0")
                made = True
                break
            except GpuError:
                shutil.rmtree(d, ignore_errors=True)
                d = None
        if d is None:
            pytest.skip("no filesystem here takes the simulator's device nodes")
        h = discover.discover(d)
        assert [(g.index, g.uuid, g.bus_id, g.minor) for g in h.gpus] == \
               [(g["index"], g["uuid"], g["bus_id"], g["minor"]) for g in info["gpus"]]
        assert h.version == info["driver_version"]
        assert h.majors["nvidia-uvm"] == info["majors"]["nvidia-uvm"]
        fams = {lib.family for lib in h.libs}
        assert {"libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"} <= fams
        if fx.IS_ROOT:
            assert h.problems == []
        sim_migs = info["gpus"][2]["mig"]
        assert [(m.gpu.index, m.gi, m.ci, m.ci_node.minor) for m in h.migs] == \
               [(2, m["gi"], m["ci"], m["ci_minor"]) for m in sim_migs]
        # MIG-<uuid> goes through the simulated libnvidia-ml in the helper.
        from gpusandbox.gpu import select
        sel = select.resolve(sim_migs[1]["uuid"], None, {}, h)
        assert [(m.gi, m.ci) for m in sel.migs] == [(2, 0)]
        # The simulator installs development links (libcuda.so) as drivers do:
        # the recorded SONAME must still be the versioned one.
        from gpusandbox.gpu import ldcache
        assert all(lib.soname == ldcache.elf_soname(lib.host_path) for lib in h.libs)
        assert any(os.path.islink(os.path.join(d, "usr/lib/x86_64-linux-gnu", f"{lib.family}.so"))
                   for lib in h.libs)
    finally:
        if made:
            sim.destroy(d)   # removes what it made, leaves our mkdtemp directory
        if d is not None:
            shutil.rmtree(d, ignore_errors=True)



def test_soname_comes_from_the_cache_key_not_the_dev_link(fake, host):
    """ldconfig also lists development links (libcuda.so) when they exist;
    the SONAME recorded for a library must be the versioned one, the same as
    its ELF DT_SONAME, without reading the ELF file."""
    from gpusandbox.gpu import ldcache
    assert host.libs
    for lib in host.libs:
        assert lib.soname == ldcache.elf_soname(lib.host_path), lib
        assert not lib.soname.endswith(".so")
