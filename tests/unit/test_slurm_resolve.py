"""resolve_auto against the variable sets a real Slurm 22.05 step produces.

Each scenario's environment was taken from a step of the test Slurm (see
scripts/slurm-testbed); the device cgroup is simulated by injecting the probe.
The fake host numbers its GPUs differently from their minors (index = 3 - minor)
so a mix-up between Slurm positions, minors and host indices shows.
"""
import os
import stat

import pytest

from gpusandbox import slurm
from gpusandbox.errors import GpuError


class Gpu:
    def __init__(self, minor):
        self.minor = minor
        self.index = 3 - minor
        self.uuid = f"GPU-0000000{minor}-1111-2222-3333-444444444444"
        self.bus_id = f"0000:0{minor}:00.0"


class Host:
    def __init__(self, dev_root="/sim/dev", minors=(0, 1, 2, 3)):
        self.dev_root = dev_root
        self.gpus = sorted((Gpu(m) for m in minors), key=lambda g: g.index)


def cgroup(*allowed_minors):
    """A probe that behaves like a device cgroup admitting only these minors."""
    def probe(path):
        return int(path.rsplit("nvidia", 1)[1]) in allowed_minors
    return probe


def open_all(path):
    return True


def idx(*minors):
    return ",".join(str(i) for i in sorted(3 - m for m in minors))


STEP = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_CONF": "/nonexistent/slurm.conf"}


def env(**kw):
    return dict(STEP, **kw)


@pytest.fixture(autouse=True)
def gres_in_minor_order(tmp_path, monkeypatch):
    """Steps read a gres.conf listing /x/nvidia0..3 in minor order unless a
    test points SLURM_CONF elsewhere."""
    (tmp_path / "gres.conf").write_text("Name=gpu File=/x/nvidia[0-3]\n")
    monkeypatch.setitem(STEP, "SLURM_CONF", str(tmp_path / "slurm.conf"))


# --- ConstrainDevices=yes -----------------------------------------------------

def test_constrained_step_gets_the_nodes_it_may_open():
    # srun --gres=gpu:2 while another job holds gres 0: Slurm renumbers CVD from 0.
    e = env(SLURM_STEP_GPUS="1,2", CUDA_VISIBLE_DEVICES="0,1", SLURM_GPUS_ON_NODE="2")
    assert slurm.resolve_auto(e, Host(), probe=cgroup(1, 2)) == idx(1, 2)


def test_constrained_per_task_cgroup_wins_over_misleading_step_gpus():
    # --ntasks=2 --gpus-per-task=1: task 0 may open only nvidia2, yet Slurm says STEP_GPUS=1.
    e = env(SLURM_STEP_GPUS="1", CUDA_VISIBLE_DEVICES="0", SLURM_GPUS_ON_NODE="2",
            SLURM_LOCALID="0", SLURMD_TRES_BIND="gpu:per_task:1")
    assert slurm.resolve_auto(e, Host(), probe=cgroup(2)) == idx(2)


def test_constrained_task_binding_without_task_cgroup_uses_local_index():
    # The step may open nvidia1 and nvidia3; this task's CVD=1 is the second of them.
    e = env(SLURM_STEP_GPUS="1,3", CUDA_VISIBLE_DEVICES="1", SLURM_LOCALID="1")
    assert slurm.resolve_auto(e, Host(), probe=cgroup(1, 3)) == idx(3)


def test_constrained_cvd_uuid():
    host = Host()
    e = env(SLURM_STEP_GPUS="0,1", CUDA_VISIBLE_DEVICES=Gpu(1).uuid)
    assert slurm.resolve_auto(e, host, probe=cgroup(0, 1)) == idx(1)


def test_step_with_gres_none_inside_gpu_job_gets_no_gpu():
    # srun --gres=none in a batch job: SLURM_JOB_GPUS is inherited, nothing else is set.
    e = env(SLURM_JOB_GPUS="0,1")
    assert slurm.in_gpu_step(e)
    assert slurm.resolve_auto(e, Host(), probe=cgroup()) == "none"


def test_batch_script_uses_job_gpus():
    e = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "1,2,3", "CUDA_VISIBLE_DEVICES": "0,1,2",
         "SLURM_CONF": "/nonexistent/slurm.conf"}
    assert slurm.resolve_auto(e, Host(), probe=cgroup(1, 2, 3)) == idx(1, 2, 3)


def test_gpu_bind_none_constrained_uses_gpus_on_node():
    e = env(SLURM_GPUS_ON_NODE="2", SLURMD_TRES_BIND="gpu:none", SLURM_LOCALID="1")
    assert slurm.resolve_auto(e, Host(), probe=cgroup(0, 1)) == idx(0, 1)


def test_constrained_count_mismatch_is_an_error_not_a_guess():
    e = env(SLURM_STEP_GPUS="0,1")
    with pytest.raises(GpuError) as ei:
        slurm.resolve_auto(e, Host(), probe=cgroup(0, 1, 2))
    assert "SLURM_STEP_GPUS names 2 GPU(s) but this step may open 3" in ei.value.what
    assert ei.value.hint


