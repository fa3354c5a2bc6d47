"""The network half of a GPU job as a user sees it (issue 29, docs/fabric.md):
the installed CLI on a simulated 8-GPU/8-HCA host (HCA k under GPU k's PCIe
switch, two NUMA nodes), as root and as an unprivileged user.

The simulated nodes carry the kernel's real numbers with no driver behind
them: a node the sandbox was given opens with ENXIO (or ENODEV for rdma_cm's
unregistered misc minor), past the device filter; one it was not given is
EPERM from the filter (root) or simply absent from its /dev."""
import json
import os
import subprocess
import tempfile

import pytest

# What every probe prints: the sandbox's fabric nodes, then NCCL's and UCX's variables.
LIST = ("for d in /dev/infiniband /dev/nvidia-caps-imex-channels; do "
        "[ -d $d ] && (cd $d && for n in *; do echo $d/$n; done); done; "
        "for n in /dev/gdrdrv /dev/nvidia-fs* /dev/nvidia-nvswitch*; do "
        "[ -e $n ] && echo $n; done; "
        "echo NCCL_IB_HCA=${NCCL_IB_HCA-unset}; echo UCX_NET_DEVICES=${UCX_NET_DEVICES-unset}")
REOPEN = ("import errno, os\n"
          "try:\n"
          "    os.open('/proc/self/fd/0', os.O_RDWR)\n"
          "    print('OK')\n"
          "except OSError as e:\n"
          "    print(errno.errorcode[e.errno])\n")
OPEN = ("import errno, os, sys\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        os.close(os.open(p, os.O_RDWR))\n"
        "        print(p, 'OK')\n"
        "    except OSError as e:\n"
        "        print(p, errno.errorcode[e.errno])\n")


@pytest.fixture(scope="module")
def fabric_host(cli):
    base = tempfile.mkdtemp(prefix="gsbx-test-fabric-", dir="/tmp")
    os.chmod(base, 0o755)
    root = os.path.join(base, "host")
    try:
        r = subprocess.run([cli, "sim", "create", root, "--gpus", "8", "--hcas", "8",
                            "--gpudirect", "--nvswitches", "2", "--imex-channels", "4", "--json"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout)
        info["root"] = root
        yield info
    finally:
        subprocess.run([cli, "sim", "destroy", root], capture_output=True)
        subprocess.run(["rm", "-rf", base])


def probe(runner, host, rootfs, *opts, env=None, script=LIST):
    r = runner.run(["--driver-root", host["root"], *opts, str(rootfs), "sh", "-c", script],
                   env=env)
    return r, r.stdout.split()


def test_auto_gives_each_gpu_the_hca_under_its_switch(runner, fabric_host, rootfs):
    r, out = probe(runner, fabric_host, rootfs, "--gpus", "device=3")
    assert r.returncode == 0, r.stderr
    assert out == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs3",
                   "NCCL_IB_HCA==mlx5_3:1", "UCX_NET_DEVICES=mlx5_3:1"], r.stdout
    r, out = probe(runner, fabric_host, rootfs, "--gpus", "device=1,6", "--verbose")
    assert r.returncode == 0, r.stderr
    assert out == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs1", "/dev/infiniband/uverbs6",
                   "NCCL_IB_HCA==mlx5_1:1,mlx5_6:1", "UCX_NET_DEVICES=mlx5_1:1,mlx5_6:1"], r.stdout
    # --verbose says why each HCA was chosen.
    assert "fabric: mlx5_6 (0000:46:00.0, InfiniBand): the same PCIe switch as GPU 6" in r.stderr


def test_given_nodes_reach_the_driver_layer(runner, fabric_host, rootfs):
    r = runner.run(["--driver-root", fabric_host["root"], "--gpus", "device=2", str(rootfs),
                    "python3", "-c", OPEN, "/dev/infiniband/uverbs2", "/dev/infiniband/rdma_cm"])
    assert r.returncode == 0, r.stderr
    # ENXIO/ENODEV: past the filter (EPERM) and the mount's nodev (EACCES).
    assert r.stdout.split() == ["/dev/infiniband/uverbs2", "ENXIO",
                                "/dev/infiniband/rdma_cm", "ENODEV"], r.stdout


