"""GPU injection as a user sees it (issue 3, 'Verified end to end'): the
installed CLI on a simulated 4-GPU host, as root and as an unprivileged user.

The simulated driver's libcuda and nvidia-smi count the /dev/nvidiaN nodes
the process can open, so what they print inside the sandbox is what the
launcher really put there."""
import hashlib
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from .conftest import host_mounts, tree_checksum

LIBDIR = "/usr/lib/x86_64-linux-gnu"
VERSION = "550.54.15"
CONTROL = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}

CUDA_PROBE = (
    "import ctypes\n"
    "lib = ctypes.CDLL('libcuda.so.1')\n"
    "n, v = ctypes.c_int(-1), ctypes.c_int(-1)\n"
    "init = lib.cuInit(0)\n"
    "lib.cuDeviceGetCount(ctypes.byref(n))\n"
    "lib.cuDriverGetVersion(ctypes.byref(v))\n"
    "print(init, n.value, v.value)\n")


def run(runner, sim, image, script, *opts, env=None):
    return runner.run(["--driver-root", sim.root, *opts, str(image), "sh", "-c", script],
                      env=env)


def nvidia_names(listing):
    return {n for n in listing.split() if n.startswith("nvidia")}


def smi_uuids(out):
    """UUIDs of the 'GPU i: ...' lines of nvidia-smi -L, in order, with i checked."""
    gpus = [ln for ln in out.splitlines() if ln.startswith("GPU ")]
    for i, line in enumerate(gpus):
        assert line.startswith(f"GPU {i}: "), out
    return [ln.rsplit("UUID: ", 1)[1].rstrip(")") for ln in gpus]


def test_two_gpus_numbered_from_zero(runner, sim_host, rootfs):
    r = run(runner, sim_host, rootfs, "nvidia-smi -L", "--gpus", "1,3")
    assert r.returncode == 0, r.stderr
    assert smi_uuids(r.stdout) == [sim_host.gpus[1]["uuid"], sim_host.gpus[3]["uuid"]]


def test_info_json_agrees_with_the_driver_files(runner, sim_host):
    r = runner.run(["info", "--driver-root", sim_host.root, "--json"])
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["driver_version"] == VERSION and data["cuda_version"] == "12.4"
    info = os.path.join(sim_host.root, "proc/driver/nvidia/gpus/{}/information")
    for g in data["gpus"]:
        text = open(info.format(g["bus_id"])).read()
        assert g["uuid"] in text and g["uuid"] == sim_host.gpus[g["index"]]["uuid"]
    assert [(m["gpu"], m["gi"], m["ci"], m["gi_cap_minor"], m["ci_cap_minor"])
            for m in data["mig_devices"]] == [
        (2, m["gi"], m["ci"], m["gi_minor"], m["ci_minor"]) for m in sim_host.gpus[2]["mig"]]
    assert data["problems"] == []


def test_info_human_output_and_isolation_line(runner, sim_host):
    r = runner.run(["info", "--driver-root", sim_host.root])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert f"driver version: {VERSION}" in lines and "cuda version: 12.4" in lines
    for g in sim_host.gpus:
        assert any(ln.startswith(f"gpu {g['index']}: ") and g["uuid"] in ln and g["bus_id"] in ln
                   for ln in lines), r.stdout
    assert any(ln.strip().startswith("mig 2:1:0") for ln in lines)
    iso = next(ln for ln in lines if ln.startswith("device isolation: "))
    if runner.mode == "root":
        assert "BPF device filter" in iso
    else:
        # Never pretend: without privileges only the bind mounts keep GPUs apart.
        assert "bind-mounted nodes only" in iso


def test_dev_holds_only_selected_nodes(runner, sim_host, rootfs):
    r = run(runner, sim_host, rootfs, "ls -A /dev", "--gpus", "1,3")
    assert r.returncode == 0, r.stderr
    assert nvidia_names(r.stdout) == {"nvidia1", "nvidia3"} | CONTROL


def test_libcuda_through_ctypes(runner, sim_host, rootfs):
    r = runner.run(["--driver-root", sim_host.root, "--gpus", "1,3", str(rootfs),
                    "python3", "-c", CUDA_PROBE])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "2", str(sim_host.info["cuda_driver_version"])]
    assert sim_host.info["cuda_driver_version"] == 12040


