"""Injection as data: ContainerEdits for a selection, and `gpusandbox list`."""
import os
import shutil
import subprocess
import tempfile

import pytest

from gpusandbox.errors import GpuError
from gpusandbox.gpu import ceiling, discover, inject, ldcache, report, select
from tests.unit import gpu_fixtures as fx

pytestmark = pytest.mark.skipif(not (fx.HAVE_GCC and fx.HAVE_LDCONFIG),
                                reason="the fake driver root needs gcc and ldconfig")
needs_root = pytest.mark.skipif(not fx.IS_ROOT, reason="device nodes need root to create")
L64 = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def fake():
    with fx.FakeDriver(gpus=3, mig={1: [(1, 0), (2, 0)]}, compat32=True) as fd:
        yield fd


@pytest.fixture(scope="module")
def host(fake):
    return discover.discover(fake.root)


@pytest.fixture
def image():
    root = tempfile.mkdtemp(prefix="gpusandbox-img-", dir="/tmp")
    os.makedirs(os.path.join(root, "etc"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def debian(image):
    with open(os.path.join(image, "etc/debian_version"), "w") as f:
        f.write("12.5\n")
    return image


def edits_for(host, image, gpus="1", caps=None, environ=None):
    sel = select.resolve(gpus, caps, environ or {}, host)
    return sel, inject.build_edits(host, sel, image, environ or {})


def mounts(e):
    return {m.path: m for m in e.mounts}


@needs_root
def test_only_selected_gpu_nodes_and_the_control_nodes(fake, host, image):
    _, e = edits_for(host, image, "1")
    assert [(d.path, d.major, d.minor) for d in e.device_nodes] == [
        ("/dev/nvidiactl", 195, 255), ("/dev/nvidia1", 195, 1),
        ("/dev/nvidia-uvm", fx.UVM_MAJOR, 0), ("/dev/nvidia-uvm-tools", fx.UVM_MAJOR, 1)]
    assert e.device_nodes[1].host_path == fake.p("dev/nvidia1")
    _, e = edits_for(host, image, "0", caps="utility")
    assert [d.path for d in e.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia2"]
    _, e = edits_for(host, image, "none", caps="display")
    assert [d.path for d in e.device_nodes] == ["/dev/nvidiactl", "/dev/nvidia-modeset"]


@needs_root
def test_mig_selection_brings_its_parent_and_caps_nodes(fake, host, image):
    sel, e = edits_for(host, image, "1:2", caps="utility")
    gi, ci = fake.cap_minors(1, 2, 0)
    assert [(d.path, d.major, d.minor) for d in e.device_nodes] == [
        ("/dev/nvidiactl", 195, 255), ("/dev/nvidia1", 195, 1),
        (f"/dev/nvidia-caps/nvidia-cap{gi}", fx.CAPS_MAJOR, gi),
        (f"/dev/nvidia-caps/nvidia-cap{ci}", fx.CAPS_MAJOR, ci)]
    m = mounts(e)
    assert "/proc/driver/nvidia/capabilities/gpu1/mig/gi2/ci0/access" in m
    assert "/proc/driver/nvidia/capabilities/gpu1/mig/gi1/access" not in m
    assert inject.device_rules(host, sel) == [("c", d.major, d.minor, "rwm")
                                              for d in e.device_nodes]


@needs_root
def test_swapped_host_node_is_refused():
    with fx.FakeDriver(gpus=2, stale_libs=False) as fd:
        fd.mknod("dev/nvidia0", 195, 1)
        h = discover.discover(fd.root)
        img = tempfile.mkdtemp(dir="/tmp")
        try:
            with pytest.raises(GpuError) as e:
                inject.build_edits(h, select.resolve("1", None, {}, h), img)   # minor 0
            assert "expected 195:0" in e.value.why
            inject.build_edits(h, select.resolve("0", None, {}, h), img)       # minor 1 is fine
        finally:
            os.rmdir(img)


def test_library_placement_and_soname_links(host, image):
    v = fx.VERSION
    _, e = edits_for(host, debian(image), "0", caps="compute,utility,graphics")
    m = mounts(e)
    assert m[f"{L64}/libcuda.so.{v}"].host_path.endswith(f"/{fx.LIBDIR}/libcuda.so.{v}")
    assert m[f"{L64}/libcuda.so.{v}"].options == ("ro", "nosuid", "nodev")
    links = {s.path: s.target for s in e.symlinks}
    assert links[f"{L64}/libcuda.so.1"] == f"libcuda.so.{v}"
    assert links[f"{L64}/libcuda.so"] == "libcuda.so.1"
    assert links[f"{L64}/libnvidia-nvvm.so.4"] == f"libnvidia-nvvm.so.{v}"    # from DT_SONAME
    assert links[f"{L64}/libGLX_nvidia.so.0"] == f"libGLX_nvidia.so.{v}"
    assert f"{L64}/libnvidia-glcore.so.{v}" in m                              # SONAME = file name
    assert not any("glcore" in p for p in links)
    assert not any("/usr/lib/i386-linux-gnu" in p for p in m)                  # no compat32 asked
    assert not any("fbc" in p or "libfoo" in p for p in m)
    assert all("/" not in t for t in links.values())


def test_rpm_style_image_and_compat32(host, image):
    _, e = edits_for(host, image, "0", caps="compute,compat32")
    m = mounts(e)
    assert f"/usr/lib64/libcuda.so.{fx.VERSION}" in m
    assert f"/usr/lib/libcuda.so.{fx.VERSION}" in m
    assert m[f"/usr/lib/libcuda.so.{fx.VERSION}"].host_path.endswith(
        f"/{fx.LIBDIR32}/libcuda.so.{fx.VERSION}")


def test_binaries_firmware_ipc_by_capability(fake, host, image):
    _, e = edits_for(host, image, "0", caps="utility")
    m = mounts(e)
    assert m["/usr/bin/nvidia-smi"].host_path == fake.p("usr/bin/nvidia-smi")
    assert "/usr/bin/nvidia-cuda-mps-control" not in m and "/tmp/nvidia-mps" not in m
    assert m[f"/lib/firmware/nvidia/{fx.VERSION}/gsp_ga10x.bin"]
    assert "noexec" in m["/var/run/nvidia-persistenced/socket"].options
    _, e = edits_for(host, image, "0", caps="compute")
    m = mounts(e)
    assert "/usr/bin/nvidia-smi" not in m and "/usr/bin/nvidia-cuda-mps-server" in m
    assert m["/tmp/nvidia-mps"].host_path == fake.p("tmp/nvidia-mps")
    # Read-only (a sandbox must not replace the daemon's sockets), and bound
    # from the inode discovery checked.
    assert m["/tmp/nvidia-mps"].options == ("ro", "nosuid", "nodev", "noexec")
    st = os.stat(fake.p("tmp/nvidia-mps"))
    assert m["/tmp/nvidia-mps"].ident == (st.st_dev, st.st_ino)
    assert m["/etc/OpenCL/vendors/nvidia.icd"]


def test_masked_proc_shows_only_the_selection(fake, host, image):
    _, e = edits_for(host, image, "2")
    assert [t.path for t in e.tmpfs] == ["/proc/driver"]
    m = mounts(e)
    gpus = [p for p in m if p.startswith("/proc/driver/nvidia/gpus/")]
    assert gpus == [f"/proc/driver/nvidia/gpus/{fx.bus_id(2)}"]
    assert m["/proc/driver/nvidia/version"].host_path == fake.p("proc/driver/nvidia/version")
    params = [f for f in e.files if f.path == "/proc/driver/nvidia/params"][0].content.decode()
    assert "ModifyDeviceFiles: 0" in params and "ModifyDeviceFiles: 1" not in params
    assert "DeviceFileUID: 0" in params


def test_environment_is_the_host_side_resolution(host, image):
    env = {"CUDA_VISIBLE_DEVICES": "2,0", "NVIDIA_VISIBLE_DEVICES": "all"}
    sel, e = edits_for(host, image, "0,2", environ=env)
    assert e.env["NVIDIA_VISIBLE_DEVICES"] == f"{fx.gpu_uuid(0)},{fx.gpu_uuid(2)}"
    assert e.env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert e.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    _, e = edits_for(host, image, "0")
    assert "CUDA_VISIBLE_DEVICES" not in e.env


def _listing(content, tmp):
    path = os.path.join(tmp, "cache")
    with open(path, "wb") as f:
        f.write(content)
    return subprocess.run(["ldconfig", "-p", "-C", path], capture_output=True, text=True,
                          check=True).stdout


def test_ld_so_cache_merges_image_and_driver(host, image):
    debian(image)
    img = [ldcache.Entry(b"libz.so.1", b"/lib/x86_64-linux-gnu/libz.so.1"),
           ldcache.Entry(b"libcuda.so.1", b"/usr/local/cuda/compat/libcuda.so.1")]
    with open(os.path.join(image, "etc/ld.so.cache"), "wb") as f:
        f.write(ldcache.build(img))
    _, e = edits_for(host, image, "0", caps="compute,compat32")
    cache = [f for f in e.files if f.path == "/etc/ld.so.cache"][0]
    assert cache.mode == 0o444
    out = _listing(cache.content, image)
    assert "libz.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libz.so.1" in out
    assert f"libcuda.so.1 (libc6,x86-64) => {L64}/libcuda.so.1" in out
    assert "libcuda.so.1 (ELF) => /usr/lib/i386-linux-gnu/libcuda.so.1" in out
    assert f"libnvidia-nvvm.so.4 (libc6,x86-64) => {L64}/libnvidia-nvvm.so.4" in out
    assert "/usr/local/cuda/compat" not in out      # the image's libcuda would shadow the driver


def test_hostile_image_files_stay_inside_the_image(host, image):
    # Absolute and ../ links would reach the host's Debian files from a naive open().
    os.symlink("/etc/ld.so.cache", os.path.join(image, "etc/ld.so.cache"))
    os.symlink("../../../../../../etc/debian_version", os.path.join(image, "etc/debian_version"))
    _, e = edits_for(host, image, "0")
    assert f"/usr/lib64/libcuda.so.{fx.VERSION}" in mounts(e)        # not Debian placement
    out = _listing([f for f in e.files if f.path == "/etc/ld.so.cache"][0].content, image)
    assert "libc.so.6" not in out                                    # host cache not read
    os.unlink(os.path.join(image, "etc/ld.so.cache"))
    with open(os.path.join(image, "etc/ld.so.cache"), "wb") as f:
        f.write(ldcache.NEW_MAGIC + b"\xff" * 100)                   # garbage: dropped
    _, e = edits_for(host, image, "0")
    assert "libcuda.so.1" in _listing(e.files[0].content, image)


def test_missing_required_library_is_a_gpu_error(image):
    with fx.FakeDriver(gpus=1, stale_libs=False) as fd:
        for n in os.listdir(fd.p(fx.LIBDIR)):
            if n.startswith("libcuda"):
                os.unlink(fd.p(f"{fx.LIBDIR}/{n}"))
        subprocess.run(["ldconfig", "-X", "-r", fd.root], check=True, capture_output=True)
        h = discover.discover(fd.root)
        with pytest.raises(GpuError) as e:
            edits_for(h, image, "0", caps="compute")
        assert "libcuda" in e.value.what and "compute" in e.value.hint
        edits_for(h, image, "0", caps="utility")


def test_uvm_missing_fails_compute_only(image):
    with fx.FakeDriver(gpus=1, uvm=False, stale_libs=False) as fd:
        h = discover.discover(fd.root)
        with pytest.raises(GpuError, match="nvidia-uvm"):
            edits_for(h, image, "0", caps="compute")
        if fx.IS_ROOT:
            edits_for(h, image, "0", caps="utility")


def test_cuda_ceiling_from_the_host_libcuda(host, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache1"))
    assert ceiling.driver_cuda_version(host) == (12, 4)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache2"))   # a cold cache: the helper runs
    seen = {}
    import subprocess as sp
    real = sp.run

    def spy(argv, **kw):
        seen.update(argv=argv, env=kw.get("env"), cwd=kw.get("cwd"))
        return real(argv, **kw)
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent/evil.so")
    monkeypatch.setattr(sp, "run", spy)
    assert ceiling.driver_cuda_version(host) == (12, 4)
    assert seen["env"] == {} and seen["cwd"] == "/" and seen["argv"][1:3] == ["-I", "-S"]
    assert seen["argv"][-1].startswith(host.driver_root + "/")


def test_list_report_groups_host_paths(fake, capsys):
    assert report.main_list(["--driver-root", fake.root, "--gpus", "1", "--json"]) == 0
    import json
    data = json.loads(capsys.readouterr().out)
    if fx.IS_ROOT:
        assert data["devices"] == [fake.p(p) for p in ("dev/nvidiactl", "dev/nvidia1",
                                                       "dev/nvidia-uvm", "dev/nvidia-uvm-tools")]
    assert fake.p(f"{fx.LIBDIR}/libcuda.so.{fx.VERSION}") in data["libraries"]
    assert fake.p("usr/bin/nvidia-smi") in data["binaries"]
    assert data["firmware"] and data["ipc"]
    assert report.main_list(["--driver-root", fake.root, "--gpus", "9"]) == 125
    err = capsys.readouterr().err
    assert "gpusandbox: error: --gpus '9': unknown device '9'" in err and "hint:" in err


@needs_root
def test_in_place_adds_nodes_ipc_and_proc_but_no_driver_file(fake, host, image):
    """The host's root with the host's driver (hostroot.py): the libraries,
    binaries, firmware and loader cache are already where the host keeps
    them, and nothing is bound over them; nodes, /proc/driver and env stay."""
    sel = select.resolve("1", "all", {}, host)
    full = inject.build_edits(host, sel, debian(image), {})
    e = inject.build_edits(host, sel, image, {}, private=True, in_place=True)
    assert [d.path for d in e.device_nodes] == [d.path for d in full.device_nodes]
    assert not [f for f in e.files if f.path == "/etc/ld.so.cache"]
    assert not e.symlinks
    hosted = {m.host_path for m in e.mounts}
    assert not [p for p in hosted if ".so" in p or "/bin/" in p or "firmware" in p]
    assert {"/proc/driver/nvidia/version", "/proc/driver/nvidia/params"} <= \
        {m.path for m in e.mounts} | {f.path for f in e.files}
    assert e.env["NVIDIA_VISIBLE_DEVICES"] == full.env["NVIDIA_VISIBLE_DEVICES"]
