"""`gpusandbox exec --job/--rank` into a running Slurm rank's sandbox on the
testbed (docs/live.md): two ranks of one step on the node (pod mode, the
default there), entered from another step (`srun --overlap --jobid J`) as
the job's owner, root and unprivileged; another user gets nothing."""
import os
import subprocess

import pytest

from tests.integration import slurm_fixture as sf
from tests.integration.conftest import wait_for

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def tb(cli, workdir_base, sim_host):
    try:
        bed = sf.slurm_testbed(workdir_base, sim_host.root, constrain=False)
    except sf.TestbedUnavailable as e:
        pytest.skip(f"Slurm testbed unavailable: {e}")
    bed.cli = cli
    yield bed
    bed.stop()


@pytest.mark.parametrize("who", ["root", "user"])
def test_exec_into_a_running_rank(tb, rootfs, who, test_user, attack_user):
    user = test_user if who == "user" else None
    job = None
    p = tb.srun_bg(["-n", "2", tb.cli, "run", str(rootfs), "sh", "-c",
                    "echo job=$SLURM_JOB_ID rank=$SLURM_PROCID; exec sleep 300"], user=user)
    try:
        line = p.stdout.readline()
        assert line.startswith("job="), p.stderr.read() if p.poll() is not None else line
        job = line.split()[0][4:]
        # Rank 1 from a step of its own, as `srun --overlap` from a login node does.
        def enter():
            r = tb.srun(["--overlap", "--jobid", job, "-n", "1", tb.cli, "exec", "--rank", "1",
                         "sh", "-c", "echo rank=$SLURM_PROCID uid=$(id -u); cat /proc/self/cgroup"
                         " >/dev/null"], user=user, timeout=60)
            return r if r.returncode == 0 else None
        r = wait_for(enter, timeout=30, step=0.5)
        assert r is not None, "exec into rank 1 failed"
        assert r.stdout.split("\n")[0] == f"rank=1 uid={0 if user is None else user.pw_uid}"
        # Both ranks are on this node: without --rank the choice is the caller's.
        r = tb.srun(["--overlap", "--jobid", job, "-n", "1", tb.cli, "exec", "true"],
                    user=user)
        assert r.returncode != 0
        # Pod mode (two ranks on the node): one pid namespace, a mount namespace each.
        ns = {}
        for rank in ("0", "1"):
            r = tb.srun(["--overlap", "--jobid", job, "-n", "1", tb.cli, "exec", "--rank", rank,
                         "readlink", "/proc/self/ns/pid", "/proc/self/ns/mnt"], user=user)
            assert r.returncode == 0, r.stderr
            ns[rank] = r.stdout.split()
        assert ns["0"][0] == ns["1"][0] and ns["0"][1] != ns["1"][1]
        if user is not None:
            # Real root on the node enters the user's rank as that user, never as root.
            r = subprocess.run([tb.cli, "exec", "--job", job, "--rank", "1", "sh", "-c",
                                "id -u; grep CapEff /proc/self/status"],
                               capture_output=True, text=True, cwd="/", timeout=30,
                               env={"PATH": "/usr/bin:/bin", "HOME": "/"})
            assert r.returncode == 0, r.stderr
            assert r.stdout.split("\n")[0] == str(user.pw_uid)
            assert "CapEff:\t0000000000000000" in r.stdout
        # Another user: on the node directly, and through Slurm.
        r = subprocess.run(["setpriv", f"--reuid={attack_user.pw_uid}",
                            f"--regid={attack_user.pw_gid}", "--clear-groups", "--", tb.cli,
                            "exec", "--job", job, "--rank", "1", "id"],
                           capture_output=True, text=True, cwd="/", timeout=30,
                           env={"PATH": "/usr/bin:/bin", "HOME": "/"})
        assert r.returncode == 125 and f"no running sandbox of yours for job {job}" in r.stderr
        r = tb.srun(["--overlap", "--jobid", job, "-n", "1", tb.cli, "exec", "--rank", "1",
                     "id"], user=attack_user, timeout=30)
        assert r.returncode != 0 and "uid=" not in r.stdout
    finally:
        if job:
            tb.scancel(job)
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