def test_fabric_none_list_and_a_bad_name(runner, fabric_host, rootfs):
    r, out = probe(runner, fabric_host, rootfs, "--gpus", "device=3", "--fabric", "none")
    assert r.returncode == 0, r.stderr
    assert out == ["NCCL_IB_HCA=unset", "UCX_NET_DEVICES=unset"], r.stdout
    r, out = probe(runner, fabric_host, rootfs, "--gpus", "device=3", "--fabric", "mlx5_7,mlx5_0")
    assert r.returncode == 0, r.stderr
    assert out[:3] == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0",
                       "/dev/infiniband/uverbs7"], r.stdout
    r, out = probe(runner, fabric_host, rootfs, "--fabric", "all")   # no GPU at all
    assert r.returncode == 0, r.stderr
    assert [n for n in out if "uverbs" in n] == [f"/dev/infiniband/uverbs{k}" for k in range(8)]
    r, _ = probe(runner, fabric_host, rootfs, "--gpus", "device=3", "--fabric", "mlx9_0")
    assert r.returncode == 125
    assert r.stderr.splitlines()[0] == ("gpusandbox: error: --fabric: unknown HCA 'mlx9_0': this "
                                        "host has mlx5_0, mlx5_1, mlx5_2, mlx5_3, mlx5_4, mlx5_5, "
                                        "mlx5_6, mlx5_7"), r.stderr


@pytest.mark.parametrize("var,value,want", [
    ("NVIDIA_GDRCOPY", "enabled", ["/dev/gdrdrv"]),
    ("NVIDIA_GDS", "enabled", [f"/dev/nvidia-fs{i}" for i in (0, 1, 10, 11, 12, 13, 14, 15,
                                                               2, 3, 4, 5, 6, 7, 8, 9)]),
    ("NVIDIA_NVSWITCH", "enabled", ["/dev/nvidia-nvswitch0", "/dev/nvidia-nvswitch1",
                                    "/dev/nvidia-nvswitchctl"]),
    ("NVIDIA_GDRCOPY", "true", []),            # the toolkit's rule: exactly "enabled"
    ("NVIDIA_IMEX_CHANNELS", "1,3", ["/dev/nvidia-caps-imex-channels/channel1",
                                     "/dev/nvidia-caps-imex-channels/channel3"]),
    ("NVIDIA_IMEX_CHANNELS", "all", [f"/dev/nvidia-caps-imex-channels/channel{i}"
                                     for i in range(4)]),
])
def test_toolkit_variables_one_by_one(runner, fabric_host, rootfs, var, value, want):
    # With -e (the caller's word on the sandbox) and from the caller's environment.
    for how in ("-e", "env"):
        opts = ["--gpus", "device=0", "--fabric", "none"]
        env = None
        if how == "-e":
            opts += ["-e", f"{var}={value}"]
        else:
            env = {var: value}
        r, out = probe(runner, fabric_host, rootfs, *opts, env=env)
        assert r.returncode == 0, r.stderr
        assert out[:-2] == want, (how, r.stdout)


def test_mofed_and_mellanox_visible_devices(runner, fabric_host, rootfs):
    r, out = probe(runner, fabric_host, rootfs, "--gpus", "device=0",
                   "-e", "MELLANOX_VISIBLE_DEVICES=2,5")
    assert r.returncode == 0, r.stderr
    assert out[:3] == ["/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs2",
                       "/dev/infiniband/uverbs5"], r.stdout
    r, out = probe(runner, fabric_host, rootfs, "--gpus", "device=0",
                   "-e", "MELLANOX_VISIBLE_DEVICES=none")
    assert out == ["NCCL_IB_HCA=unset", "UCX_NET_DEVICES=unset"], r.stdout
    r, out = probe(runner, fabric_host, rootfs, "--gpus", "device=0", env={"NVIDIA_MOFED": "enabled"})
    assert len([n for n in out if "uverbs" in n]) == 8, r.stdout


def test_missing_imex_channel_is_one_line(runner, fabric_host, rootfs):
    r, _ = probe(runner, fabric_host, rootfs, "--gpus", "device=0", "-e", "NVIDIA_IMEX_CHANNELS=9")
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    assert lines[0].startswith("gpusandbox: error: NVIDIA_IMEX_CHANNELS: channel 9: "), r.stderr
    assert lines[0].endswith("nvidia-caps-imex-channels/channel9 does not exist on this host")


def test_callers_nccl_choice_is_kept(runner, fabric_host, rootfs):
    r, out = probe(runner, fabric_host, rootfs, "--gpus", "device=3",
                   env={"NCCL_IB_HCA": "mlx5_0", "UCX_NET_DEVICES": "mlx5_0:1"})
    assert r.returncode == 0, r.stderr
    assert out[-2:] == ["NCCL_IB_HCA=mlx5_0", "UCX_NET_DEVICES=mlx5_0:1"], r.stdout


