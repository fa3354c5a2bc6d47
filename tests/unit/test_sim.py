"""The simulated GPU host: files, device nodes, loader cache, libraries, nvidia-smi.

Creating a host needs real root (mknod); those tests skip otherwise.  Every
temporary directory is removed, and the cgroup test removes its cgroup.
"""
import ctypes
import ctypes.util
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from gpusandbox.errors import GpuError, UsageError
from gpusandbox import sim

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="creating device nodes needs real root")
needs_gcc = pytest.mark.skipif(not shutil.which("gcc"), reason="no gcc to build the simulated driver")
NOBODY = 65534
PY = sys.executable
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="gpusandbox-sim-test-")
    os.chmod(d, 0o755)  # the unprivileged runs below must reach DIR inside it
    try:
        yield d
    finally:
        shutil.rmtree(d)


@pytest.fixture(scope="module")
def host():
    if not ROOT or not shutil.which("gcc"):
        pytest.skip("creating a simulated host needs real root and gcc")
    d = tempfile.mkdtemp(prefix="gpusandbox-sim-test-")
    os.chmod(d, 0o755)
    try:
        info = sim.create(os.path.join(d, "host"), gpus=4, mig="1:1:0,1:2:0,1:2:1")
        yield info
    finally:
        shutil.rmtree(d)


def smi(root, *args, env=None, user=None):
    return subprocess.run([os.path.join(root, "usr/bin/nvidia-smi"), *args], capture_output=True,
                          text=True, env=env if env is not None else {"PATH": "/usr/bin:/bin"}, user=user)


def cuda_probe(libpath, env=None, user=None, pre=""):
    """In a fresh process: cuInit, cuDeviceGetCount and every device's name and UUID."""
    code = pre + f"""
import ctypes
import ctypes.util
lib = ctypes.CDLL({libpath!r})
print(lib.cuInit(0))
n = ctypes.c_int(-1)
print(lib.cuDeviceGetCount(ctypes.byref(n)), n.value)
for i in range(max(n.value, 0)):
    name = ctypes.create_string_buffer(128)
    raw = (ctypes.c_char * 16)()
    lib.cuDeviceGetName(name, 128, i)
    lib.cuDeviceGetUuid(raw, i)
    print(name.value.decode(), bytes(raw).hex())
"""
    res = subprocess.run([PY, "-c", code], capture_output=True, text=True, env=env or {}, user=user)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    return int(lines[0]), [int(x) for x in lines[1].split()], [line.split(" ") for line in lines[2:]]


def hexuuid(uuid):
    return uuid[4:].replace("-", "")


# ---- pure functions: no privileges --------------------------------------------------------

def test_mig_minor_follows_the_drivers_table():
    # Values a real mig-minors file shows (nv-caps.c: 2 fixed entries, then 15 GIs x 9).
    assert sim.mig_minor(0, 1) == 12
    assert sim.mig_minor(0, 1, 0) == 13
    assert sim.mig_minor(3, 3, 3) == 439
    assert sim.mig_minor(6, 11, 5) == 918


def test_uuids_are_deterministic_and_well_formed():
    a, b = sim.gpu_uuid("/x/host", 0), sim.gpu_uuid("/x/host", 1)
    assert a == sim.gpu_uuid("/x/host", 0) and a != b and a != sim.gpu_uuid("/y/host", 0)
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", a)
    m = sim.mig_uuid(a, 1, 0)
    assert re.fullmatch(r"MIG-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", m)
    assert m != sim.mig_uuid(a, 1, 1) and m != sim.mig_uuid(b, 1, 0)


def test_parse_mig_gives_profiles_that_fit_the_gpu():
    instances, profiles = sim.parse_mig("0:1:0,0:2:0,0:2:1,1:0:0:7g.80gb", 2, "NVIDIA H100 80GB HBM3")
    assert instances == {0: [(1, 0), (2, 0), (2, 1)], 1: [(0, 0)]}
    assert profiles == {0: {1: "3g.40gb", 2: "3g.40gb"}, 1: {0: "7g.80gb"}}
    _, profiles = sim.parse_mig("0:7:0", 1, "NVIDIA A100-SXM4-40GB")
    assert profiles == {0: {7: "7g.40gb"}}


@pytest.mark.parametrize("spec", ["0:1", "4:1:0", "0:15:0", "0:1:8", "a:b:c", "0:1:0:bad\"name"])
def test_parse_mig_rejects_bad_items(spec):
    with pytest.raises(UsageError) as e:
        sim.parse_mig(spec, 4, sim.DEFAULT_MODEL)
    assert "--mig" in e.value.what