def test_gpus_none_has_driver_files_but_no_gpu(runner, sim_host, rootfs):
    r = run(runner, sim_host, rootfs, "nvidia-smi -L; echo smi=$?; ls -A /dev; echo ---; "
            f"ls {LIBDIR}", "--gpus", "none")
    assert r.returncode == 0, r.stderr
    assert "No devices found." in r.stdout
    devs, libs = r.stdout.split("---")
    assert nvidia_names(devs) == CONTROL
    assert {"libcuda.so.1", f"libcuda.so.{VERSION}", "libnvidia-ml.so.1"} <= set(libs.split())
    r = runner.run(["--driver-root", sim_host.root, "--gpus", "none", str(rootfs),
                    "python3", "-c", CUDA_PROBE])
    assert r.stdout.split()[0] == "100"   # CUDA_ERROR_NO_DEVICE


NO_NVIDIA = ("ls -A /dev; echo ---; ls -A {lib}; echo ---; ls -A /proc/driver; echo ---; "
             "command -v nvidia-smi || echo no-smi").format(lib=LIBDIR)


def assert_no_nvidia(out):
    devs, libs, procdrv, smi = out.split("---")
    assert nvidia_names(devs) == set()
    assert not [n for n in libs.split() if "cuda" in n or "nvidia" in n]
    assert "nvidia" not in procdrv
    assert smi.strip() == "no-smi"


def test_no_gpu_option_injects_nothing(runner, sim_host, rootfs):
    r = run(runner, sim_host, rootfs, NO_NVIDIA)
    assert r.returncode == 0, r.stderr
    assert_no_nvidia(r.stdout)


def test_caller_nvidia_visible_devices(runner, sim_host, rootfs):
    r = run(runner, sim_host, rootfs, "nvidia-smi -L; ls -A /dev",
            env={"NVIDIA_VISIBLE_DEVICES": "1"})
    assert r.returncode == 0, r.stderr
    assert smi_uuids(r.stdout) == [sim_host.gpus[1]["uuid"]]
    assert nvidia_names(r.stdout) == {"nvidia1"} | CONTROL
    r = run(runner, sim_host, rootfs, NO_NVIDIA, env={"NVIDIA_VISIBLE_DEVICES": "void"})
    assert r.returncode == 0, r.stderr
    assert_no_nvidia(r.stdout)


def test_image_environment_never_widens_selection(runner, sim_host, small_rootfs):
    with open(small_rootfs / "etc" / "environment", "a") as f:
        f.write("NVIDIA_VISIBLE_DEVICES=all\nNVIDIA_DRIVER_CAPABILITIES=all\n")
    r = run(runner, sim_host, small_rootfs, "nvidia-smi -L; ls -A /dev", "--gpus", "0")
    assert r.returncode == 0, r.stderr
    assert smi_uuids(r.stdout) == [sim_host.gpus[0]["uuid"]]
    assert nvidia_names(r.stdout) == {"nvidia0"} | CONTROL
    # Without --gpus the image's variable alone grants nothing.
    r = run(runner, sim_host, small_rootfs, "ls -A /dev")
    assert r.returncode == 0, r.stderr
    assert nvidia_names(r.stdout) == set()