def test_filter_denies_an_hca_reached_by_hand(runner, fabric_host, rootfs):
    """HCA 5 reached through an inherited descriptor (not given by --fabric):
    the device filter refuses it as root; rootless has no filter, which
    --verbose says."""
    results = {}
    for k in (2, 5):
        fd = os.open(f"{fabric_host['root']}/dev/infiniband/uverbs{k}", os.O_PATH | os.O_CLOEXEC)
        try:
            r = subprocess.run(runner.argv(["--verbose", "--driver-root", fabric_host["root"],
                                            "--gpus", "device=2", str(rootfs),
                                            "python3", "-c", REOPEN]),
                               stdin=fd, capture_output=True, text=True, timeout=60,
                               env=runner.env(), cwd="/")
        finally:
            os.close(fd)
        assert r.returncode == 0, r.stderr
        results[k] = r.stdout.strip()
    assert results[2] == "ENXIO"
    assert results[5] == ("EPERM" if runner.mode == "root" else "ENXIO"), results


def test_info_and_list_show_the_fabric(runner, fabric_host):
    r = runner.run(["info", "--driver-root", fabric_host["root"], "--json"])
    assert r.returncode == 0, r.stderr
    fab = json.loads(r.stdout)["fabric"]
    assert [(h["name"], h["bus_id"], h["numa"], h["link"], h["same_switch_gpus"])
            for h in fab["hcas"]] == [(h["name"], h["bus_id"], h["numa"], "InfiniBand", [h["gpu"]])
                                      for h in fabric_host["fabric"]["hcas"]]
    assert fab["imex_channels"] == [0, 1, 2, 3] and fab["gds_nodes"] == 16
    assert fab["gpudirect_rdma"] is True and fab["problems"] == []
    r = runner.run(["info", "--driver-root", fabric_host["root"]])
    assert "hca mlx5_4: InfiniBand  bus 0000:44:00.0  numa 1  ports 1:ACTIVE  beside gpu 4" \
        in r.stdout.splitlines(), r.stdout
    r = runner.run(["list", "--driver-root", fabric_host["root"], "--gpus", "2,5", "--json"])
    assert r.returncode == 0, r.stderr
    fab = json.loads(r.stdout)["fabric"]
    root = fabric_host["root"]
    assert fab["devices"] == [f"{root}/dev/infiniband/uverbs2", f"{root}/dev/infiniband/uverbs5",
                              f"{root}/dev/infiniband/rdma_cm"]
    assert fab["env"] == {"NCCL_IB_HCA": "=mlx5_2:1,mlx5_5:1", "UCX_NET_DEVICES": "mlx5_2:1,mlx5_5:1"}
    r = runner.run(["list", "--driver-root", fabric_host["root"], "--gpus", "2", "--fabric", "none",
                    "--json"])
    assert json.loads(r.stdout)["fabric"]["devices"] == []


def test_doctor_mpi_with_and_without_hcas(runner, fabric_host, sim_host):
    env = {"NVIDIA_VISIBLE_DEVICES": "5", "SLURM_NNODES": "2"}
    r = runner.run(["doctor", "--mpi", "--driver-root", fabric_host["root"]], env=env)
    lines = [" ".join(ln.split()) for ln in r.stdout.splitlines()]
    assert "PASS RDMA adapters GPU(s) 5: mlx5_5 (InfiniBand): the same PCIe switch as GPU 5 " \
           "(0000:0b:00.0)" in lines, r.stdout
    assert "PASS GPU 5 to HCA mlx5_5: the same PCIe switch" in lines, r.stdout
    assert "PASS GPUDirect RDMA nvidia-peermem loaded" in lines, r.stdout
    assert "PASS transport (NCCL, UCX) NCCL: IB verbs on =mlx5_5:1; UCX: rc/ud/dc on mlx5_5:1" \
        in lines, r.stdout
    # The simulated 4-GPU host has no HCA: a 2-node job is told loudly, and doctor fails.
    r = runner.run(["doctor", "--mpi", "--driver-root", sim_host.root], env=env)
    assert r.returncode == 1
    lines = [" ".join(ln.split()) for ln in r.stdout.splitlines()]
    assert any(ln.startswith("FAIL RDMA adapters this host has none (/sys/class/infiniband is "
                             "empty): NCCL and MPI between nodes use TCP sockets (10-50x slower) "
                             "in this 2-node job") for ln in lines), r.stdout
    assert any(ln.startswith("FAIL transport (NCCL, UCX) NCCL: Socket (TCP); UCX: tcp between "
                             "nodes") for ln in lines), r.stdout


