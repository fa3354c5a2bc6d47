"""The one GPU request parser (gpu/request.py): each input, the precedence
between them, bad values, and the doors reading a request the same way
(`run`'s options and caller environment, a config.json for
`gpusandbox-oci create`, the wrapper, the filter and the hook)."""
import json
import sys
import types

import pytest

from gpusandbox.errors import GpuError, SandboxError, UsageError
from gpusandbox.gpu import request
from gpusandbox.gpu.discover import CAPABILITIES
from gpusandbox.gpu.request import from_caller, from_config


def cfg_of(env, annotations=None, privileged=False):
    cfg = {"ociVersion": "1.0.2",
           "process": {"args": ["true"], "cwd": "/",
                       "env": [f"{k}={v}" for k, v in env.items()]},
           "root": {"path": "rootfs"},
           "linux": {"namespaces": [{"type": "mount"}, {"type": "pid"}]}}
    if annotations:
        cfg["annotations"] = annotations
    if privileged:
        cfg["process"]["capabilities"] = {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}
    return cfg


def no_slurm(monkeypatch):
    monkeypatch.setitem(sys.modules, "gpusandbox.slurm", None)


# --- devices -------------------------------------------------------------------------

@pytest.mark.parametrize("value", [None, "", " ", "void", "VOID"])
def test_unset_or_void_is_no_gpu_support(value):
    env = {} if value is None else {"NVIDIA_VISIBLE_DEVICES": value}
    for req in (from_caller(environ=env), from_config(cfg_of(env))):
        assert req.devices is None and req.caps is None and req.empty()


def test_none_all_and_lists_are_kept_for_the_selection():
    for value in ("none", "all", "0,2", "GPU-1234", "1:0"):
        env = {"NVIDIA_VISIBLE_DEVICES": value}
        assert from_caller(environ=env).devices == value
        assert from_config(cfg_of(env)).devices == value
        assert from_caller(environ=env).source["devices"] == "NVIDIA_VISIBLE_DEVICES"


def test_gpus_option_wins_over_the_callers_variable():
    env = {"NVIDIA_VISIBLE_DEVICES": "0,1"}
    req = from_caller("2", environ=env)
    assert req.devices == "2" and req.source["devices"] == "--gpus"
    # docker's spellings are normalised once, here
    assert from_caller('"device=1,2"', environ=env).devices == "1,2"
    # --gpus void switches the GPU off even where the variable names one
    assert from_caller("void", environ=env).devices is None


def test_a_slurm_step_with_gpus_wins_over_the_callers_variable():
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "0",
           "NVIDIA_VISIBLE_DEVICES": "all"}
    req = from_caller(environ=env)
    assert req.devices == "auto" and req.source["devices"] == request.SLURM
    assert from_caller("1", environ=env).devices == "1"          # --gpus still wins
    # a job without a GPU allocation: the variable as usual
    env = {"SLURM_JOB_ID": "7", "NVIDIA_VISIBLE_DEVICES": "0"}
    assert from_caller(environ=env).devices == "0"


def test_slurm_is_not_a_config_door_input():
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "0"}
    assert from_config(cfg_of(env)).empty()


def test_the_image_environment_is_no_input_of_the_callers_door():
    """from_caller has no image input at all: run passes the caller's
    environment only (plandev._gpu), so an image's NVIDIA_VISIBLE_DEVICES=all
    cannot widen anything."""
    import inspect
    assert list(inspect.signature(from_caller).parameters) == ["gpus", "caps", "cdi", "environ"]


def test_empty_gpus_option_is_one_clear_line():
    with pytest.raises(UsageError) as e:
        from_caller("", environ={})
    assert e.value.line() == "--gpus '': empty selector" and "--gpus all" in e.value.hint


# --- capabilities ----------------------------------------------------------------------

def test_capabilities_precedence_and_default():
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "video,utility"}
    assert from_caller(environ={"NVIDIA_VISIBLE_DEVICES": "0"}).caps == ("compute", "utility")
    assert from_caller(environ={"NVIDIA_VISIBLE_DEVICES": "0"}).source["caps"] == "default"
    assert from_caller(environ=env).caps == ("utility", "video")
    assert from_caller(caps="graphics", environ=env).caps == ("graphics",)
    assert from_caller(caps="graphics", environ=env).source["caps"] == "--gpu-caps"
    assert from_caller(caps="all", environ=env).caps == CAPABILITIES
    assert from_config(cfg_of(env)).caps == ("utility", "video")
    assert from_config(cfg_of({**env, "NVIDIA_DRIVER_CAPABILITIES": "all"})).caps == CAPABILITIES


