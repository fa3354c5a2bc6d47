"""hpc/pod.py's pure decisions: when a launch joins a pod, its name, and
the refused mix of shared namespaces."""
import pytest

from gpusandbox.errors import UsageError
from gpusandbox.hpc import pod
from gpusandbox.spec import RunSpec


def _spec(share=None):
    s = RunSpec()
    s.share = share
    return s


STEP = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_NODEID": "1"}


@pytest.mark.parametrize("env,want", [
    ({}, 0),
    ({**STEP, "SLURM_STEP_TASKS_PER_NODE": "2(x3),1"}, 2),
    ({**STEP, "SLURM_STEP_TASKS_PER_NODE": "4,1"}, 1),
    ({**STEP, "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "4,1"}, 4),
    ({**STEP, "SLURM_TASKS_PER_NODE": "3"}, 1),          # node 1 not listed: one
    ({**STEP, "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "3"}, 3),
    ({**STEP, "SLURM_NODEID": "0", "SLURM_STEP_NUM_TASKS": "6"}, 6),
    ({**STEP, "SLURM_STEP_TASKS_PER_NODE": "x(2"}, 1),   # garbage: never a pod by default
    ({"SLURM_JOB_ID": "42", "SLURM_STEP_TASKS_PER_NODE": "4"}, 0),   # a job, not a step
])
def test_tasks_on_node(env, want):
    assert pod.tasks_on_node(env) == want


def test_default_share_is_node_only_in_a_multi_task_step():
    multi = {**STEP, "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2"}
    assert pod.choose(_spec(), multi) == "node"
    assert pod.choose(_spec(), {**multi, "SLURM_STEP_TASKS_PER_NODE": "1"}) == "none"
    assert pod.choose(_spec(), {}) == "none"
    assert pod.choose(_spec("none"), multi) == "none"
    assert pod.choose(_spec("node"), {}) == "node"


def test_pod_key_names_job_step_and_node():
    env = {**STEP, "SLURMD_NODENAME": "n7"}
    assert pod._key(env) == "42.0.n7"
    assert pod._key({"GPUSANDBOX_POD": "mine_1"}) == "mine_1"
    for bad in ("", "../x", ".hidden", "a/b", "x" * 101):
        with pytest.raises(UsageError):
            pod._key({"GPUSANDBOX_POD": bad})


def test_dangerous_mix_is_refused():
    with pytest.raises(UsageError, match="without the pid"):
        pod.check_mix({"user", "ipc", "shm"})
    with pytest.raises(UsageError):
        pod.check_mix({"user", "shm"})
    pod.check_mix(pod.SHARED)
    pod.check_mix({"ipc", "shm"})
    pod.check_mix(set())