def test_bad_versions_are_usage_errors(workdir):
    for kwargs in ({"driver_version": "latest"}, {"cuda_version": "12"}, {"gpus": 33}):
        with pytest.raises(UsageError):
            sim.create(os.path.join(workdir, "h"), **kwargs)
    assert os.listdir(workdir) == []


def test_destroy_refuses_a_directory_it_did_not_create(workdir):
    keep = os.path.join(workdir, "keep")
    open(keep, "w").close()
    with pytest.raises(UsageError) as e:
        sim.destroy(workdir)
    assert "not a simulated GPU host" in e.value.line()
    assert os.path.exists(keep)


def test_non_root_gets_a_clear_error_not_a_traceback(workdir):
    target = os.path.join(workdir, "h")
    if not ROOT:
        with pytest.raises(GpuError) as e:
            sim.create(target)
        assert "needs root" in e.value.line() and e.value.hint
        return
    res = subprocess.run([PY, "-m", "gpusandbox.sim", "create", target], cwd=REPO, user=NOBODY,
                         capture_output=True, text=True, env={"PYTHONPATH": REPO})
    if "No module named" in res.stderr:
        pytest.skip("the unprivileged user cannot read the checkout")
    assert res.returncode == 125
    assert res.stderr.startswith("gpusandbox: error:") and "needs root" in res.stderr
    assert "Traceback" not in res.stderr and "hint:" in res.stderr
    assert not os.path.exists(target)


# ---- a created host ------------------------------------------------------------------------

def test_proc_files_describe_the_gpus(host):
    root = host["root"]
    with open(os.path.join(root, "proc/driver/nvidia/version")) as f:
        first = f.readline()
    assert first.startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ")
    with open(os.path.join(root, "proc/driver/nvidia/params")) as f:
        assert "ModifyDeviceFiles: 1\n" in f.read()
    buses = sorted(os.listdir(os.path.join(root, "proc/driver/nvidia/gpus")))
    assert buses == ["0000:06:00.0", "0000:07:00.0", "0000:08:00.0", "0000:09:00.0"]
    for g in host["gpus"]:
        with open(os.path.join(root, "proc/driver/nvidia/gpus", g["bus_id"], "information")) as f:
            fields = dict(re.split(r":\s*", line.rstrip("\n"), maxsplit=1) for line in f)
        assert fields["Model"] == "NVIDIA H100 80GB HBM3"
        assert fields["GPU UUID"] == g["uuid"] == sim.gpu_uuid(root, g["index"])
        assert fields["Device Minor"] == str(g["minor"]) and fields["Bus Location"] == g["bus_id"]
        assert {"IRQ", "Video BIOS", "Bus Type", "DMA Size", "DMA Mask", "GPU Firmware",
                "GPU Excluded"} <= set(fields)
    with open(os.path.join(root, "proc/devices")) as f:
        devices = f.read()
    chars = devices.split("Block devices:")[0]
    assert re.search(r"^195 nvidia$", chars, re.M)
    assert re.search(rf"^{sim.UVM_MAJOR} nvidia-uvm$", chars, re.M)
    assert re.search(rf"^{sim.CAPS_MAJOR} nvidia-caps$", chars, re.M)


def test_device_nodes_are_real_and_numbered_like_the_driver(host):
    dev = host["dev_root"]
    expect = {f"nvidia{i}": (195, i) for i in range(4)}
    expect.update({"nvidiactl": (195, 255), "nvidia-modeset": (195, 254),
                   "nvidia-uvm": (sim.UVM_MAJOR, 0), "nvidia-uvm-tools": (sim.UVM_MAJOR, 1)})
    for name, (major, minor) in expect.items():
        st = os.stat(os.path.join(dev, name))
        assert stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (major, minor)
    with pytest.raises(OSError) as e:  # no driver behind major 195 on this host
        os.open(os.path.join(dev, "nvidia0"), os.O_RDWR)
    assert e.value.errno in (6, 19)  # ENXIO, ENODEV


