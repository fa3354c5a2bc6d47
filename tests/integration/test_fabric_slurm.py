"""Per-task HCA choice under a real Slurm step (issue 29): on a simulated
8-GPU/8-HCA node (HCA k under GPU k's PCIe switch), `srun -n 8
--gpus-per-task=1 gpusandbox run --gpus auto IMAGE` gives every rank its own
GPU and the HCA beside it, with NCCL and UCX told which, and no fabric
option at all."""
import subprocess
import sys

import pytest

from tests.integration import slurm_fixture as sf

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