def test_memlock_is_the_callers(runner, fabric_host, rootfs):
    """RDMA pins memory up to RLIMIT_MEMLOCK: the sandbox keeps the caller's
    soft and hard limits (raising them needs CAP_SYS_RESOURCE on the host)."""
    cmd = ["prlimit", "--memlock=1048576:2097152", "--"] + runner.argv(
        ["--driver-root", fabric_host["root"], "--gpus", "device=0", str(rootfs),
         "sh", "-c", "ulimit -l; ulimit -Hl"])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=runner.env(), cwd="/")
    assert (r.returncode, r.stdout.split()) == (0, ["1024", "2048"]), r.stderr


# libibverbs' own device list (what ibv_devices prints), through ctypes.
IBV_DEVICES = ("import ctypes\n"
               "lib = ctypes.CDLL('libibverbs.so.1')\n"
               "lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)\n"
               "lib.ibv_get_device_name.restype = ctypes.c_char_p\n"
               "lib.ibv_get_device_name.argtypes = [ctypes.c_void_p]\n"
               "n = ctypes.c_int()\n"
               "lst = lib.ibv_get_device_list(ctypes.byref(n))\n"
               "print('ibv=' + ','.join(lib.ibv_get_device_name(lst[i]).decode()\n"
               "                        for i in range(n.value)))\n")
SYS_PROBE = ("for c in infiniband infiniband_verbs infiniband_mad; do "
             "echo $c: $(ls /sys/class/$c); done; "
             "for h in /sys/class/infiniband/*; do [ -e $h ] && readlink -f $h/device; done; "
             "echo hidden: $(ls /sys/bus/pci/devices/0000:45:00.0 | wc -l)")


def with_host_sys(runner, host, args):
    """runner's argv in a private mount namespace whose /sys is the simulated
    host's sysfs tree (its real cgroup hierarchy bound inside), as on a host
    whose kernel has the HCAs: the sandbox clones the launcher's /sys."""
    sysd = os.path.join(host["root"], "sys")
    os.makedirs(os.path.join(sysd, "fs", "cgroup"), exist_ok=True)
    script = (f"mount --rbind /sys/fs/cgroup {sysd}/fs/cgroup && mount --rbind {sysd} /sys "
              "&& exec \"$@\"")
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
    return subprocess.run(cmd + runner.argv(args), capture_output=True, text=True, timeout=60,
                          env=runner.env(), cwd="/")


def test_sys_shows_only_the_tasks_hcas(runner, fabric_host, rootfs):
    """/sys/class/infiniband (and the uverbs/umad classes) list the task's
    HCAs only, their PCI path is the host's, the other HCAs' PCI directories
    are empty; with the host's rdma-core, libibverbs lists that one HCA."""
    root = fabric_host["root"]
    base = ["--driver-root", root, "--gpus", "device=3"]
    r = with_host_sys(runner, fabric_host, base + [str(rootfs), "sh", "-c", SYS_PROBE])
    assert r.returncode == 0, r.stderr
    pci = ("/sys/devices/pci0000:00/0000:00:04.0/0000:a3:00.0/0000:b3:01.0/0000:43:00.0")
    assert r.stdout.splitlines() == [
        "infiniband: mlx5_3", "infiniband_verbs: abi_version uverbs3",
        "infiniband_mad: abi_version issm3 umad3", pci, "hidden: 0"], r.stdout
    r = with_host_sys(runner, fabric_host, base + ["--fabric", "none", str(rootfs),
                                                   "sh", "-c", SYS_PROBE])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["infiniband:", "infiniband_verbs: abi_version",
                                     "infiniband_mad: abi_version", "hidden: 0"], r.stdout
    # --fabric all: every HCA, its PCI directory whole (the tree is the host's).
    r = with_host_sys(runner, fabric_host, base + ["--fabric", "all", str(rootfs),
                                                   "sh", "-c", SYS_PROBE])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "infiniband: " + " ".join(f"mlx5_{k}" for k in range(8)), r.stdout
    assert lines[-1] != "hidden: 0", r.stdout
    if b"libibverbs.so.1" not in subprocess.run(["ldconfig", "-p"], capture_output=True).stdout:
        pytest.skip("the host has no rdma-core (libibverbs1, ibverbs-providers)")
    r = with_host_sys(runner, fabric_host, base + ["--fabric-libs", "host", str(rootfs),
                                                   "python3", "-c", IBV_DEVICES])
    assert (r.returncode, r.stdout.strip()) == (0, "ibv=mlx5_3"), r.stderr


