"""Pod mode under Slurm: the default for a step with more than one task on the
node.  Two sandboxed Open MPI ranks of one step use the shared-memory BTL
(vader) with its single-copy mechanism forced to CMA (process_vm_readv, after
Open MPI's kcmp check), shown by the BTL's verbose component selection and a
checked ping-pong; and scancel of such a job leaves nothing behind.

Before pod mode, vader between sandboxes crashed or was unreachable (every
rank pid 2 in its own pid namespace, its own /dev/shm): test_mpi.py's
btl self,tcp.
"""
import os
import shutil
import subprocess
import tempfile
import time

import pytest

from tests.integration import slurm_fixture as sf
from tests.integration.conftest import comm, pids_with, wait_for
from tests.integration.test_mpi import LIBPMIX, MPICC, PKGS, build_image, mpi_testbed

pytestmark = pytest.mark.slurm

PINGPONG = os.path.join(sf.REPO, "scripts", "bench_lib", "pingpong.c")
SM_ENV = {"OMPI_MCA_btl": "self,vader", "OMPI_MCA_btl_base_verbose": "100",
          "OMPI_MCA_btl_vader_single_copy_mechanism": "cma"}


@pytest.fixture(scope="module")
def pod_bed(cli, workdir_base):
    missing = [what for what, ok in ((MPICC, shutil.which(MPICC)),
                                     (LIBPMIX, os.path.exists(LIBPMIX))) if not ok]
    if missing:
        pytest.skip(f"Open MPI/PMIx not installed ({', '.join(missing)} missing): "
                    f"apt-get install -y --no-install-recommends {PKGS}")
    base = tempfile.mkdtemp(prefix="podmpi-", dir=workdir_base)
    os.chmod(base, 0o755)
    bed = None
    try:
        prog = os.path.join(base, "pingpong")
        r = subprocess.run([MPICC, "-O2", "-o", prog, PINGPONG], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        image = os.path.join(base, "image")
        build_image(image, prog)
        os.rename(os.path.join(image, "hello"), os.path.join(image, "pingpong"))
        bed = mpi_testbed(cli, base, image)
        yield bed
    finally:
        if bed is not None:
            bed.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_two_ranks_use_shared_memory_and_cma(pod_bed, mode, test_user):
    user = test_user if mode == "rootless" else None
    # PMIx wire-up is TCP to the node's slurmstepd: root commands need the host's network.
    net = ["--net", "host"] if mode == "root" else []
    r = pod_bed.srun(["--mpi=pmix", "--ntasks=2", "--label", pod_bed.cli, "run", *net,
                      pod_bed.image, "/pingpong", "20"], env=SM_ENV, user=user, timeout=90)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    # The BTL framework's verbose selection: vader opened and chosen on both ranks.
    for rank in ("0", "1"):
        assert any(line.startswith(f"{rank}:") and "select" in line and "vader" in line
                   for line in out.splitlines()), out[-3000:]
    # Open MPI's own prefix: the host's name (NCCL's and Open MPI's locality), not ours.
    assert "[gpusandbox:" not in out
    sizes = {line.split()[2] for line in r.stdout.splitlines() if " pingpong " in line}
    assert sizes == {"8", "1048576"}, r.stdout
    assert "single copy" not in out.lower() or "could not" not in out.lower(), out[-3000:]


def test_multi_task_step_is_one_pod_by_default_and_each_exit_code_reaches_srun(pod_bed,
                                                                             test_user):
    # Each rank waits (up to 20 s) until both have marked the pod's /dev/shm:
    # a rank that ends at once would let the keeper go before a slow second
    # rank arrives, and that rank would rightly start a new pod.  Ranks in two
    # pods never see each other's mark, so the namespace check still fails.
    wait_both = ('touch /dev/shm/rank$SLURM_PROCID; i=0; while set -- /dev/shm/rank*; '
                 '[ $# -lt 2 ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done; ')
    r = pod_bed.srun(["--ntasks=2", "--label", pod_bed.cli, "run", pod_bed.image, "/bin/sh",
                      "-c", wait_both + "readlink /proc/self/ns/pid; exit $((3 + SLURM_PROCID))"],
                     user=test_user, timeout=60)
    assert r.returncode == 4, r.stdout + r.stderr
    ns = {line.split(": ", 1)[1] for line in r.stdout.splitlines() if "pid:[" in line}
    assert len(ns) == 1, r.stdout
    assert "task 0: Exited with exit code 3" in r.stderr, r.stderr
    assert "task 1: Exited with exit code 4" in r.stderr, r.stderr


def _live_keepers():
    out = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        if "(gpusandbox-pod)" in st and st.rpartition(")")[2].split()[0] != "Z":
            out.append(int(d))
    return out


def test_scancel_leaves_nothing(pod_bed, test_user):
    mark = f"9{os.getpid()}7"
    before = set(_live_keepers())
    job = pod_bed.sbatch(["--ntasks=2", "-o", "/dev/null"],
                         script=f"#!/bin/sh\nsrun {pod_bed.cli} run {pod_bed.image} "
                                f"/bin/sh -c 'sleep {mark} & sleep {mark}'\n")
    try:
        pod_bed.wait_state(job, "RUNNING", timeout=30)
        assert wait_for(lambda: len([p for p in pids_with(mark) if comm(p) == "sleep"]) == 4,
                        30), "the two ranks did not start"
        sleeps = [p for p in pids_with(mark) if comm(p) == "sleep"]
        assert len({os.readlink(f"/proc/{p}/ns/pid") for p in sleeps}) == 1   # one pod
        assert set(_live_keepers()) - before
        pod_bed.scancel(job)
        pod_bed.wait_done(job, timeout=60)
        assert wait_for(lambda: not pids_with(mark), 20), pids_with(mark)
        assert wait_for(lambda: not (set(_live_keepers()) - before), 20)
    finally:
        if pids_with(mark):
            pod_bed.scancel(job)
            time.sleep(1)

