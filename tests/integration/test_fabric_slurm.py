"""Per-task HCA choice under a real Slurm step (issue 29): on a simulated
8-GPU/8-HCA node (HCA k under GPU k's PCIe switch), `srun -n 8
--gpus-per-task=1 gpusandbox run --gpus auto IMAGE` gives every rank its own
GPU and the HCA beside it, with NCCL and UCX told which, and no fabric
option at all; and the issue's own line, `srun -N2 --gpus-per-task=1
gpusandbox run IMG ...`, on two nodes of the multi-node testbed."""
import subprocess
import sys

import pytest

from tests.integration import slurm_fixture as sf
from tests.integration.test_slurm_multinode import cluster, labelled  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# The rank's GPU (its bus id, from the masked /proc/driver/nvidia) and its fabric.
PROBE = ("for g in /proc/driver/nvidia/gpus/*; do echo gpu=${g##*/}; done; "
         "ls /dev/infiniband; echo NCCL_IB_HCA=$NCCL_IB_HCA")


@pytest.fixture(scope="module")
def tb8(cli, workdir_base):
    root = workdir_base / "fabric-sim"
    r = subprocess.run([sys.executable, "-m", "gpusandbox.sim", "create", str(root),
                        "--gpus", "8", "--hcas", "8"], cwd=sf.REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    assert r.returncode == 0, r.stdout
    state = workdir_base / "fabric-slurm"
    state.mkdir()
    try:
        bed = sf.slurm_testbed(state, str(root), constrain=True)
    except sf.TestbedUnavailable as e:
        pytest.skip(f"Slurm testbed unavailable: {e}")
    bed.cli = cli
    yield bed
    bed.stop()


def test_each_rank_gets_the_hca_beside_its_gpu(tb8, rootfs):
    r = tb8.srun(["--ntasks=8", "--gpus-per-task=1", "--label", tb8.cli, "run",
                  "--gpus", "auto", "--driver-root", tb8.sim_dir, str(rootfs),
                  "sh", "-c", PROBE], timeout=120)
    assert r.returncode == 0, r.stderr
    per_rank = {}
    for line in r.stdout.splitlines():
        label, _, rest = line.partition(": ")
        per_rank.setdefault(int(label), []).append(rest.strip())
    assert sorted(per_rank) == list(range(8)), r.stdout
    gpus = set()
    for rank, lines in per_rank.items():
        bus = [ln[4:] for ln in lines if ln.startswith("gpu=")]
        assert len(bus) == 1, (rank, lines)
        k = int(bus[0].split(":")[1], 16) - 6        # the simulated GPU k is at 0000:(6+k):00.0
        gpus.add(k)
        rest = [ln for ln in lines if not ln.startswith("gpu=")]
        assert rest == ["rdma_cm", f"uverbs{k}", f"NCCL_IB_HCA==mlx5_{k}:1"], (rank, lines)
    assert gpus == set(range(8)), r.stdout


@pytest.fixture(scope="module")
def mpi_images(rootfs, workdir_base):
    from tests.integration.test_fabric_mpi import HAVE_MPI, build_images
    if HAVE_MPI.args[0]:
        pytest.skip(HAVE_MPI.kwargs["reason"])
    base = workdir_base / "fabric-mpi-images"
    base.mkdir()
    return build_images(rootfs, str(base))


def test_host_mpi_ranks_under_srun(tb8, mpi_images):
    """srun starts the ranks (PMI-2 over srun's PMI_FD), each a sandbox with
    its GPU, the HCA beside it and the host's MPICH in place of the image's."""
    r = tb8.srun(["--mpi=pmi2", "--ntasks=2", "--gpus-per-task=1", tb8.cli, "run",
                  "--gpus", "auto", "--driver-root", tb8.sim_dir, "--net", "host", "--mpi", "host",
                  mpi_images["mpich"], "sh", "-c", "echo hca=$NCCL_IB_HCA; exec /hello"],
                 timeout=120)
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert [ln[:27] for ln in lines if ": MPICH Version:" in ln] == [
        "rank 0 of 2: MPICH Version:", "rank 1 of 2: MPICH Version:"], r.stdout
    assert "rank 0 received: greetings from rank 1 of 2" in lines, r.stdout
    assert len({ln for ln in lines if ln.startswith("hca==mlx5_")}) == 2, r.stdout


# Per rank: its node, its GPU, its fabric nodes (GPUDirect's when asked) and variables.
RANK_PROBE = ("echo node=$SLURM_NODEID; "
              "for g in /proc/driver/nvidia/gpus/*; do echo gpu=${g##*/}; done; "
              "for n in /dev/infiniband/* /dev/gdrdrv /dev/nvidia-fs*; do "
              "[ -e $n ] && echo $n; done; "
              "echo NCCL_IB_HCA=$NCCL_IB_HCA; echo UCX_NET_DEVICES=$UCX_NET_DEVICES")


def test_done_when_two_nodes_one_gpu_per_task(cluster):
    """Issue 29's "done when": `srun -N2 --gpus-per-task=1 gpusandbox run IMG
    CMD`, no option at all (the GPUs are the step's: `--gpus auto` is the
    default in a step with GPUs), gives each rank on each node its GPU, the
    HCA beside it, rdma_cm, and NCCL_IB_HCA/UCX_NET_DEVICES naming that HCA;
    GPUDirect's nodes come when the caller asks with the toolkit's variables.
    GPUSANDBOX_DRIVER_ROOT (the site setting) points at each node's simulated
    driver, as / would on a real node."""
    base = {"GPUSANDBOX_DRIVER_ROOT": cluster.sim_dir}
    for ask in ({}, {"NVIDIA_GDRCOPY": "enabled", "NVIDIA_GDS": "enabled"}):
        r = cluster.srun(["-N2", "--gpus-per-task=1", "--label", cluster.cli, "run",
                          cluster.image, "sh", "-c", RANK_PROBE],
                         env={**base, **ask}, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        tasks = labelled(r.stdout)
        assert sorted(tasks) == [0, 1], r.stdout
        assert len({tasks[t][0] for t in (0, 1)}) == 2, r.stdout        # two nodes
        for t in (0, 1):
            lines = tasks[t]
            assert lines[0].startswith("node="), lines
            gpus = [ln[4:] for ln in lines if ln.startswith("gpu=")]
            assert len(gpus) == 1, lines
            k = int(gpus[0].split(":")[1], 16) - 6     # simulated GPU k is at 0000:(6+k):00.0
            gpudirect = ["/dev/gdrdrv"] + [f"/dev/nvidia-fs{i}" for i in range(16)]
            want = ["/dev/infiniband/rdma_cm", f"/dev/infiniband/uverbs{k}"]
            want += sorted(gpudirect) if ask else []
            assert lines[2:] == want + [f"NCCL_IB_HCA==mlx5_{k}:1",
                                        f"UCX_NET_DEVICES=mlx5_{k}:1"], (t, lines)