def test_cuda_visible_devices_renumbered(runner, sim_host, rootfs):
    r = run(runner, sim_host, rootfs, "echo $CUDA_VISIBLE_DEVICES; nvidia-smi -L", "--gpus", "3",
            env={"CUDA_VISIBLE_DEVICES": "3"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == "0"
    assert smi_uuids(r.stdout) == [sim_host.gpus[3]["uuid"]]


@pytest.mark.parametrize("how", ["uuid", "bus-short", "bus-long", "bus-8-digit-domain"])
def test_select_gpu_by_uuid_and_bus_id(runner, sim_host, rootfs, how):
    g = sim_host.gpus[2]
    bus = g["bus_id"]
    sel = {"uuid": g["uuid"], "bus-short": bus[5:], "bus-long": bus,
           "bus-8-digit-domain": "0000" + bus}[how]
    r = run(runner, sim_host, rootfs, "nvidia-smi -L; ls -A /dev", "--gpus", sel)
    assert r.returncode == 0, r.stderr
    assert smi_uuids(r.stdout) == [g["uuid"]]
    assert nvidia_names(r.stdout) == {"nvidia2"} | CONTROL


@pytest.mark.parametrize("how", ["gi", "gi-ci", "mig-uuid"])
def test_select_mig_device(runner, sim_host, rootfs, how):
    mig = sim_host.mig(2, 2)
    other = sim_host.mig(2, 1)
    sel = {"gi": "2:2", "gi-ci": "2:2:0", "mig-uuid": mig["uuid"]}[how]
    r = run(runner, sim_host, rootfs, "nvidia-smi -L; ls -A /dev; echo ---; ls -A /dev/nvidia-caps",
            "--gpus", sel)
    assert r.returncode == 0, r.stderr
    out, caps = r.stdout.split("---")
    assert smi_uuids(out) == [sim_host.gpus[2]["uuid"]]
    migs = [ln for ln in out.splitlines() if ln.strip().startswith("MIG ")]
    assert len(migs) == 1 and mig["uuid"] in migs[0] and other["uuid"] not in out
    assert nvidia_names(out) == {"nvidia2", "nvidia-caps"} | CONTROL
    assert set(caps.split()) == {f"nvidia-cap{mig['gi_minor']}", f"nvidia-cap{mig['ci_minor']}"}


@pytest.mark.parametrize("item", ["9", "GPU-00000000-1111-2222-3333-444444444444",
                                  "0000:zz:00.0", "0:1", "abc", "0,9"])
def test_bad_selector_one_line_error(runner, sim_host, rootfs, item):
    bad = item.split(",")[-1]
    before = host_mounts()
    r = runner.run(["--driver-root", sim_host.root, "--gpus", item, str(rootfs), "true"])
    assert r.returncode == 125, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert lines[0].startswith("gpusandbox: error: ") and f"'{bad}'" in lines[0], r.stderr
    # The hint lists what exists: every GPU and every MIG device.
    assert lines[1].startswith("hint: ")
    for g in sim_host.gpus:
        assert g["uuid"] in lines[1] and g["bus_id"] in lines[1]
    assert "2:1:0" in lines[1] and "2:2:0" in lines[1]
    assert host_mounts() == before


def test_empty_selector_is_a_usage_error(runner, sim_host, rootfs):
    r = runner.run(["--driver-root", sim_host.root, "--gpus", "", str(rootfs), "true"])
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("gpusandbox: error: --gpus ''"), r.stderr
    assert lines[1].startswith("hint: ")


def test_gpu_caps(runner, sim_host, rootfs):
    ls = f"ls -A {LIBDIR}; echo ---; command -v nvidia-smi; ls -A /dev"
    r = run(runner, sim_host, rootfs, ls, "--gpus", "0", "--gpu-caps", "utility")
    assert r.returncode == 0, r.stderr
    libs, rest = r.stdout.split("---")
    assert "libnvidia-ml.so.1" in libs.split()
    assert not [n for n in libs.split() if n.startswith(("libcuda", "libGLX", "libEGL"))]
    assert "/usr/bin/nvidia-smi" in rest.split()
    assert "nvidia-uvm" not in rest.split()   # CUDA's node comes with compute only
    r = run(runner, sim_host, rootfs, ls, "--gpus", "0", "--gpu-caps", "all")
    assert r.returncode == 0, r.stderr
    libs = set(r.stdout.split("---")[0].split())
    assert {"libcuda.so.1", "libGLX_nvidia.so.0", "libEGL_nvidia.so.0",
            f"libnvidia-glcore.so.{VERSION}", "libnvidia-encode.so.1"} <= libs
    r = runner.run(["--driver-root", sim_host.root, "--gpus", "0", "--gpu-caps", "compute,bogus",
                    str(rootfs), "true"])
    assert r.returncode == 125
    assert r.stderr.startswith("gpusandbox: error: --gpu-caps 'compute,bogus': unknown capability "
                               "'bogus'"), r.stderr
    assert "hint: " in r.stderr and "graphics" in r.stderr


def test_proc_driver_nvidia_shows_selected_gpus(runner, sim_host, rootfs):
    r = run(runner, sim_host, rootfs, "ls -A /proc/driver/nvidia/gpus; echo ---; "
            "cat /proc/driver/nvidia/params; echo ---; cat /proc/driver/nvidia/gpus/*/information",
            "--gpus", "1,3")
    assert r.returncode == 0, r.stderr
    gpus, params, info = r.stdout.split("---")
    assert gpus.split() == [sim_host.gpus[1]["bus_id"], sim_host.gpus[3]["bus_id"]]
    assert "ModifyDeviceFiles: 0" in params.splitlines()
    assert "ModifyDeviceFiles: 1" not in params
    assert sim_host.gpus[1]["uuid"] in info and sim_host.gpus[0]["uuid"] not in info


@pytest.mark.parametrize("mode", [[], ["--writable-tmpfs"]], ids=["default", "writable-tmpfs"])
def test_image_dir_unchanged(runner, sim_host, small_rootfs, mode):
    before = tree_checksum(small_rootfs)
    r = run(runner, sim_host, small_rootfs, "nvidia-smi -L >/dev/null && "
            f"ls {LIBDIR}/libcuda.so.1 >/dev/null && echo x > /tmp/x; "
            "echo y > /etc/y 2>/dev/null; true", "--gpus", "0,2:1", *mode)
    assert r.returncode == 0, r.stderr
    assert tree_checksum(small_rootfs) == before


def test_driver_files_read_only_nosuid_nodev(runner, sim_host, rootfs):
    lib = f"{LIBDIR}/libcuda.so.{VERSION}"
    host_lib = os.path.join(sim_host.root, lib.lstrip("/"))
    with open(host_lib, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    r = run(runner, sim_host, rootfs, f"cat /proc/self/mountinfo; echo ---; "
            f"(echo x >> {lib}) 2>&1; echo write=$?", "--gpus", "0")
    assert r.returncode == 0, r.stderr
    mountinfo, write = r.stdout.split("---")
    opts = [ln.split()[5].split(",") for ln in mountinfo.splitlines() if ln.split()[4] == lib]
    assert len(opts) == 1, mountinfo
    assert {"ro", "nosuid", "nodev"} <= set(opts[0])
    assert "write=0" not in write
    if runner.mode == "root":
        assert "Read-only file system" in write
    with open(host_lib, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == digest


def test_list_json_groups_host_paths(runner, sim_host):
    r = runner.run(["list", "--driver-root", sim_host.root, "--gpus", "0", "--json"])
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    root = sim_host.root
    assert data["selection"] == sim_host.gpus[0]["uuid"]
    assert sorted(data["devices"]) == sorted(f"{root}/dev/{n}" for n in CONTROL | {"nvidia0"})
    libs = {os.path.basename(p) for p in data["libraries"]}
    assert {f"libcuda.so.{VERSION}", f"libnvidia-ml.so.{VERSION}"} <= libs
    assert not [n for n in libs if "GLX" in n or not n.endswith(VERSION)]
    assert f"{root}/usr/bin/nvidia-smi" in data["binaries"]
    assert data["firmware"] and all(p.startswith(f"{root}/lib/firmware/nvidia/{VERSION}/gsp")
                                    for p in data["firmware"])
    assert data["ipc"] == [f"{root}/var/run/nvidia-persistenced/socket"]
    for group in ("devices", "libraries", "binaries", "firmware", "ipc"):
        for p in data[group]:
            assert p.startswith(root + "/") and os.path.lexists(p), (group, p)
    r = runner.run(["list", "--driver-root", sim_host.root, "--gpus", "0"])
    assert r.returncode == 0, r.stderr
    for group in ("devices:", "libraries:", "binaries:", "firmware:", "ipc:"):
        assert group in r.stdout.splitlines()


def test_driver_not_loaded(runner, rootfs, shared_tmp):
    # A driver root with a /proc snapshot whose kernel has no nvidia module.
    empty = shared_tmp / "no-driver"
    (empty / "proc").mkdir(parents=True)
    (empty / "proc" / "devices").write_text("Character devices:\n  1 mem\n  4 /dev/vc/0\n")
    os.chmod(empty, 0o755)
    before = host_mounts()
    r = runner.run(["--driver-root", str(empty), "--gpus", "0", str(rootfs), "true"])
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert lines[0].startswith("gpusandbox: error: NVIDIA kernel driver not loaded")
    assert f"{empty}/proc/driver/nvidia/version" in lines[0]
    assert lines[1].startswith("hint: ") and "--driver-root" in lines[1]
    assert host_mounts() == before


def test_containerised_driver_root_reads_the_hosts_proc(runner, rootfs, shared_tmp):
    """A driver root without its own proc/ (like /run/nvidia/driver) takes the
    kernel module's files from the host's /proc: here, a host without one."""
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("this host has an NVIDIA driver loaded")
    droot = shared_tmp / "driver-container"
    (droot / "usr" / "lib").mkdir(parents=True)
    os.chmod(droot, 0o755)
    r = runner.run(["--driver-root", str(droot), "--gpus", "0", str(rootfs), "true"])
    assert r.returncode == 125
    assert r.stderr.splitlines()[0].startswith("gpusandbox: error: NVIDIA kernel driver not "
                                               "loaded: /proc/driver/nvidia/version")


@pytest.fixture(scope="module")
def mismatched_host(cli):
    """Kernel module 550.54.15, user-space libraries of 535.104.05."""
    base = tempfile.mkdtemp(prefix="gsbx-test-sim-", dir="/tmp")
    os.chmod(base, 0o755)
    root = os.path.join(base, "host")
    try:
        subprocess.run([cli, "sim", "create", root, "--gpus", "1", "--lib-version", "535.104.05"],
                       check=True, capture_output=True, timeout=300)
        yield root
    finally:
        subprocess.run([cli, "sim", "destroy", root], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_library_version_mismatch(runner, mismatched_host, rootfs):
    r = runner.run(["--driver-root", mismatched_host, "--gpus", "0", str(rootfs), "true"])
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    assert lines[0].startswith("gpusandbox: error: driver libraries")
    assert f".so.{VERSION}" in lines[0]
    assert "does not match" in lines[1] and VERSION in lines[1]