def test_every_node_refused_while_slurm_allocated_gpus_is_an_error():
    e = env(SLURM_STEP_GPUS="0,1", CUDA_VISIBLE_DEVICES="0,1")
    with pytest.raises(GpuError) as ei:
        slurm.resolve_auto(e, Host(), probe=lambda p: False)
    assert "may open none" in ei.value.what


# --- no ConstrainDevices: Slurm's positions through gres.conf -------------------

NO_GRES = "/nonexistent/slurm.conf"


@pytest.mark.parametrize("kw", [
    dict(SLURM_STEP_GPUS="1,2", CUDA_VISIBLE_DEVICES="1,2"),           # positions of the step
    dict(SLURM_STEP_GPUS="0,1,2,3", CUDA_VISIBLE_DEVICES="2"),          # a task's position
    dict(SLURM_STEP_GPUS="0,1,2,3", SLURMD_TRES_BIND="gpu:per_task:2", SLURM_LOCALID="1"),
])
def test_unconstrained_without_gres_conf_is_refused_not_guessed(kw):
    # Minor order is only what File=/dev/nvidia[0-N] gives; gres.conf may list
    # the devices in any order, so positions cannot be mapped without it.
    e = env(SLURM_CONF=NO_GRES, **kw)
    with pytest.raises(GpuError) as ei:
        slurm.resolve_auto(e, Host(), probe=open_all)
    assert "positions in gres.conf" in ei.value.what
    assert "/nonexistent/gres.conf cannot be read" in ei.value.why
    assert "ConstrainDevices" in ei.value.hint and "--gpus" in ei.value.hint


def test_gres_conf_without_device_files_is_refused(tmp_path):
    (tmp_path / "gres.conf").write_text("AutoDetect=nvml\nName=gpu Count=4\n")
    e = env(SLURM_CONF=str(tmp_path / "slurm.conf"), SLURM_STEP_GPUS="1")
    with pytest.raises(GpuError) as ei:
        slurm.resolve_auto(e, Host(), probe=open_all)
    assert "lists no Name=gpu File=" in ei.value.why


def test_constrained_local_index_without_gres_conf_is_refused():
    e = env(SLURM_CONF=NO_GRES, SLURM_STEP_GPUS="1,3", CUDA_VISIBLE_DEVICES="1")
    with pytest.raises(GpuError):
        slurm.resolve_auto(e, Host(), probe=cgroup(1, 3))


@pytest.mark.parametrize("kw, probe, want", [
    # Answers that do not depend on the order need no gres.conf.
    (dict(SLURM_STEP_GPUS="0,1,2,3"), open_all, idx(0, 1, 2, 3)),
    (dict(SLURM_STEP_GPUS="0,1", CUDA_VISIBLE_DEVICES="0,1"), cgroup(1, 2), idx(1, 2)),
    (dict(SLURM_STEP_GPUS="0,1", CUDA_VISIBLE_DEVICES=Gpu(2).uuid), cgroup(1, 2), idx(2)),
    (dict(SLURM_STEP_GPUS="0", CUDA_VISIBLE_DEVICES="NoDevFiles"), open_all, "none"),
])
def test_without_gres_conf_order_free_answers_still_resolve(kw, probe, want):
    assert slurm.resolve_auto(env(SLURM_CONF=NO_GRES, **kw), Host(), probe=probe) == want


def write_gres(tmp_path, text):
    (tmp_path / "gres.conf").write_text(text)
    return str(tmp_path / "slurm.conf")


def test_unconstrained_positions_follow_gres_conf_order(tmp_path):
    conf = write_gres(tmp_path, "# reversed order\nName=gpu File=/x/nvidia3,/x/nvidia2\n"
                                "Name=gpu File=/x/nvidia[0-1]  # two more\n")
    e = env(SLURM_CONF=conf, SLURM_STEP_GPUS="0,3", CUDA_VISIBLE_DEVICES="0,3")
    assert slurm.resolve_auto(e, Host(), probe=open_all) == idx(3, 1)


def test_gres_conf_lines_for_other_nodes_are_ignored(tmp_path):
    conf = write_gres(tmp_path, "NodeName=gpu[01-02] Name=gpu File=/x/nvidia[2-3]\n"
                                "NodeName=cpu01,gpu03 Name=gpu File=/x/nvidia[0-1]\n"
                                "Name=mps Count=100\n")
    e = env(SLURM_CONF=conf, SLURMD_NODENAME="gpu02", SLURM_STEP_GPUS="0")
    assert slurm.gres_file_minors(e) == [2, 3]
    assert slurm.resolve_auto(e, Host(), probe=open_all) == idx(2)


def test_gres_conf_device_files_are_identified_by_their_minor(tmp_path):
    # gres File= paths need not be named nvidiaN; the char device's minor decides.
    for name, minor in (("gpuA", 3), ("gpuB", 1)):
        os.mknod(tmp_path / name, stat.S_IFCHR | 0o666, os.makedev(195, minor))
    conf = write_gres(tmp_path, f"Name=gpu File={tmp_path}/gpuA,{tmp_path}/gpuB\n")
    assert slurm.gres_file_minors({"SLURM_CONF": conf}) == [3, 1]


