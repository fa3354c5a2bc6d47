"""Pod mode on a Slurm testbed whose proctrack plugin is proctrack/linuxproc
(scripts/slurm-testbed --proctrack linuxproc: a step's processes tracked by
parentage, not by freezer cgroup; test_pod_slurm.py covers proctrack/cgroup):

- scancel of a multi-task pod step leaves no rank, no keeper and no pod directory;
- MPICH (Debian's, device ch4:ucx, PMI through srun --mpi=pmi2 and PMI_FD) and
  Open MPI's pml ucx with UCX_TLS=sm reach the other rank of the pod through
  shared memory only, shown by UCX's own endpoint configuration lines
  (UCX_LOG_LEVEL=info: `ep_cfg[N]: tag(sysv/memory cma/memory) ...`).
"""
import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from tests.integration.conftest import comm, pids_with, wait_for
from tests.integration.test_mpi import (LIBPMIX, MPICC, PKGS, _copy_in, _libs_of, build_image,
                                        mpi_testbed)
from tests.integration.test_pod_slurm import PINGPONG, _live_keepers

pytestmark = pytest.mark.slurm

# Explicit paths: the mpicc/mpirun alternatives stay Open MPI's.
MPICC_MPICH = "/usr/bin/mpicc.mpich"
UCX_MODULES = "/usr/lib/x86_64-linux-gnu/ucx"      # libuct_cma.so: dlopened, not linked
EP_CFG = re.compile(r"ep_cfg\[\d+\]: (.*)")


def add_mpich_program(image, program, name):
    """Copy an MPICH program to IMAGE/name with its library closure and UCX's
    transport modules (dlopened, so not in the closure)."""
    shutil.copy2(program, os.path.join(image, name))
    elves = [program]
    for dirpath, _, names in os.walk(UCX_MODULES):
        for n in names:
            if ".so" in n:
                _copy_in(os.path.join(dirpath, n), image)
                elves.append(os.path.join(dirpath, n))
    for lib in {lib for elf in elves for lib in _libs_of(elf)}:
        _copy_in(lib, image)
    subprocess.run(["ldconfig", "-r", image], check=True)