@pytest.mark.parametrize("door", ["caller", "config"])
def test_bad_capability_names_the_variable_and_the_fix(door):
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "compute,gaming"}
    with pytest.raises(GpuError) as e:
        from_caller(environ=env) if door == "caller" else from_config(cfg_of(env))
    assert e.value.line() == "NVIDIA_DRIVER_CAPABILITIES 'compute,gaming': unknown capability 'gaming'"
    assert e.value.hint.startswith("use all or a comma list of compute, utility")
    with pytest.raises(UsageError, match="--gpu-caps"):
        from_caller(caps="gaming", environ=env)


def test_capabilities_and_mig_are_not_read_without_a_gpu():
    """A container that asks for no GPU runs whatever else its environment holds."""
    env = {"NVIDIA_DRIVER_CAPABILITIES": "gaming", "NVIDIA_MIG_CONFIG_DEVICES": "7"}
    assert from_caller(environ=env).empty()
    assert from_config(cfg_of(env)).empty()


# --- MIG -----------------------------------------------------------------------------

def test_mig_variables_from_the_caller():
    env = {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_MIG_CONFIG_DEVICES": "all",
           "NVIDIA_MIG_MONITOR_DEVICES": "all"}
    req = from_caller(environ=env)
    assert req.mig_config and req.mig_monitor
    assert req.source["mig_config"] == "NVIDIA_MIG_CONFIG_DEVICES"
    req = from_caller(environ={"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_MIG_MONITOR_DEVICES": ""})
    assert not req.mig_config and not req.mig_monitor


@pytest.mark.parametrize("var", ["NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"])
def test_a_mig_value_other_than_all_is_refused(var):
    """gpu/select.py's old reading ignored it silently."""
    from gpusandbox.gpu import select
    env = {"NVIDIA_VISIBLE_DEVICES": "0", var: "0,1"}
    with pytest.raises(GpuError) as e:
        select.resolve(None, None, env, host=None)
    assert e.value.line().startswith(f"{var}=0,1: ")
    assert e.value.hint == f"set {var}=all to grant it, or leave {var} unset"


@pytest.mark.parametrize("var", ["NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"])
def test_mig_from_a_config_only_for_a_privileged_container(var, tmp_path):
    """As the reference stack: the MIG capabilities reconfigure or watch the
    whole host's GPUs.  The wrapper/filter edit (configedit.edit) refuses an
    unprivileged container before looking at any host."""
    from gpusandbox.oci import configedit
    env = {"NVIDIA_VISIBLE_DEVICES": "0", var: "all"}
    with pytest.raises(GpuError) as e:
        configedit.edit(cfg_of(env), {"GPUSANDBOX_OCI_CONF": "/nonexistent"}, str(tmp_path))
    assert e.value.line().startswith(f"{var}=all: only a privileged container")
    assert e.value.hint == f"run the container privileged, or leave {var} unset"
    req = from_config(cfg_of(env, privileged=True))
    assert (req.mig_config, req.mig_monitor) == (var == "NVIDIA_MIG_CONFIG_DEVICES",
                                                 var == "NVIDIA_MIG_MONITOR_DEVICES")


# --- CDI -----------------------------------------------------------------------------

def test_cdi_names_from_options_annotations_and_the_variable():
    env = {"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=1,nvidia.com/gpu=0"}
    req = from_caller(cdi=["vendor.com/dev=a", "nvidia.com/gpu=0"], environ=env)
    assert req.devices is None
    assert req.cdi == ("vendor.com/dev=a", "nvidia.com/gpu=0", "nvidia.com/gpu=1")
    assert req.source["cdi"] == "--device"
    req = from_config(cfg_of(env, {"cdi.k8s.io/a": "vendor.com/dev=a, vendor.com/dev=b",
                                   "other/x": "vendor.com/dev=c", "cdi.k8s.io/n": 3}))
    assert req.cdi == ("vendor.com/dev=a", "vendor.com/dev=b", "nvidia.com/gpu=1",
                       "nvidia.com/gpu=0")
    assert req.source["cdi"] == "cdi.k8s.io/a" and not req.empty()
    # --gpus replaces the variable, CDI names in it included
    assert from_caller("0", environ=env).cdi == ()