def test_unconstrained_per_task_cvd_holds_gres_positions():
    # --gpus-per-task=1, task 1: Slurm sets STEP_GPUS=2 and CVD=2 (global) for that task.
    e = env(SLURM_STEP_GPUS="1,2", CUDA_VISIBLE_DEVICES="2", SLURM_LOCALID="1")
    assert slurm.resolve_auto(e, Host(), probe=open_all) == idx(2)


def test_unconstrained_cvd_outside_the_step_read_as_local_index():
    e = env(SLURM_STEP_GPUS="2,3", CUDA_VISIBLE_DEVICES="1")
    assert slurm.resolve_auto(e, Host(), probe=open_all) == idx(3)


def test_unconstrained_per_task_binding_without_cvd_uses_localid():
    e = env(SLURM_STEP_GPUS="0,1,2,3", SLURMD_TRES_BIND="gpu:per_task:2", SLURM_LOCALID="1")
    assert slurm.resolve_auto(e, Host(), probe=open_all) == idx(2, 3)


def test_unconstrained_cvd_naming_foreign_gpu_is_an_error():
    e = env(SLURM_STEP_GPUS="0,1", CUDA_VISIBLE_DEVICES="7")
    with pytest.raises(GpuError) as ei:
        slurm.resolve_auto(e, Host(), probe=open_all)
    assert "CUDA_VISIBLE_DEVICES=7" in ei.value.what


def test_unconstrained_count_only_cannot_be_resolved():
    e = env(SLURM_GPUS_ON_NODE="2", SLURMD_TRES_BIND="gpu:none")
    with pytest.raises(GpuError) as ei:
        slurm.resolve_auto(e, Host(), probe=open_all)
    assert "SLURM_GPUS_ON_NODE=2" in ei.value.what


def test_nodevfiles_means_no_gpu():
    e = env(SLURM_STEP_GPUS="0", CUDA_VISIBLE_DEVICES="NoDevFiles")
    assert slurm.resolve_auto(e, Host(), probe=open_all) == "none"


def test_missing_nodes_are_neither_allowed_nor_denied():
    # nvidia3 has no node: the rest are allowed, so this is the unconstrained path.
    e = env(SLURM_STEP_GPUS="0,1")
    probe = lambda p: None if p.endswith("nvidia3") else True  # noqa: E731
    assert slurm.resolve_auto(e, Host(), probe=probe) == idx(0, 1)


# --- outside Slurm and detection --------------------------------------------------

@pytest.mark.parametrize("environ, want", [
    ({}, "none"),
    ({"CUDA_VISIBLE_DEVICES": "1,0"}, "1,0"),
    ({"CUDA_VISIBLE_DEVICES": ""}, "none"),
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-abc", "CUDA_VISIBLE_DEVICES": "0"}, "GPU-abc"),
    ({"NVIDIA_VISIBLE_DEVICES": "void"}, "none"),
    ({"SLURM_JOB_ID": "3", "CUDA_VISIBLE_DEVICES": "2"}, "2"),   # job without GPUs
])
def test_outside_a_gpu_step_auto_is_the_callers_selection(environ, want):
    assert slurm.resolve_auto(environ, Host(), probe=lambda p: pytest.fail("probed")) == want


@pytest.mark.parametrize("environ, want", [
    ({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "0"}, True),
    ({"SLURM_JOB_ID": "1", "SLURM_JOB_GPUS": "0,1"}, True),
    ({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_GPUS_ON_NODE": "2"}, True),
    ({"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0"}, False),
    ({"SLURM_STEP_GPUS": "0"}, False),
    ({"CUDA_VISIBLE_DEVICES": "0"}, False),
])
def test_in_gpu_step(environ, want):
    assert slurm.in_gpu_step(environ) is want


# --- the real probe ---------------------------------------------------------------

def test_probe_reads_enxio_as_allowed_and_missing_as_absent(tmp_path):
    # A 195:N node with no nvidia driver loaded opens with ENXIO: the cgroup let it through.
    os.mknod(tmp_path / "nvidia0", stat.S_IFCHR | 0o666, os.makedev(195, 0))
    assert slurm.probe_node(str(tmp_path / "nvidia0")) is True
    assert slurm.probe_node(str(tmp_path / "nvidia1")) is None


def test_default_probe_end_to_end(tmp_path):
    for m in range(4):
        os.mknod(tmp_path / f"nvidia{m}", stat.S_IFCHR | 0o666, os.makedev(195, m))
    e = env(SLURM_STEP_GPUS="3", CUDA_VISIBLE_DEVICES="3")
    assert slurm.resolve_auto(e, Host(dev_root=str(tmp_path))) == idx(3)


def test_hostlist_expansion():
    assert slurm._expand("gpu[01-03,7],x[1-2]y") == \
        ["gpu01", "gpu02", "gpu03", "gpu7", "x1y", "x2y"]
