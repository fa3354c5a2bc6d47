"""GPU sharing (issue 15), the parts a user reads before launching: `list`
naming the tier a launch with --gpu-memory/--gpu-compute would use, and
scripts/gpu-check-mps's orchestration (root, then rootless through setpriv)
dry-run against the simulated host, whose MPS stand-in enforces nothing."""
import json
import subprocess

from .conftest import REPO


def _list(runner, sim, *args):
    return runner.run(["list", "--driver-root", sim.root, *args])


def test_list_names_the_sharing_tier(runner, sim_host):
    r = _list(runner, sim_host, "--gpus", "0", "--gpu-memory", "2G", "--gpu-compute", "30%")
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("sharing:")][-1]
    assert line.startswith("sharing: 2048 MiB, 30% of SMs per CUDA process on GPU 0: tier 1, "
                           "MPS with the GPU in DEFAULT compute mode"), line
    # What it does not guarantee, stated with it.
    assert "a process that bypasses MPS gets the whole GPU" in line
    assert "not against a hostile tenant" in line
    assert "tier 3 (driver memory limits) unavailable" in line
    r = _list(runner, sim_host, "--gpus", "0", "--gpu-memory", "1G", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["sharing"].startswith("1024 MiB per CUDA process on GPU 0: tier 1")
    r = _list(runner, sim_host, "--gpus", "0")
    assert "\nsharing: no limits asked" in r.stdout, r.stdout
    r = _list(runner, sim_host, "--gpus", sim_host.mig(2, 1)["uuid"])
    assert r.returncode == 0, r.stderr
    assert "\nsharing: tier 4, MIG" in r.stdout, r.stdout
    # The launch's own refusals: one line and a hint, exit 125.
    r = _list(runner, sim_host, "--gpus", "2", "--gpu-memory", "1G")
    assert r.returncode == 125 and r.stdout == "", r.stdout
    assert r.stderr.splitlines() == ["gpusandbox: error: MPS limits on GPU 2: MIG is enabled on it",
                                     "hint: select one of its MIG devices instead (the hard "
                                     "partition)"], r.stderr


def _status(runner, sim, gpu):
    r = runner.run(["mps", "status", "--driver-root", sim.root, "--gpus", str(gpu), "--json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]


def test_gpu_check_mps_dry_run(cli, sim_host, rootfs, shared_tmp, test_user, root_runner,
                               rootless_runner):
    script = str(REPO / "scripts" / "gpu-check-mps")
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "OUT": str(shared_tmp), "GSBX_BIN": cli,
           "GSBX_CHECK_GPU": "1", "GSBX_CHECK_ROOTFS": str(rootfs),
           "GSBX_CHECK_USER": test_user.pw_name}
    r = subprocess.run([script, "--dry-run", str(shared_tmp / "nothing")], capture_output=True,
                       text=True, timeout=60, env=env, cwd="/")
    assert r.returncode == 1 and r.stdout.strip() == (
        "gpu-check-mps: FAILED: --dry-run needs a simulated host's root (gpusandbox sim create "
        "DIR)"), r.stdout + r.stderr
    r = subprocess.run([script, "--dry-run", sim_host.root], capture_output=True, text=True,
                       timeout=170, env=env, cwd="/")
    log = (shared_tmp / "gpu-check-mps.log").read_text()
    assert r.returncode == 0, log
    lines = log.splitlines()
    uuid = sim_host.gpus[1]["uuid"]
    # Each user's own daemon on GPU 1, both sandboxes its clients with their limits.
    for uid in (0, test_user.pw_uid):
        assert f"journal: daemon of uid {uid} for {uuid}" in lines, log
        assert (f"journal: clients (uid, limit, pipe): [({uid}, '0=2048M', '/run/nvidia-mps'), "
                f"({uid}, '0=4096M', '/run/nvidia-mps')]") in lines, log
    # The MPS items of issue 23, as far as the stand-in shows them.
    for role in ("A", "B"):
        assert lines.count(f"{role}: pipe directory read-only, control_privileged masked") == 2
    for who in ("root", "rootless"):
        for kind, why in (("fifo", "not a regular file"), ("link", "a symlink")):
            assert any(ln.startswith(f"{who}: mps status with a {kind} pid file: exit 0: ")
                       and ln.endswith(why) for ln in lines), log
            assert any(ln.startswith(f"{who}: run --gpu-memory with a {kind} pid file: exit "
                                     "125: ") for ln in lines), log
        assert f"{who}: mps down: exit 0, stopped: True" in lines, log
        assert any(ln.startswith(f"== {who}: /tmp/nvidia-mps -> /root: skipped: MPS pipe "
                                 "directory ") for ln in lines), log
    assert "GPU 1 compute mode, MIG mode after: Default, Disabled" in lines, log
    assert lines[-1].startswith("gpu-check-mps: dry run passed: the wiring only"), log
    # The daemons it started are down, their directories gone.
    for runner in (root_runner, rootless_runner):
        st = _status(runner, sim_host, 1)
        assert st["running"] is False and "error" not in st, st
        r = subprocess.run(["test", "-e", st["dir"]])
        assert r.returncode == 1, st["dir"]
