"""Driver roots with pieces missing, and driver files the loader cache does not list.

A launch injects what exists and names what is missing in one warning line;
only a capability that can do nothing without the missing piece fails it
(gpusandbox.gpu.inject.PIECES).  Libraries outside ld.so.cache (libvdpau's
plugin directory, a root without a cache or with a stale one) are found by
path in the driver's library directories, with the same checks as cache
entries (gpusandbox.gpu.libs)."""
import os
import shutil
import tempfile

import pytest

from gpusandbox import doctor
from gpusandbox.errors import GpuError
from gpusandbox.gpu import discover, inject, ldcache, select
from tests.unit import gpu_fixtures as fx

pytestmark = pytest.mark.skipif(not (fx.HAVE_GCC and fx.HAVE_LDCONFIG),
                                reason="the fake driver root needs gcc and ldconfig")
needs_root = pytest.mark.skipif(not fx.IS_ROOT, reason="device nodes need root to create")
V = fx.VERSION
L64 = "/usr/lib/x86_64-linux-gnu"


@pytest.fixture
def fake():
    with fx.FakeDriver(gpus=2, stale_libs=False) as fd:
        yield fd


@pytest.fixture
def image():
    root = tempfile.mkdtemp(prefix="gpusandbox-img-", dir="/tmp")
    os.makedirs(os.path.join(root, "etc"))
    with open(os.path.join(root, "etc/debian_version"), "w") as f:
        f.write("12.5\n")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def keep_only(fd, *families, cache=True):
    """Remove every library but `families` (and the plugin directory) and
    every binary; the cache is left stale (listing removed files) or removed."""
    d = fd.p(fx.LIBDIR)
    for name in os.listdir(d):
        path = os.path.join(d, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif not name.startswith(tuple(f + ".so" for f in families)):
            os.unlink(path)
    for b in fx.BINS:
        os.unlink(fd.p(f"usr/bin/{b}"))
    if not cache:
        os.unlink(fd.p("etc/ld.so.cache"))


def plan_for(host, gpus="0", caps=None):
    return inject.plan(host, select.resolve(gpus, caps, {}, host))


# --- item: partial roots ---------------------------------------------------------------

@pytest.mark.parametrize("cache", [True, False], ids=["stale-cache", "no-cache"])
def test_root_with_only_libcuda_runs_default_caps_with_one_warning(fake, image, cache):
    keep_only(fake, "libcuda", cache=cache)
    host = discover.discover(fake.root)
    assert [lib.name for lib in host.libs] == [f"libcuda.so.{V}"]
    inj = plan_for(host)                                   # utility,compute
    assert [(m.cap, m.piece) for m in inj.missing] == [
        ("compute", "libnvidia-ptxjitcompiler"), ("utility", "libnvidia-ml"),
        ("utility", "nvidia-smi")]
    line = inject.warning(inj)
    assert line.startswith("warning: ") and "\n" not in line
    assert "libnvidia-ml" in line and "nvidia-smi" in line and "(utility)" in line
    e = inject.build_edits(host, select.resolve("0", None, {}, host), image)
    paths = {m.path for m in e.mounts}
    assert f"{L64}/libcuda.so.{V}" in paths
    assert not any("libnvidia-ml" in p or p.endswith("nvidia-smi") for p in paths)
    links = {s.path: s.target for s in e.symlinks}
    assert links[f"{L64}/libcuda.so.1"] == f"libcuda.so.{V}"


def test_no_libcuda_under_compute_is_an_error_utility_alone_is_not(fake):
    keep_only(fake, "libnvidia-ml")
    host = discover.discover(fake.root)
    with pytest.raises(GpuError) as e:
        plan_for(host)
    assert f"libcuda.so.{V}" in e.value.what and "'compute'" in e.value.why
    assert e.value.hint and "\n" not in e.value.line() + e.value.hint
    inj = plan_for(host, caps="utility")
    assert [lib.family for lib in inj.libs] == ["libnvidia-ml"]
    assert [m.piece for m in inj.missing] == ["nvidia-smi"]


def test_every_requested_capability_useless_is_an_error(fake):
    keep_only(fake, "libcuda")
    host = discover.discover(fake.root)
    with pytest.raises(GpuError) as e:
        plan_for(host, caps="utility")
    assert "libnvidia-ml (utility)" in e.value.why and "none of these" in e.value.why
    assert f"libnvidia-ml.so.{V}" in e.value.hint
    # graphics and ngx lack everything, compute still works: a warning only
    inj = plan_for(host, caps="compute,graphics,ngx")
    assert {m.cap for m in inj.missing} == {"compute", "graphics", "ngx"}


@needs_root
def test_no_modeset_node_under_display_warns_a_wrong_one_is_refused(fake):
    os.unlink(fake.p("dev/nvidia-modeset"))
    host = discover.discover(fake.root)
    inj = plan_for(host, caps="all")
    assert "/dev/nvidia-modeset" not in [n.path for n in inj.nodes]
    assert [m.piece for m in inj.missing] == ["/dev/nvidia-modeset"]
    assert "nvidia-modeset (display)" in inject.warning(inj)
    assert "nvidia-modprobe -m" in inj.missing[0].fix
    fake.mknod("dev/nvidia-modeset", 195, 7)                 # there, but not modeset
    host = discover.discover(fake.root)
    with pytest.raises(GpuError) as e:
        plan_for(host, caps="display")
    assert "expected 195:254" in e.value.why


def test_complete_root_has_nothing_missing(fake):
    inj = plan_for(discover.discover(fake.root), caps="all")
    if fx.IS_ROOT:
        assert inj.missing == [] and inject.warning(inj) is None
    else:   # no device nodes without root
        assert [m.piece for m in inj.missing] == ["/dev/nvidia-modeset"]


# --- item: files the loader cache does not list -----------------------------------------

def _cache_paths(fd):
    with open(fd.p("etc/ld.so.cache"), "rb") as f:
        return {e.path for e in ldcache.parse(f.read())}


def test_vdpau_plugin_is_found_by_path_and_placed_in_its_directory(fake, image):
    real = fake.p(f"{fx.LIBDIR}/vdpau/libvdpau_nvidia.so.{V}")
    assert not any(b"vdpau" in p for p in _cache_paths(fake))       # never in the cache
    host = discover.discover(fake.root)
    vd = [lib for lib in host.libs if lib.family == "libvdpau_nvidia"]
    assert [(lib.host_path, lib.subdir, lib.cached, lib.bits, lib.soname) for lib in vd] == [
        (real, "vdpau", False, 64, "libvdpau_nvidia.so.1")]
    sel = select.resolve("0", "video", {}, host)
    assert real in [lib.host_path for lib in inject.plan(host, sel).libs]
    e = inject.build_edits(host, sel, image)
    m = {mt.path: mt for mt in e.mounts}
    assert m[f"{L64}/vdpau/libvdpau_nvidia.so.{V}"].host_path == real
    assert m[f"{L64}/vdpau/libvdpau_nvidia.so.{V}"].options == ("ro", "nosuid", "nodev")
    links = {s.path: s.target for s in e.symlinks}
    assert links[f"{L64}/vdpau/libvdpau_nvidia.so.1"] == f"libvdpau_nvidia.so.{V}"
    cache = next(f for f in e.files if f.path == "/etc/ld.so.cache")
    assert not any(b"vdpau" in x.path for x in ldcache.parse(cache.content))
    # video without the plugin: injected anyway, the plugin named as missing
    os.unlink(real)
    inj = plan_for(discover.discover(fake.root), caps="video")
    assert [m.piece for m in inj.missing] == ["libvdpau_nvidia"]


def test_library_added_after_ldconfig_is_found_by_path(fake):
    fx._cc("int of(void){return 0;}\n", fake.p(f"{fx.LIBDIR}/libnvidia-opticalflow.so.{V}"),
           "libnvidia-opticalflow.so.1")
    assert not any(b"opticalflow" in p for p in _cache_paths(fake))
    host = discover.discover(fake.root)
    of = [lib for lib in host.libs if lib.family == "libnvidia-opticalflow"]
    assert len(of) == 1 and not of[0].cached and of[0].soname == "libnvidia-opticalflow.so.1"
    # cache entries are not found twice
    names = [lib.host_path for lib in host.libs]
    assert len(names) == len(set(names))
    assert [lib for lib in host.libs if lib.family == "libcuda" and lib.bits == 64][0].cached


def test_files_by_path_are_found_without_listing_the_library_directory(fake, monkeypatch):
    """A distribution's library directory holds a few thousand files: the
    files the cache does not list are looked up by name, never listed."""
    fx._cc("int of(void){return 0;}\n", fake.p(f"{fx.LIBDIR}/libnvidia-opticalflow.so.{V}"),
           "libnvidia-opticalflow.so.1")
    listdir = os.listdir

    def no_lib_listing(path="."):
        assert "x86_64-linux-gnu" not in os.fspath(path), path
        return listdir(path)
    monkeypatch.setattr(os, "listdir", no_lib_listing)
    host = discover.discover(fake.root)
    assert [lib.name for lib in host.libs if not lib.cached] == \
        [f"libnvidia-opticalflow.so.{V}", f"libvdpau_nvidia.so.{V}"]


def test_path_lookup_applies_the_version_file_and_root_checks(fake):
    vd = fake.p(f"{fx.LIBDIR}/vdpau")
    os.unlink(os.path.join(vd, f"libvdpau_nvidia.so.{V}"))
    os.unlink(os.path.join(vd, "libvdpau_nvidia.so.1"))
    lib = fake.p(fx.LIBDIR)
    # another driver version's file: not this driver
    fx._cc("int a(void){return 0;}\n", os.path.join(vd, "libvdpau_nvidia.so.535.104.05"))
    # named for this version, but the real file is not
    os.symlink("libvdpau_nvidia.so.535.104.05", os.path.join(vd, f"libvdpau_nvidia.so.{V}"))
    # links that would leave the driver root: resolved inside it, where nothing is
    os.symlink("/etc/passwd", os.path.join(lib, f"libnvidia-fbc.so.{V}"))
    os.symlink("../../../../../../../../../../usr/bin/env",
               os.path.join(lib, f"libnvidia-ifr.so.{V}"))
    # not a regular file, not ELF, not a driver family
    os.mkdir(os.path.join(lib, f"libnvidia-rtcore.so.{V}"))
    with open(os.path.join(lib, f"libnvoptix.so.{V}"), "w") as f:
        f.write("not an ELF object\n")
    fx._cc("int b(void){return 0;}\n", os.path.join(lib, f"libbar.so.{V}"))
    # and one that passes every check
    fx._cc("int c(void){return 0;}\n", os.path.join(lib, f"libnvidia-cbl.so.{V}"))
    host = discover.discover(fake.root)
    by_path = sorted(lib.name for lib in host.libs if not lib.cached)
    assert by_path == [f"libnvidia-cbl.so.{V}"]
    assert all(lib.host_path.startswith(fake.root + "/") for lib in host.libs)


# --- doctor -------------------------------------------------------------------------------

def _opts(fd):
    return doctor.Options(gpus="all", driver_root=fd.root, probes=False)


def test_doctor_lists_every_missing_piece_with_its_fix(fake):
    keep_only(fake, "libcuda")
    checks, host, _ = doctor.check_driver(_opts(fake))
    assert host is not None
    warned = {c.name: c for c in checks if c.status == doctor.WARN}
    for name in ("libnvidia-ml (utility)", "nvidia-smi (utility)",
                 "libnvidia-ptxjitcompiler (compute)", "libvdpau_nvidia (video)",
                 "libGLX_nvidia (graphics)", "libnvidia-ngx (ngx)"):
        assert name in warned, sorted(warned)
        assert warned[name].fix
    assert f"libnvidia-ml.so.{V}" in warned["libnvidia-ml (utility)"].fix
    assert "capabilities" not in {c.name for c in checks}


def test_doctor_host_gpu_listing_reads_as_nvidia_smi_l(fake):
    host = discover.discover(fake.root)
    listing = doctor.gpu_listing(host.gpus)
    assert listing == "; ".join(
        f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {fx.gpu_uuid(i)}), bus {fx.bus_id(i)}"
        for i in range(2))
    sel = select.resolve("1", None, {}, host)
    c = doctor.check_verify(_opts(fake), host, sel, None)[0]
    assert c.name == "host GPU listing" and c.status == doctor.PASS
    assert f"GPU 1: NVIDIA H100 80GB HBM3 (UUID: {fx.gpu_uuid(1)}), bus {fx.bus_id(1)}" in c.detail
    assert "GPU 0:" not in c.detail