@pytest.mark.parametrize("door", ["caller", "config"])
def test_cdi_names_and_selectors_mixed_is_one_clear_line(door):
    env = {"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=0,1"}
    with pytest.raises(UsageError) as e:
        from_caller(environ=env) if door == "caller" else from_config(cfg_of(env))
    assert e.value.line() == "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0,1: mixes CDI names " \
                             "and GPU selectors"
    assert e.value.hint.startswith("use one form")


# --- the doors agree -------------------------------------------------------------------

ENVS = [
    {"NVIDIA_VISIBLE_DEVICES": "0"},
    {"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_DRIVER_CAPABILITIES": "utility"},
    {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "graphics,compute"},
    {"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=1"},
    {"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_DRIVER_CAPABILITIES": "utility"},
]


@pytest.mark.parametrize("env", ENVS, ids=lambda e: ",".join(e.values()))
def test_caller_and_config_doors_read_the_same_request(env, monkeypatch):
    no_slurm(monkeypatch)
    assert from_caller(environ=env).fields() == from_config(cfg_of(env)).fields()


@pytest.mark.parametrize("env", ENVS, ids=lambda e: ",".join(e.values()))
def test_oci_create_reads_the_request_the_wrapper_reads(env, tmp_path):
    """`gpusandbox-oci create`'s config.load hands the planner the request
    configedit (wrapper, filter, hook) parses from the same config.json; it
    used to read NVIDIA_VISIBLE_DEVICES alone (no capabilities, no MIG, no
    annotation)."""
    from gpusandbox.oci import config
    (tmp_path / "rootfs").mkdir()
    cfg = cfg_of(env, {"cdi.k8s.io/x": "vendor.com/dev=z"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = config.load(str(tmp_path), {"GPUSANDBOX_OCI_CONF": "/nonexistent"})
    want = from_config(cfg)
    assert spec.gpu_request.fields() == want.fields()
    assert "vendor.com/dev=z" in spec.gpu_request.cdi
    assert spec.oci.plan_env == {}     # no variable of the caller's, as before


def test_oci_create_refuses_unprivileged_mig_as_the_wrapper_does(tmp_path):
    from gpusandbox.oci import config
    (tmp_path / "rootfs").mkdir()
    cfg = cfg_of({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_MIG_MONITOR_DEVICES": "all"})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(SandboxError, match="^NVIDIA_MIG_MONITOR_DEVICES=all$"):
        config.load(str(tmp_path), {"GPUSANDBOX_OCI_CONF": "/nonexistent"})


def test_run_plans_cdi_names_of_the_callers_variable(monkeypatch):
    """plandev._gpu: the caller's NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0
    reaches the CDI resolver (`run --device`'s), not the GPU selector (which
    called it an unknown device)."""
    from gpusandbox import plandev
    from gpusandbox.edits import ContainerEdits
    from gpusandbox.spec import RunSpec
    seen = []

    class Result:
        def __init__(self):
            self.edits, self.rules, self.warnings = ContainerEdits(), [], []
            self.edits.env["FROM_CDI"] = "1"

    def resolve(names, rootfd=None, environ=None):
        seen.append(list(names))
        return Result()

    fake = types.ModuleType("gpusandbox.oci.cdi.apply")
    fake.resolve = resolve
    monkeypatch.setitem(sys.modules, "gpusandbox.oci.cdi.apply", fake)

    class Plan:
        edits, device_rules, warnings = ContainerEdits(), None, []

    spec = RunSpec()
    spec.cdi_devices = ["vendor.com/dev=a"]
    env = plandev._gpu(Plan(), spec, None, {}, {"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=0"})
    assert seen == [["vendor.com/dev=a", "nvidia.com/gpu=0"]] and env == {"FROM_CDI": "1"}


def test_a_plain_launch_imports_no_gpu_module():
    import subprocess
    from pathlib import Path
    code = ("import sys\nfrom gpusandbox import plandev\nfrom gpusandbox.spec import RunSpec\n"
            "assert plandev._gpu(None, RunSpec(), None, {}, {'PATH': '/bin'}) == {}\n"
            "print(sorted(m for m in sys.modules if m.startswith('gpusandbox.gpu')))\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