@pytest.fixture(scope="module")
def cxi_host(cli):
    """A simulated HPE Slingshot node: 4 GPUs, CXI NIC k under GPU k's switch."""
    base = tempfile.mkdtemp(prefix="gsbx-test-cxi-", dir="/tmp")
    os.chmod(base, 0o755)
    root = os.path.join(base, "host")
    try:
        r = subprocess.run([cli, "sim", "create", root, "--gpus", "4", "--cxis", "4"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        yield {"root": root}
    finally:
        subprocess.run([cli, "sim", "destroy", root], capture_output=True)
        subprocess.run(["rm", "-rf", base])


CXI_PROBE = ("for n in /dev/cxi*; do [ -e $n ] && echo $n; done; "
             "echo FI=${FI_PROVIDER-unset}/${FI_CXI_DEVICE_NAME-unset}; "
             "echo cxi: $(ls /sys/class/cxi); echo cxi_user: $(ls /sys/class/cxi_user); "
             "for c in /sys/class/cxi_user/*; do [ -e $c ] && readlink -f $c/device; done; "
             "python3 -c \"import errno, os, sys\n"
             "for p in sys.argv[1:]:\n"
             "    try: os.open(p, os.O_RDWR)\n"
             "    except OSError as e: print(p, errno.errorcode[e.errno])\" "
             "/dev/cxi0 /dev/cxi2")


def test_slingshot_cxi_nics_like_hcas(runner, cxi_host, rootfs):
    """A Slingshot NIC is chosen, given and shown like an HCA: GPU 2's task
    gets /dev/cxi2 (past the filter: ENXIO, no driver behind it), libfabric
    told FI_PROVIDER=cxi and FI_CXI_DEVICE_NAME=cxi2, and its /sys lists cxi2
    only; --fabric names and none apply; the caller's FI_PROVIDER wins, and
    the step's SLINGSHOT_* variables reach the command."""
    base = ["--driver-root", cxi_host["root"], "--gpus", "device=2"]
    r = with_host_sys(runner, cxi_host, base + [str(rootfs), "sh", "-c", CXI_PROBE])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "/dev/cxi2", "FI=cxi/cxi2", "cxi: cxi2", "cxi_user: cxi2",
        "/sys/devices/pci0000:80/0000:80:03.0/0000:a2:00.0/0000:b2:02.0/0000:62:00.0",
        "/dev/cxi0 ENOENT", "/dev/cxi2 ENXIO"], r.stdout
    r = with_host_sys(runner, cxi_host, base + ["--fabric", "cxi3,cxi0", str(rootfs),
                                                "sh", "-c", CXI_PROBE])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:4] == ["/dev/cxi0", "/dev/cxi3", "FI=cxi/cxi0,cxi3",
                                         "cxi: cxi0 cxi3"], r.stdout
    r = with_host_sys(runner, cxi_host, base + ["--fabric", "none", str(rootfs),
                                                "sh", "-c", CXI_PROBE])
    assert r.stdout.splitlines()[:3] == ["FI=unset/unset", "cxi:", "cxi_user:"], r.stdout
    # The job's libfabric settings and Slurm's Slingshot VNI (switch/hpe_slingshot) pass.
    r = runner.run(base + [str(rootfs), "sh", "-c",
                           "echo $FI_PROVIDER/$FI_CXI_DEVICE_NAME/$SLINGSHOT_VNIS"],
                   env={"FI_PROVIDER": "tcp", "SLINGSHOT_VNIS": "1310"})
    assert (r.returncode, r.stdout.strip()) == (0, "tcp/cxi2/1310"), r.stderr
    r = runner.run(["info", "--driver-root", cxi_host["root"]])
    assert "cxi cxi1: Slingshot  bus 0000:61:00.0  numa 0  link up  beside gpu 1" \
        in r.stdout.splitlines(), r.stdout


def test_doctor_mpi_on_a_slingshot_node(runner, cxi_host):
    """A 2-node job on a node with Slingshot NICs only: an RDMA path, not TCP."""
    env = {"NVIDIA_VISIBLE_DEVICES": "2", "SLURM_NNODES": "2"}
    r = runner.run(["doctor", "--mpi", "--driver-root", cxi_host["root"]], env=env)
    lines = [" ".join(ln.split()) for ln in r.stdout.splitlines()]
    assert "PASS RDMA adapters GPU(s) 2: cxi2 (Slingshot): the same PCIe switch as GPU 2 " \
           "(0000:08:00.0)" in lines, r.stdout
    assert "PASS transport (NCCL, UCX) libfabric: cxi on cxi2 (MPI over OFI; NCCL through its " \
           "OFI plugin)" in lines, r.stdout