@pytest.fixture(scope="module")
def lp_bed(cli, workdir_base):
    missing = [what for what, ok in ((MPICC, shutil.which(MPICC)), (MPICC_MPICH,
                                     os.path.exists(MPICC_MPICH)),
                                     (LIBPMIX, os.path.exists(LIBPMIX))) if not ok]
    if missing:
        pytest.skip(f"Open MPI/MPICH/PMIx not installed ({', '.join(missing)} missing): "
                    f"apt-get install -y --no-install-recommends {PKGS} mpich libmpich-dev")
    base = tempfile.mkdtemp(prefix="podlp-", dir=workdir_base)
    os.chmod(base, 0o755)
    bed = None
    try:
        image = os.path.join(base, "image")
        progs = {}
        for name, cc in (("pingpong", MPICC), ("pingpong-mpich", MPICC_MPICH)):
            progs[name] = os.path.join(base, name)
            r = subprocess.run([cc, "-O2", "-o", progs[name], PINGPONG],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
        build_image(image, progs["pingpong"])
        os.rename(os.path.join(image, "hello"), os.path.join(image, "pingpong"))
        add_mpich_program(image, progs["pingpong-mpich"], "pingpong-mpich")
        bed = mpi_testbed(cli, base, image, "pmi2", proctrack="linuxproc")
        yield bed
    finally:
        if bed is not None:
            bed.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_testbed_tracks_by_parentage(lp_bed):
    r = lp_bed.run(["scontrol", "show", "config"], timeout=20)
    assert re.search(r"ProctrackType\s*=\s*proctrack/linuxproc", r.stdout), r.stdout[-2000:]


def _peer_transports(out, rank):
    """The transports of rank's UCX endpoints to other processes (not its own)."""
    cfgs = [m.group(1) for line in out.splitlines() if line.startswith(f"{rank}:")
            for m in [EP_CFG.search(line)] if m]
    return [c for c in cfgs if "self/" not in c]


def _check_shared_memory(r):
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    sizes = {line.split()[2] for line in r.stdout.splitlines() if " pingpong " in line}
    assert sizes == {"8", "1048576"}, out[-3000:]
    for rank in ("0", "1"):
        peer = _peer_transports(out, rank)
        assert peer, out[-3000:]
        for cfg in peer:
            transports = set(re.findall(r"(\w+)/\w+", cfg))
            # Memory transports only: sysv/posix segments need the pod's IPC namespace
            # and /dev/shm, cma its shared user and pid namespace.
            assert transports and transports <= {"sysv", "posix", "cma"}, cfg
            assert "sysv" in transports or "posix" in transports, cfg


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_mpich_ranks_use_shared_memory(lp_bed, mode, test_user):
    user = test_user if mode == "rootless" else None
    r = lp_bed.srun(["--mpi=pmi2", "--ntasks=2", "--label", lp_bed.cli, "run",
                     lp_bed.image, "/pingpong-mpich", "20"],
                    env={"UCX_LOG_LEVEL": "info"}, user=user, timeout=90)
    _check_shared_memory(r)


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_open_mpi_pml_ucx_with_ucx_tls_sm(lp_bed, mode, test_user):
    user = test_user if mode == "rootless" else None
    net = ["--net", "host"] if mode == "root" else []    # PMIx wire-up: TCP to slurmstepd
    r = lp_bed.srun(["--mpi=pmix", "--ntasks=2", "--label", lp_bed.cli, "run", *net,
                     lp_bed.image, "/pingpong", "20"],
                    # pml ucx offers itself only on InfiniBand devices unless told
                    # otherwise (opal_common_ucx_tls/devices).
                    env={"OMPI_MCA_pml": "ucx", "OMPI_MCA_pml_base_verbose": "10",
                         "OMPI_MCA_pml_ucx_tls": "any", "OMPI_MCA_pml_ucx_devices": "any",
                         "OMPI_MCA_osc": "ucx", "UCX_TLS": "sm,self",
                         "UCX_LOG_LEVEL": "info"}, user=user, timeout=90)
    _check_shared_memory(r)
    out = r.stdout + r.stderr
    assert re.search(r"select.*component ucx", out), out[-3000:]


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_scancel_leaves_no_rank_keeper_or_pod_directory(lp_bed, mode, test_user):
    mark = f"9{os.getpid()}{len(mode)}"
    before = set(_live_keepers())
    script = (f"#!/bin/sh\nsrun --ntasks=3 {lp_bed.cli} run {lp_bed.image} "
              f"/bin/sh -c 'sleep {mark} & sleep {mark}'\n")
    argv = ["--ntasks=3", "-o", "/dev/null"]
    if mode == "rootless":
        argv += [f"--uid={test_user.pw_uid}", f"--gid={test_user.pw_gid}"]
    job = lp_bed.sbatch(argv, script=script)
    uid = test_user.pw_uid if mode == "rootless" else 0
    pods = "/run/gpusandbox/pods" if uid == 0 else f"/tmp/gpusandbox-{uid}/pods"
    node = lp_bed.node
    pod_dir = f"{pods}/{job}.0.{node}"
    try:
        lp_bed.wait_state(job, "RUNNING", timeout=30)
        assert wait_for(lambda: len([p for p in pids_with(mark) if comm(p) == "sleep"]) == 6,
                        30), "the three ranks did not start"
        sleeps = [p for p in pids_with(mark) if comm(p) == "sleep"]
        assert len({os.readlink(f"/proc/{p}/ns/pid") for p in sleeps}) == 1   # one pod
        assert {os.stat(f"/proc/{p}").st_uid for p in sleeps} == {uid}
        assert set(_live_keepers()) - before
        assert os.path.isdir(pod_dir), os.listdir(pods)
        lp_bed.scancel(job)
        lp_bed.wait_done(job, timeout=60)
        assert wait_for(lambda: not pids_with(mark), 20), pids_with(mark)
        assert wait_for(lambda: not (set(_live_keepers()) - before), 20)
        assert wait_for(lambda: not os.path.exists(pod_dir), 10), os.listdir(pod_dir)
    finally:
        if pids_with(mark):
            lp_bed.scancel(job)
            time.sleep(1)
