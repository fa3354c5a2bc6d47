"""Partial driver roots and driver files outside the loader cache, through the real CLI.

Each test cuts pieces out of its own simulated host (`gpusandbox sim create`):
a launch injects what exists and names the rest in one warning line; only a
capability that can do nothing without a missing piece (compute without
libcuda) fails it.  libvdpau_nvidia, which no ld.so.cache lists, is found by
path.  `doctor` names every missing piece and lists GPUs as `nvidia-smi -L`."""
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from gpusandbox.gpu import ldcache
from tests.integration.conftest import host_mounts

LIBDIR = "usr/lib/x86_64-linux-gnu"
VERSION = "550.54.15"
_CUDA = ("import ctypes\nlib=ctypes.CDLL('libcuda.so.1')\nn=ctypes.c_int(-1)\n"
         "r=lib.cuInit(0)\nc=lib.cuDeviceGetCount(ctypes.byref(n))\nprint('CUDA', r, c, n.value)\n")


@pytest.fixture
def make_sim(cli):
    """Fresh simulated hosts (2 GPUs) the test may cut pieces out of."""
    made = []

    def make():
        base = tempfile.mkdtemp(prefix="gsbx-test-partial-", dir="/tmp")
        os.chmod(base, 0o755)
        root = os.path.join(base, "host")
        made.append((base, root))
        res = subprocess.run([cli, "sim", "create", root, "--gpus", "2"], capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        return root

    yield make
    for base, root in made:
        subprocess.run([cli, "sim", "destroy", root], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def keep_only(root, *families, cache=True):
    """Remove every driver library but `families` (32-bit copies and the
    vdpau plugin too) and every driver binary."""
    for d in (LIBDIR, "usr/lib/i386-linux-gnu"):
        d = os.path.join(root, d)
        for name in os.listdir(d) if os.path.isdir(d) else ():
            path = os.path.join(d, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif name.startswith("lib") and not name.startswith(tuple(f + ".so" for f in families)):
                os.unlink(path)
    for name in ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
                 "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
        os.unlink(os.path.join(root, "usr/bin", name))
    if not cache:
        os.unlink(os.path.join(root, "etc/ld.so.cache"))


def gpu_run(runner, root, rootfs, *cmd, caps=None, gpus="0"):
    args = ["--driver-root", root, "--gpus", gpus]
    if caps:
        args += ["--gpu-caps", caps]
    return runner.run(args + [str(rootfs), *cmd])


def one_warning(stderr):
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpusandbox: warning: "), stderr
    return lines[0]


@pytest.mark.parametrize("cache", [True, False], ids=["stale-cache", "no-cache"])
def test_root_with_only_libcuda_runs_cuda_with_one_warning(runner, make_sim, rootfs, cache):
    root = make_sim()
    keep_only(root, "libcuda", cache=cache)
    r = gpu_run(runner, root, rootfs, "python3", "-c", _CUDA)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["CUDA", "0", "0", "1"]
    line = one_warning(r.stderr)
    assert "libnvidia-ml" in line and "nvidia-smi" in line
    r = runner.run(["list", "--driver-root", root, "--gpus", "0"])
    assert r.returncode == 0, r.stderr
    assert one_warning(r.stderr) == line
    assert os.path.join(root, LIBDIR, f"libcuda.so.{VERSION}") in r.stdout.split()


def test_no_libcuda_under_compute_is_one_error_line(runner, make_sim, rootfs):
    root = make_sim()
    keep_only(root, "libnvidia-ml")
    before = host_mounts()
    r = gpu_run(runner, root, rootfs, "true")
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"gpusandbox: error: driver library libcuda.so.{VERSION}: "), r.stderr
    assert "'compute'" in lines[0]
    assert len(lines) == 2 and lines[1].startswith("hint: "), r.stderr
    assert host_mounts() == before
    # utility alone has what it needs
    r = gpu_run(runner, root, rootfs, "true", caps="utility")
    assert r.returncode == 0 and "nvidia-smi (utility)" in one_warning(r.stderr)


def test_no_modeset_node_under_all_runs_with_a_warning(runner, make_sim, rootfs):
    root = make_sim()
    os.unlink(os.path.join(root, "dev/nvidia-modeset"))
    r = gpu_run(runner, root, rootfs, "ls", "/dev", caps="all")
    assert r.returncode == 0, r.stderr
    assert "nvidia0" in r.stdout.split() and "nvidia-modeset" not in r.stdout.split()
    line = one_warning(r.stderr)
    assert "/dev/nvidia-modeset (display)" in line and "lib" not in line


def test_vdpau_plugin_outside_the_cache_is_injected_under_video(runner, make_sim, rootfs):
    root = make_sim()
    plugin = os.path.join(root, LIBDIR, "vdpau", f"libvdpau_nvidia.so.{VERSION}")
    with open(os.path.join(root, "etc/ld.so.cache"), "rb") as f:
        assert not any(b"vdpau" in e.path for e in ldcache.parse(f.read()))
    assert os.path.isfile(plugin)
    r = gpu_run(runner, root, rootfs, "sh", "-c", f"cd /{LIBDIR}/vdpau && ls -l", caps="video")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert f"libvdpau_nvidia.so.1 -> libvdpau_nvidia.so.{VERSION}" in r.stdout
    assert any(ln.split()[-1] == f"libvdpau_nvidia.so.{VERSION}" and ln.startswith("-r")
               for ln in r.stdout.splitlines()), r.stdout
    r = runner.run(["list", "--driver-root", root, "--gpus", "0", "--gpu-caps", "video", "--json"])
    assert r.returncode == 0, r.stderr
    assert plugin in json.loads(r.stdout)["libraries"]
    r = runner.run(["list", "--driver-root", root, "--gpus", "0", "--json"])
    assert plugin not in json.loads(r.stdout)["libraries"]      # not without video


def _doctor(runner, root):
    r = runner.run(["doctor", "--json", "--driver-root", root], timeout=300)
    assert r.stdout, r.stderr
    return {c["name"]: c for c in json.loads(r.stdout)["checks"]}


def test_doctor_names_missing_pieces_and_lists_gpus_as_nvidia_smi(runner, make_sim):
    root = make_sim()
    smi = subprocess.run([os.path.join(root, "usr/bin/nvidia-smi"), "-L"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert len(smi) == 2
    checks = _doctor(runner, root)
    listing = checks["host GPU listing"]["detail"]
    for line, bus in zip(smi, ("0000:06:00.0", "0000:07:00.0")):
        assert f"{line}, bus {bus}" in listing, (line, listing)
    assert checks["capabilities"]["status"] == "pass"
    keep_only(root, "libcuda")
    os.unlink(os.path.join(root, "dev/nvidia-modeset"))
    checks = _doctor(runner, root)
    for name in ("libnvidia-ml (utility)", "nvidia-smi (utility)",
                 "/dev/nvidia-modeset (display)", "libvdpau_nvidia (video)"):
        assert checks[name]["status"] == "warn", checks.get(name)
        assert checks[name]["fix"], checks[name]
    assert f"libnvidia-ml.so.{VERSION}" in checks["libnvidia-ml (utility)"]["fix"]
    assert "nvidia-modprobe -m" in checks["/dev/nvidia-modeset (display)"]["fix"]
    assert checks["driver libraries"]["status"] == "pass"
