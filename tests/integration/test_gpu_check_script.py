"""scripts/gpu-check, the one check that meets a real driver, must fail when
a step fails.  Against a simulated host (GSBX_CHECK_DRIVER_ROOT) every step
runs and passes up to the CUDA round trip, which the stub libcuda cannot do
(no contexts): the script then exits 1 and its last line names exactly the
two failed steps, root and rootless."""
import os
import subprocess

from .conftest import REPO


def test_gpu_check_fails_and_names_the_failed_steps(cli, sim_host, shared_tmp):
    out = shared_tmp / "out"
    out.mkdir()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8",
           "HOME": "/root", "GSBX_CHECK_DRIVER_ROOT": str(sim_host), "OUT": str(out)}
    r = subprocess.run([str(REPO / "scripts" / "gpu-check")], capture_output=True, text=True,
                       timeout=240, env=env, cwd="/")
    lines = r.stdout.splitlines()
    assert r.returncode == 1, r.stdout[-3000:]
    cuda = "CUDA driver API round trip in the sandbox"
    assert lines[-1] == (f"gpu-check: FAILED 2 of 12 steps: root: {cuda};user: {cuda} "
                         f"(log: {out}/gpu-check.log)"), r.stdout[-3000:]
    # Each failure is reported where it happens, and the later steps still ran.
    assert [ln for ln in lines if ln.startswith("FAILED")] == [
        f"FAILED (exit 1): root: {cuda}", f"FAILED (exit 1): user: {cuda}"]
    assert "cuCtxCreate" in r.stdout
    assert "== gpusandbox doctor" in lines
    # The steps before passed with one GPU each: its nvidia-smi line, twice.
    uuid = sim_host.gpus[0]["uuid"]
    assert len([ln for ln in lines if ln.startswith("GPU 0: ") and uuid in ln]) == 2
    with open(os.path.join(out, "gpu-check.log")) as f:
        assert f.read().splitlines()[-1] == lines[-1]
