"""doctor --mpi (doctor/mpi.py) without a probe rank: the pod decision, Yama
and the transports it implies, from a fake /proc and a given environment."""
from gpusandbox.doctor.common import FAIL, PASS, WARN, Options, Roots
from gpusandbox.doctor.mpi import check_mpi

STEP2 = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_NODEID": "0",
         "SLURM_STEP_TASKS_PER_NODE": "2"}


def _checks(tmp_path, env, yama=None, share=None):
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "hostname").write_text("node7\n")
    if yama is not None:
        (proc / "sys" / "kernel" / "yama").mkdir()
        (proc / "sys" / "kernel" / "yama" / "ptrace_scope").write_text(f"{yama}\n")
    opts = Options(roots=Roots(proc=str(proc)), mpi=True, share=share, net="host", probes=False)
    return {c.name: c for c in check_mpi(opts, env)}


def test_multi_task_step_gets_a_pod_and_shared_memory(tmp_path):
    c = _checks(tmp_path, STEP2, yama=1)
    assert c["pod mode"].status == PASS and "--share node" in c["pod mode"].detail
    assert "2 task(s)" in c["pod mode"].detail
    assert c["shared memory (sm, NCCL)"].status == PASS
    assert c["single copy (CMA)"].status == PASS
    assert c["hostname"].status == PASS and "node7" in c["hostname"].detail


def test_share_none_in_a_multi_task_step_warns_with_the_knobs(tmp_path):
    c = _checks(tmp_path, STEP2, share="none")
    assert c["pod mode"].status == WARN
    assert c["shared memory (sm, NCCL)"].status == WARN
    assert "btl=self,tcp" in c["shared memory (sm, NCCL)"].fix
    assert "single copy (CMA)" not in c


def test_yama_admin_only_scope_disables_cma(tmp_path):
    c = _checks(tmp_path, STEP2, yama=2)
    assert c["Yama ptrace scope"].status == WARN
    assert c["single copy (CMA)"].status == WARN
    assert "single_copy_mechanism=none" in c["single copy (CMA)"].fix


def test_missing_pmix_directory_fails(tmp_path):
    env = {**STEP2, "PMIX_SERVER_TMPDIR": str(tmp_path / "gone")}
    c = _checks(tmp_path, env)
    assert c["PMIx directories"].status == FAIL
    env["PMIX_SERVER_TMPDIR"] = str(tmp_path)
    assert _checks(tmp_path / "x", env)["PMIx directories"].status == PASS
