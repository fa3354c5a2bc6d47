"""The CUDA requirement check and `gpusandbox doctor`, through the installed CLI,
on simulated GPU hosts (`gpusandbox sim create`), as root and as an
unprivileged user."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.integration.conftest import host_mounts


def _sim(cli, **opts):
    # Device nodes must be openable: /var/tmp, not a nodev /tmp.
    base = Path(tempfile.mkdtemp(prefix="gsbx-doctor-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    args = [cli, "sim", "create", str(base / "host")]
    for key, val in opts.items():
        flag = "--" + key.replace("_", "-")
        args += [flag] if val is True else [flag, str(val)]
    subprocess.run(args, check=True, capture_output=True, text=True)
    return base


def _destroy(cli, base):
    subprocess.run([cli, "sim", "destroy", str(base / "host")], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def sim_host(cli):
    base = _sim(cli, gpus=4, driver_version="550.54.15", cuda_version="12.4")
    yield str(base / "host")
    _destroy(cli, base)


@pytest.fixture(scope="module")
def old_host(cli):
    """A driver whose CUDA ceiling (12.2) is older than the images below need."""
    base = _sim(cli, gpus=2, driver_version="535.104.05", cuda_version="12.2")
    yield str(base / "host")
    _destroy(cli, base)


def _set_env(root, text):
    env = Path(root) / "etc" / "environment"
    env.write_text(text)


def _doctor(runner, *args):
    res = runner.run(["doctor", "--json", *args], timeout=300)
    assert res.stdout, res.stderr
    return res.returncode, json.loads(res.stdout)


def _checks(report):
    return {(c["section"], c["name"]): c for c in report["checks"]}


def test_healthy_host_every_check_passes_and_a_real_sandbox_counts_the_gpus(runner, sim_host, rootfs):
    rc, report = _doctor(runner, "--gpus", "0,2", "--driver-root", sim_host, str(rootfs))
    checks = _checks(report)
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert not failed, failed
    assert rc == 0 and report["ok"]
    # only the launcher section may warn (e.g. no delegated cgroup for the test user)
    for c in report["checks"]:
        if c["section"] != "launcher":
            assert c["status"] == "pass", c
    assert "0: NVIDIA H100" in checks[("verify", "host GPU listing")]["detail"]
    nodes = checks[("verify", "device nodes in sandbox")]["detail"].split()
    assert "/dev/nvidia0" in nodes and "/dev/nvidia2" in nodes and "/dev/nvidiactl" in nodes
    assert "/dev/nvidia1" not in nodes and "/dev/nvidia3" not in nodes
    assert "2 device(s)" in checks[("verify", "CUDA in sandbox")]["detail"]


def test_human_output_one_line_per_check(root_runner, sim_host):
    res = root_runner.run(["doctor", "--driver-root", sim_host], timeout=120)
    lines = [ln.split() for ln in res.stdout.splitlines() if ln.startswith("  ")]
    assert lines and all(ln[0] in ("PASS", "WARN", "FAIL") for ln in lines)
    assert ["PASS", "kernel", "module", "NVIDIA", "550.54.15"] in lines
    assert res.stdout.splitlines()[-1].endswith("failed")


def test_driver_older_than_the_image_cuda_refuses_the_launch(runner, old_host, small_rootfs):
    _set_env(small_rootfs, "CUDA_VERSION=12.4.1\n")
    before = host_mounts()
    res = runner.run(["--gpus", "0", "--driver-root", old_host, str(small_rootfs),
                      "echo", "STARTED"])
    assert res.returncode == 125
    assert "STARTED" not in res.stdout
    err = res.stderr.strip().splitlines()
    assert "cuda>=12.4" in err[0] and "CUDA_VERSION=12.4.1" in err[0]
    assert "535.104.05" in err[0] and "12.2" in err[0]
    assert any("550.54.14" in ln for ln in err)       # the first driver of CUDA 12.4
    assert host_mounts() == before


@pytest.mark.parametrize("how", ["option", "caller-env", "image-env"])
def test_the_check_can_be_skipped_with_a_warning(root_runner, old_host, small_rootfs, how):
    env_text = "NVIDIA_REQUIRE_CUDA=cuda>=12.4\n"
    args, env = ["--gpus", "0", "--driver-root", old_host], None
    if how == "option":
        args.append("--no-require")
    elif how == "caller-env":
        env = {"NVIDIA_DISABLE_REQUIRE": "true"}
    else:
        env_text += "NVIDIA_DISABLE_REQUIRE=true\n"
    _set_env(small_rootfs, env_text)
    res = root_runner.run(args + [str(small_rootfs), "echo", "STARTED"], env=env)
    assert res.returncode == 0, res.stderr
    assert "STARTED" in res.stdout
    assert "warning" in res.stderr and "skipped" in res.stderr


def test_doctor_names_the_image_requirement_against_the_ceiling(root_runner, old_host, small_rootfs):
    _set_env(small_rootfs, "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471\n")
    rc, report = _doctor(root_runner, "--gpus", "0", "--driver-root", old_host, str(small_rootfs))
    c = _checks(report)[("image", "CUDA requirement")]
    assert rc == 1 and c["status"] == "fail"
    assert "cuda>=12.4" in c["detail"] and "up to 12.2" in c["detail"]
    assert "550.54.14" in c["fix"]


def test_no_driver_loaded(root_runner, tmp_path):
    os.chmod(tmp_path, 0o755)
    rc, report = _doctor(root_runner, "--driver-root", str(tmp_path))
    c = _checks(report)[("driver", "kernel module")]
    assert rc == 1 and c["status"] == "fail" and "not loaded" in c["detail"]


def test_missing_nvidia_uvm(cli, root_runner, rootfs):
    base = _sim(cli, gpus=1, no_uvm=True)
    try:
        rc, report = _doctor(root_runner, "--gpus", "0", "--driver-root", str(base / "host"),
                             str(rootfs))
    finally:
        _destroy(cli, base)
    checks = _checks(report)
    assert rc == 1
    assert checks[("driver", "nvidia-uvm")]["status"] == "fail"
    assert "modprobe nvidia-uvm" in checks[("driver", "nvidia-uvm")]["fix"]


def test_libraries_of_another_driver_version(cli, root_runner):
    base = _sim(cli, gpus=1, driver_version="560.28.03", lib_version="550.54.15")
    try:
        rc, report = _doctor(root_runner, "--driver-root", str(base / "host"))
    finally:
        _destroy(cli, base)
    c = _checks(report)[("driver", "driver libraries")]
    assert rc == 1 and c["status"] == "fail"
    assert "550.54.15" in c["detail"] and "560.28.03" in c["detail"]
    assert "reboot" in c["fix"]


def test_image_without_python_is_counted_with_nvidia_smi(root_runner, sim_host, small_rootfs):
    rc, report = _doctor(root_runner, "--gpus", "1", "--driver-root", sim_host, str(small_rootfs))
    c = _checks(report)[("verify", "CUDA in sandbox")]
    assert c["status"] == "pass" and "nvidia-smi -L lists 1 device(s)" in c["detail"]
    assert rc == 0