def test_mig_tables_and_nodes(host):
    root, gpu = host["root"], host["gpus"][1]
    with open(os.path.join(root, "proc/driver/nvidia-caps/mig-minors")) as f:
        rows = f.read().splitlines()
    assert rows[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert "gpu0/gi1/access 12" in rows and "gpu0/gi1/ci0/access 13" in rows
    assert rows[-1] == "gpu31/gi14/ci7/access 4322" and len(rows) == 2 + 32 * 15 * 9
    caps = os.path.join(root, "proc/driver/nvidia/capabilities")
    with open(os.path.join(caps, "gpu1/mig/gi2/access")) as f:
        assert f.read() == f"DeviceFileMinor: {sim.mig_minor(1, 2)}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    assert sorted(os.listdir(os.path.join(caps, "gpu1/mig"))) == ["gi1", "gi2"]
    assert not os.path.exists(os.path.join(caps, "gpu0"))
    for m in gpu["mig"]:
        for minor in (m["gi_minor"], m["ci_minor"]):
            st = os.stat(os.path.join(root, f"dev/nvidia-caps/nvidia-cap{minor}"))
            assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(sim.CAPS_MAJOR, minor)
    assert stat.S_IMODE(os.stat(os.path.join(root, "dev/nvidia-caps/nvidia-cap1")).st_mode) == 0o400


def test_libraries_are_installed_like_a_driver(host):
    lib = host["libdir"]
    assert os.readlink(os.path.join(lib, "libcuda.so.1")) == "libcuda.so.550.54.15"
    assert os.readlink(os.path.join(lib, "libcuda.so")) == "libcuda.so.1"
    assert os.readlink(os.path.join(lib, "libnvidia-ml.so.1")) == "libnvidia-ml.so.550.54.15"
    res = subprocess.run(["readelf", "-d", os.path.join(lib, "libnvidia-ptxjitcompiler.so.550.54.15")],
                         capture_output=True, text=True)
    if res.returncode == 0:
        assert "Library soname: [libnvidia-ptxjitcompiler.so.1]" in res.stdout
    for path in ("lib/firmware/nvidia/550.54.15/gsp_ga10x.bin", "usr/bin/nvidia-debugdump"):
        assert os.path.getsize(os.path.join(host["root"], path)) > 1000
    out = subprocess.run([os.path.join(host["root"], "usr/bin/nvidia-persistenced")],
                         capture_output=True, text=True).stdout
    assert out.startswith("nvidia-persistenced:")
    assert stat.S_ISSOCK(os.lstat(os.path.join(host["root"], "var/run/nvidia-persistenced/socket")).st_mode)


def test_ld_so_cache_is_written_by_ldconfig_relative_to_the_root(host):
    res = subprocess.run(["ldconfig", "-p", "-C", os.path.join(host["root"], "etc/ld.so.cache")],
                         capture_output=True, text=True)
    assert res.returncode == 0
    entries = re.findall(r"^\s+(\S+) \(([^)]*)\) => (\S+)$", res.stdout, re.M)
    cuda = [path for name, _, path in entries if name == "libcuda.so.1"]
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1" in cuda
    # The forward-compat decoy is there too, with another version behind it.
    decoy = [p for p in cuda if "compat" in p]
    assert decoy and not os.path.realpath(host["root"] + decoy[0]).endswith("550.54.15")
    assert all(flags.startswith("libc6,x86-64") for _, flags, _ in entries)


def test_nvidia_smi_lists_the_gpus_and_mig_devices(host):
    res = smi(host["root"], "-L")
    assert res.returncode == 0, res.stdout + res.stderr
    expect = []
    for g in host["gpus"]:
        expect.append(f"GPU {g['index']}: NVIDIA H100 80GB HBM3 (UUID: {g['uuid']})")
        expect += [f"  MIG 3g.40gb     Device {i:2d}: (UUID: {m['uuid']})" for i, m in enumerate(g["mig"])]
    assert res.stdout.splitlines() == expect
    assert len(host["gpus"][1]["mig"]) == 3
    table = smi(host["root"]).stdout
    assert "Driver Version: 550.54.15" in table and "CUDA Version: 12.4" in table
    csv = smi(host["root"], "--query-gpu=index,uuid,name", "--format=csv,noheader").stdout
    assert csv.splitlines()[3] == f"3, {host['gpus'][3]['uuid']}, NVIDIA H100 80GB HBM3"


def test_nvidia_smi_works_for_an_unprivileged_user(host):
    res = smi(host["root"], "-L", user=NOBODY)
    assert res.returncode == 0 and res.stdout.count("GPU ") == 4


def test_libcuda_counts_the_usable_gpus(host):
    lib = os.path.join(host["libdir"], "libcuda.so.1")
    handle = ctypes.CDLL(lib)
    version = ctypes.c_int()
    assert handle.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value == 12040
    rc, (rc2, count), devs = cuda_probe(lib)
    assert (rc, rc2, count) == (0, 0, 4)
    assert [d[-1] for d in devs] == [hexuuid(g["uuid"]) for g in host["gpus"]]
    assert devs[0][:-1] == ["NVIDIA", "H100", "80GB", "HBM3"]


def test_libcuda_follows_cuda_visible_devices(host):
    lib, gpus = os.path.join(host["libdir"], "libcuda.so.1"), host["gpus"]
    _, (_, count), devs = cuda_probe(lib, env={"CUDA_VISIBLE_DEVICES": "3,1"})
    assert count == 2 and [d[-1] for d in devs] == [hexuuid(gpus[3]["uuid"]), hexuuid(gpus[1]["uuid"])]
    # Enumeration stops at the first item that names no device, as with real CUDA.
    _, (_, count), _ = cuda_probe(lib, env={"CUDA_VISIBLE_DEVICES": "2,7,3"})
    assert count == 1
    _, (_, count), devs = cuda_probe(lib, env={"CUDA_VISIBLE_DEVICES": gpus[2]["uuid"][:12]})
    assert count == 1 and devs[0][-1] == hexuuid(gpus[2]["uuid"])
    rc, (rc2, count), _ = cuda_probe(lib, env={"CUDA_VISIBLE_DEVICES": ""})
    assert rc == 100 and rc2 == 3  # CUDA_ERROR_NO_DEVICE, then CUDA_ERROR_NOT_INITIALIZED


def test_a_node_the_caller_cannot_open_hides_that_gpu(host):
    node = os.path.join(host["dev_root"], "nvidia2")
    os.chmod(node, 0o600)
    try:
        res = smi(host["root"], "-L", user=NOBODY)
        _, (_, count), _ = cuda_probe(os.path.join(host["libdir"], "libcuda.so.1"), user=NOBODY)
    finally:
        os.chmod(node, 0o666)
    assert count == 3
    assert host["gpus"][2]["uuid"] not in res.stdout and res.stdout.count("GPU ") == 3
    assert f"GPU 2: NVIDIA H100 80GB HBM3 (UUID: {host['gpus'][3]['uuid']})" in res.stdout


def test_a_cgroup_device_filter_hides_that_gpu(host):
    base = "/sys/fs/cgroup/devices"
    if not os.path.exists(os.path.join(base, "devices.deny")):
        pytest.skip("no cgroup v1 devices controller (cgroup v2 filters need a BPF program)")
    cg = os.path.join(base, f"gpusandbox-simtest-{os.getpid()}")
    os.mkdir(cg)
    try:
        with open(os.path.join(cg, "devices.deny"), "w") as f:
            f.write("c 195:1 rwm")
        # The probe moves itself into the cgroup, then opens the nodes: EPERM for minor 1.
        pre = f"open({os.path.join(cg, 'cgroup.procs')!r}, 'w').write('0')\n"
        _, (_, count), devs = cuda_probe(os.path.join(host["libdir"], "libcuda.so.1"), pre=pre)
    finally:
        os.rmdir(cg)
    assert count == 3
    assert hexuuid(host["gpus"][1]["uuid"]) not in [d[-1] for d in devs]


def test_everything_is_world_readable(host):
    for dirpath, dirs, files in os.walk(host["root"]):
        assert stat.S_IMODE(os.stat(dirpath).st_mode) == 0o755, dirpath
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                assert st.st_mode & 0o444 == 0o444, os.path.join(dirpath, name)


# ---- hosts made for one test ---------------------------------------------------------------

@needs_root
@needs_gcc
def test_driver_failures_look_like_the_real_tool(workdir):
    root = os.path.join(workdir, "h")
    sim.create(root, gpus=2, lib_version="550.54.14", driver_version="550.54.15")
    assert os.path.exists(os.path.join(root, sim.LIBDIR, "libcuda.so.550.54.14"))
    res = smi(root, "-L")
    assert res.returncode == 18
    assert res.stdout.startswith("Failed to initialize NVML: Driver/library version mismatch")
    rc, _, _ = cuda_probe(os.path.join(root, sim.LIBDIR, "libcuda.so.1"))
    assert rc == 803  # CUDA_ERROR_SYSTEM_DRIVER_MISMATCH

    sim.create(root, gpus=2)  # recreate in place, then take the control node away
    os.unlink(os.path.join(root, "dev/nvidiactl"))
    res = smi(root, "-L")
    assert res.returncode == 9 and "couldn't communicate with the NVIDIA driver" in res.stdout
    rc, _, _ = cuda_probe(os.path.join(root, sim.LIBDIR, "libcuda.so.1"))
    assert rc == 100

    for i in range(2):
        os.unlink(os.path.join(root, f"dev/nvidia{i}"))
    os.mknod(os.path.join(root, "dev/nvidiactl"), stat.S_IFCHR | 0o666, os.makedev(195, 255))
    res = smi(root, "-L")
    assert (res.returncode, res.stdout) == (6, "No devices found.\n")

    alone = os.path.join(workdir, "alone")
    os.mkdir(alone)
    shutil.copy(os.path.join(root, "usr/bin/nvidia-smi"), alone)
    res = subprocess.run([os.path.join(alone, "nvidia-smi"), "-L"], capture_output=True, text=True,
                         env={"LD_LIBRARY_PATH": alone})
    if ctypes.util.find_library("nvidia-ml") is None:
        assert res.returncode == 12 and "couldn't find libnvidia-ml.so" in res.stdout
    # Away from DIR/usr/lib/<arch> the library takes / as its root, as inside a sandbox.
    shutil.copy(os.path.join(root, sim.LIBDIR, "libcuda.so.1"), alone)
    if not os.path.exists("/proc/driver/nvidia/version"):
        rc, _, _ = cuda_probe(os.path.join(alone, "libcuda.so.1"))
        assert rc == 100


@needs_root
@needs_gcc
def test_old_driver_no_uvm_and_padding(workdir):
    root = os.path.join(workdir, "h")
    info = sim.create(root, gpus=1, driver_version="535.161.08", cuda_version="12.2", uvm=False,
                      pad_ldcache=300)
    with open(os.path.join(root, "proc/devices")) as f:
        devices = f.read()
    assert "195 nvidia-frontend\n" in devices and "nvidia-uvm" not in devices
    assert not os.path.exists(os.path.join(root, "dev/nvidia-uvm"))
    assert info["majors"]["nvidia-uvm"] is None
    _, (_, count), _ = cuda_probe(os.path.join(root, sim.LIBDIR, "libcuda.so.1"))
    assert count == 1
    out = subprocess.run(["ldconfig", "-p", "-C", os.path.join(root, "etc/ld.so.cache")],
                         capture_output=True, text=True).stdout
    assert int(out.splitlines()[0].split()[0]) >= 300 + 30


@needs_root
@needs_gcc
def test_rerun_keeps_uuids_and_destroy_removes_everything(workdir):
    root = os.path.join(workdir, "h")
    first = sim.create(root, gpus=2)
    second = sim.create(root, gpus=2)
    assert [g["uuid"] for g in first["gpus"]] == [g["uuid"] for g in second["gpus"]]
    sim.destroy(root)
    assert os.listdir(workdir) == []
    # A directory that existed (empty) before create is kept, emptied.
    os.mkdir(root)
    sim.create(root, gpus=1)
    subprocess.run([PY, "-m", "gpusandbox.sim", "destroy", root], cwd=REPO, check=True,
                   env={"PYTHONPATH": REPO})
    assert os.listdir(root) == []


@needs_root
@needs_gcc
def test_destroy_refuses_to_cross_a_mount(workdir):
    root = os.path.join(workdir, "h")
    sim.create(root, gpus=1)
    mnt = os.path.join(root, "mnt")
    os.mkdir(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "none", mnt], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(GpuError) as e:
            sim.destroy(root)
        assert "mounted below it" in e.value.line()
    finally:
        subprocess.run(["umount", mnt], check=True)
    sim.destroy(root)
    assert not os.path.exists(root)


@needs_root
def test_a_nodev_filesystem_is_refused_before_anything_is_written(workdir):
    mnt = os.path.join(workdir, "nodev")
    os.mkdir(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "nodev", "none", mnt], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(GpuError) as e:
            sim.create(os.path.join(mnt, "h"))
        assert "nodev" in e.value.line()
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", mnt], check=True)


def test_create_suggests_a_sandbox_to_try_not_a_host_command():
    from gpusandbox.sim.cli import describe
    gpu = {"index": 0, "minor": 0, "bus_id": "0000:06:00.0", "model": "M", "uuid": "GPU-x",
           "mig": []}
    info = {"root": "/tmp/my sim", "dev_root": "/tmp/my sim/dev", "driver_version": "550.54.15",
            "cuda_version": "12.4", "gpus": [gpu]}
    tries = [ln for ln in describe(info) if ln.startswith("try: ")]
    assert tries == ["try: gpusandbox run --driver-root '/tmp/my sim' --gpus 0 / nvidia-smi -L"]
    info["dev_root"] = "/dev2"
    assert "--driver-root '/tmp/my sim' --dev-root /dev2 --gpus 0" in "\n".join(describe(info))
