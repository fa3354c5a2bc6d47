"""What people read from the real CLI, root and rootless: the sandbox that
`sim create` suggests runs as printed, and `mps up|down|status` answer in
sentences (--json keeps the fields for tools)."""
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile

import pytest


@pytest.fixture(scope="module")
def fresh_sim(cli):
    base = tempfile.mkdtemp(prefix="gsbx-test-sim-", dir="/tmp")
    subprocess.run(["chmod", "755", base], check=True)
    root = f"{base}/host"
    r = subprocess.run([cli, "sim", "create", root, "--gpus", "2"], capture_output=True,
                       text=True, timeout=300)
    try:
        assert r.returncode == 0, r.stderr
        yield root, r.stdout
    finally:
        subprocess.run([cli, "sim", "destroy", root], capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


def test_sim_create_suggests_a_sandbox_that_runs(runner, fresh_sim):
    root, out = fresh_sim
    [line] = [ln for ln in out.splitlines() if ln.startswith("try: ")]
    argv = shlex.split(line[len("try: "):])
    assert argv == ["gpusandbox", "run", "--driver-root", root, "--gpus", "0", "/",
                    "nvidia-smi", "-L"]
    r = runner.run(argv[2:])                 # runner.run adds the installed CLI and `run`
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("GPU 0: ") and r.stdout.count("GPU ") == 1, r.stdout


@pytest.fixture
def mps_host(runner, fresh_sim):
    """This module's own simulated host (its GPUs' UUIDs, and so its daemons'
    directories, are nobody else's: the session's host has other tests'
    daemons come and go), and its daemon stopped whatever the test did."""
    root, _ = fresh_sim
    yield root
    runner.run(["mps", "down", "--driver-root", root, "--gpus", "0"])


def test_mps_up_status_down_speak_in_sentences(runner, mps_host):
    def mps(*args):
        r = runner.run(["mps", *args, "--driver-root", mps_host, "--gpus", "0"])
        assert r.returncode == 0, r.stderr
        assert not re.search(r"\w=(True|False|None)\b", r.stdout), r.stdout
        return r.stdout.splitlines()

    up = mps("up", "--gpu-memory", "1044M")
    m = re.fullmatch(r"GPU 0: MPS daemon started \(pid (\d+)\)", up[0])
    assert m, up
    pid = m.group(1)
    assert up[1:] == ["  default memory limit per CUDA process: 1G"]
    assert mps("up") == [f"GPU 0: MPS daemon already running (pid {pid})"]
    status = mps("status")
    assert status[0].startswith(f"GPU 0: MPS daemon running (pid {pid}); pipe /"), status
    assert mps("down") == [f"GPU 0: MPS daemon (pid {pid}) stopped"]
    assert mps("down") == ["GPU 0: no MPS daemon of yours was running"]
    assert mps("status")[0] == "GPU 0: no MPS daemon of yours is running"
    rows = json.loads("\n".join(mps("down", "--json")))
    assert rows == [{"gpu": 0, "stopped": False, "pid": None, "restored_mode": None}]


def test_sim_destroy_ends_the_hosts_daemons(runner, cli):
    """A daemon `mps up` started from a simulated host is ended with the host:
    a test that fails between up and down leaves nothing running."""
    base = tempfile.mkdtemp(prefix="gsbx-test-sim-", dir="/tmp")
    subprocess.run(["chmod", "755", base], check=True)
    root = f"{base}/host"
    try:
        r = subprocess.run([cli, "sim", "create", root, "--gpus", "1"], capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        r = runner.run(["mps", "up", "--driver-root", root, "--gpus", "0", "--json"])
        assert r.returncode == 0, r.stderr
        pid = json.loads(r.stdout)[0]["pid"]
        assert pid and os.path.exists(f"/proc/{pid}")
        r = subprocess.run([cli, "sim", "destroy", root], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(f"/proc/{pid}/cmdline") or \
            open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        subprocess.run([cli, "sim", "destroy", root], capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)
