"""GPU sharing through MPS and CUDA forward compatibility, as a user sees them
(issue 15), root and rootless, on the simulated host.

The simulated MPS daemon (gpusandbox/sim/mps.py) records every command
with the peer's uid as SO_PEERCRED gives it and the CUDA_MPS_* variables the
client saw; it enforces nothing, so these tests check the wiring only (a GPU
machine's scripts/gpu-check shows enforcement).  The compat tests assert which
libcuda the sandbox's loader maps, not CUDA behaviour."""
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import REPO

COMPAT = "/usr/local/cuda-12.6/compat"
# What the loader maps: the compat pair, or the host's (injected) pair.
HOST_LIBS = str([f"/usr/lib/x86_64-linux-gnu/{s}.so.550.54.15"
                 for s in ("libcuda", "libnvidia-ptxjitcompiler")])
COMPAT_LIBS = str([f"{COMPAT}/{s}.so.560.35.03" for s in ("libcuda", "libnvidia-ptxjitcompiler")])
REQUIRE = ("NVIDIA_REQUIRE_CUDA=cuda>=12.6 brand=tesla,driver>=550,driver<551 "
           "brand=nvidia,driver>=550,driver<551 brand=geforce,driver>=550,driver<551")

PROBE = r"""
import json, os, socket, subprocess
out = {"env": {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS_")},
       "shm": sorted(os.listdir("/dev/shm"))}
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
priv = os.path.join(pipe, "control_privileged")
import stat
st = os.stat(priv)
out["priv_file"] = [stat.S_ISREG(st.st_mode), st.st_size]
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect(priv)
    out["priv"] = "connected"
except OSError as e:
    out["priv"] = e.errno
r = subprocess.run(["nvidia-cuda-mps-control"], input="get_server_list\nquit\n",
                   capture_output=True, text=True)
out["client"] = [r.returncode, r.stdout.strip()]
print(json.dumps(out))
"""

MAPS = ("import ctypes\nctypes.CDLL('libcuda.so.1')\nctypes.CDLL('libnvidia-ptxjitcompiler.so.1')\n"
        "print(sorted({l.split()[-1] for l in open('/proc/self/maps') if '.so.5' in l}))\n")


def mps(runner, sim, *args):
    return runner.run(["mps", *args, "--driver-root", sim.root, "--gpus", "0", "--json"])


@pytest.fixture
def daemon_down(runner, sim_host):
    yield
    r = mps(runner, sim_host, "down")
    assert r.returncode == 0, r.stderr


def test_mps_wiring(runner, sim_host, rootfs, daemon_down):
    marker = f"/dev/shm/gsbx-share-host-{os.getpid()}"
    Path(marker).write_text("host\n")
    try:
        r = runner.run(["--driver-root", sim_host.root, "--gpus", "0", "--gpu-memory", "2G",
                        "--gpu-compute", "30%", "-e", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=90",
                        "-e", "CUDA_MPS_PIPE_DIRECTORY=/tmp/elsewhere", "-e",
                        "CUDA_MPS_LOG_DIRECTORY=/tmp/log", "--verbose", str(rootfs),
                        "python3", "-c", PROBE])
    finally:
        os.unlink(marker)
    assert r.returncode == 0, r.stderr
    assert "tier 1, MPS" in r.stderr and "tier 3 (driver memory limits) unavailable" in r.stderr
    inside = json.loads(r.stdout.strip().splitlines()[-1])
    # The launcher's values win over -e, and no other CUDA_MPS_* is left.
    assert inside["env"] == {"CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps",
                             "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=2048M",
                             "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"}
    # The daemon's segment is there, the host's /dev/shm is not.
    assert [n for n in inside["shm"] if n.startswith("cuda.shm.")] and \
        os.path.basename(marker) not in inside["shm"]
    # control_privileged: an empty read-only file over the socket (connect
    # answers ECONNREFUSED, or EACCES where the caller lacks write access).
    assert inside["priv_file"] == [True, 0] and inside["priv"] in (111, 13), inside
    # quit from a sandbox is refused only when another uid sends it; the
    # daemon is the caller's, so the client's commands reach it.
    assert inside["client"][0] == 0, inside
    status = json.loads(mps(runner, sim_host, "status").stdout)[0]
    assert status["running"] is False      # the sandbox's quit reached it
    journal = [json.loads(ln) for ln in
               Path(status["log"], "journal.jsonl").read_text().splitlines()]
    start = [e for e in journal if e["cmd"] == "<start>"][-1]
    assert start["env"]["CUDA_VISIBLE_DEVICES"] == sim_host.gpus[0]["uuid"]
    assert start["daemon_uid"] == runner.uid
    cmds = journal[journal.index(start):]
    got = [(e["cmd"], e["uid"], e["privileged"]) for e in cmds[1:]]
    assert got == [("get_server_list", runner.uid, False), ("quit", runner.uid, False)]
    assert cmds[1]["env"] == inside["env"]
    assert f"cuda.shm.sim.{start['pid']}" in inside["shm"]


def test_mps_up_reads_back_and_refuses_other_users(runner, sim_host, rootfs, daemon_down):
    r = mps(runner, sim_host, "up", "--gpu-memory", "1044M", "--gpu-compute", "25")
    assert r.returncode == 0, r.stderr
    row = json.loads(r.stdout)[0]
    assert (row["memory"], row["compute"]) == ("1G", "25.0")   # the daemon's lossy readback
    # A command from another uid reaches the daemon and is refused there.
    other = "--user=1:1" if runner.mode == "root" else "--root"
    if runner.mode == "root":
        r = runner.run(["--driver-root", sim_host.root, "--gpus", "0", "--user", "1:1",
                        "--gpu-memory", "1G", str(rootfs), "true"])
        assert r.returncode == 125 and "--user" in r.stderr, r.stderr
    else:
        # --root: uid 0 inside is still the caller to the daemon.
        r = runner.run(["--driver-root", sim_host.root, "--gpus", "0", other, "--gpu-memory",
                        "1G", str(rootfs), "sh", "-c", "echo get_server_list | "
                        "nvidia-cuda-mps-control; id -u"])
        assert r.returncode == 0 and r.stdout.split() == ["0"], r.stderr


def test_strict_daemon_refuses_ceilings_over_the_gpu_memory(runner, sim_host, rootfs,
                                                            daemon_down):
    r = mps(runner, sim_host, "up", "--strict")
    assert r.returncode == 0, r.stderr
    leases = Path(json.loads(mps(runner, sim_host, "status").stdout)[0]["dir"], "leases")
    base = ["--driver-root", sim_host.root, "--gpus", "0"]
    # The simulated GPU has 81920 MiB: 60 GiB held by a running sandbox
    # leaves no room for 30 GiB, but room for 10 GiB.
    a = runner.popen(base + ["--gpu-memory", "60G", str(rootfs), "sleep", "60"])
    try:
        for _ in range(300):
            # setpriv execs the launcher: its pid names the lease.
            if leases.is_dir() and any(n.name.startswith(f"{a.pid}-") for n in leases.iterdir()) \
                    or a.poll() is not None:
                break
            time.sleep(0.05)
        assert a.poll() is None, a.communicate()
        _bad(runner.run(base + ["--gpu-memory", "30G", str(rootfs), "true"]),
             "--gpu-memory 30720M on GPU 0: the daemon is strict and 1 running sandbox(es) "
             "hold 61440 MiB of its 81920 MiB")
        r = runner.run(base + ["--gpu-memory", "10G", str(rootfs), "true"])
        assert r.returncode == 0, r.stderr
    finally:
        a.kill()
        a.communicate()
    # The first launcher is gone: its lease no longer counts.
    r = runner.run(base + ["--gpu-memory", "70G", str(rootfs), "true"])
    assert r.returncode == 0, r.stderr


def _bad(r, text):
    assert r.returncode == 125, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("gpusandbox: error: ") and text in lines[0], r.stderr


def test_sharing_refusals(runner, sim_host, rootfs, shared_tmp):
    base = ["--driver-root", sim_host.root]
    _bad(runner.run(base + ["--gpus", "0,1", "--gpu-memory", "1G", str(rootfs), "true"]),
         "exactly one GPU")
    _bad(runner.run(base + ["--gpus", "2", "--gpu-memory", "1G", str(rootfs), "true"]),
         "MIG is enabled")
    _bad(runner.run(base + ["--gpus", "2:1", "--gpu-compute", "10", str(rootfs), "true"]),
         "MIG device")
    _bad(runner.run(base + ["--gpus", "0", "--gpu-memory", "8X", str(rootfs), "true"]),
         "invalid --gpu-memory")
    _bad(runner.run(base + ["--gpus", "0", "--gpu-compute", "101%", str(rootfs), "true"]),
         "invalid --gpu-compute")
    _bad(runner.run(base + ["--gpu-memory", "1G", str(rootfs), "true"]), "need a GPU")
    if runner.mode == "root":
        return
    # Rootless: a runtime directory path too long for a unix socket, and a
    # gpusandbox directory another user made in it.
    uid, gid = runner.uid, runner.gid
    long_dir = shared_tmp / ("d" * 90)
    long_dir.mkdir(mode=0o700)
    os.chown(long_dir, uid, gid)
    _bad(runner.run(base + ["--gpus", "0", "--gpu-memory", "1G", str(rootfs), "true"],
                    env={"XDG_RUNTIME_DIR": str(long_dir)}), "MPS pipe directory")
    run_dir = shared_tmp / "run"
    run_dir.mkdir(mode=0o700)
    os.chown(run_dir, uid, gid)
    (run_dir / "gpusandbox").mkdir(mode=0o755)     # root's, not the caller's
    _bad(runner.run(base + ["--gpus", "0", "--gpu-memory", "1G", str(rootfs), "true"],
                    env={"XDG_RUNTIME_DIR": str(run_dir)}), "runtime directory")


# --- forward compatibility ---------------------------------------------------

_NOTE_S = """.section .note.cuda.fwd_compatibility,"a",@note
.balign 4
.long 2f-1f
.long 4f-3f
.long 1
1: .asciz "NVIDIA Corporation"
2: .balign 4
3: .ascii "{payload}"
4: .balign 4
"""


def _compat_lib(path, soname, drivers, work):
    payload = json.dumps({"format": 1, "CUDA version": "12.6", "driver": drivers},
                         separators=(",", ":")).replace('"', '\\"')
    (work / "note.S").write_text(_NOTE_S.format(payload=payload))
    (work / "stub.c").write_text("int cuInit(unsigned f) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(path),
                    str(work / "stub.c"), str(work / "note.S")], check=True, capture_output=True)


def _compat_image(base, drivers):
    root = base / "root"
    subprocess.run([str(REPO / "scripts" / "mkrootfs"), str(root)], check=True,
                   capture_output=True)
    compat = root / COMPAT.lstrip("/")
    compat.mkdir(parents=True)
    _compat_lib(compat / "libcuda.so.560.35.03", "libcuda.so.1", drivers, base)
    # A companion the cache must also point into compat/ (its content is not loaded).
    shutil.copy(compat / "libcuda.so.560.35.03", compat / "libnvidia-ptxjitcompiler.so.560.35.03")
    for stem in ("libcuda", "libnvidia-ptxjitcompiler"):
        os.symlink(f"{stem}.so.560.35.03", compat / f"{stem}.so.1")
    os.symlink("cuda-12.6", root / "usr/local/cuda")
    with open(root / "etc/environment", "a") as f:
        f.write(REQUIRE + "\n")
    return root


@pytest.fixture(scope="module")
def compat_images():
    if not shutil.which("gcc"):
        pytest.skip("gcc is needed to build the compat test libraries")
    base = Path(tempfile.mkdtemp(prefix="gsbx-test-compat-"))
    os.chmod(base, 0o755)
    try:
        (base / "ok").mkdir()
        (base / "other").mkdir()
        yield {"ok": _compat_image(base / "ok", [535, 550, 560]),
               "other": _compat_image(base / "other", [535, 560])}
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def geforce_host(cli):
    base = tempfile.mkdtemp(prefix="gsbx-test-simgf-", dir="/tmp")
    os.chmod(base, 0o755)
    root = os.path.join(base, "host")
    try:
        res = subprocess.run([cli, "sim", "create", root, "--gpus", "1", "--brand", "geforce"],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        yield root
    finally:
        subprocess.run([cli, "sim", "destroy", root], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _maps(runner, root, image, *opts):
    return runner.run(["--driver-root", root, "--gpus", "0", "--verbose", *opts, str(image),
                       "python3", "-c", MAPS])


def test_compat_preferred_on_datacenter(runner, sim_host, compat_images):
    r = _maps(runner, sim_host.root, compat_images["ok"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == COMPAT_LIBS, r.stdout
    assert "cuda-compat: forward compatibility: the image's libcuda 560.35.03" in r.stderr
    # off: the host's libcuda, and the brand term no longer carries the image.
    _bad(_maps(runner, sim_host.root, compat_images["ok"], "--cuda-compat", "off"),
         "image requires cuda>=12.6")
    r = _maps(runner, sim_host.root, compat_images["ok"], "--cuda-compat", "off", "--no-require")
    assert r.returncode == 0 and r.stdout.strip() == HOST_LIBS, r.stdout + r.stderr


def test_compat_refused_where_nvidia_does_not_support_it(runner, sim_host, geforce_host,
                                                         compat_images):
    r = _maps(runner, geforce_host, compat_images["ok"])
    _bad(r, "image requires cuda>=12.6")
    assert "brand is GeForce" in r.stderr and "minor-version compatibility" in r.stderr
    r = _maps(runner, sim_host.root, compat_images["other"])
    _bad(r, "image requires cuda>=12.6")
    assert "supports driver branches 535, 560, not the host's 550" in r.stderr
    r = _maps(runner, sim_host.root, compat_images["other"], "--cuda-compat", "force")
    assert r.returncode == 0 and r.stdout.strip() == COMPAT_LIBS, r.stdout + r.stderr
    r = _maps(runner, geforce_host, compat_images["ok"], "--no-require")
    assert r.returncode == 0 and r.stdout.strip() == HOST_LIBS, r.stdout + r.stderr


def test_gpu_check_mps_fails_cleanly_without_a_gpu(cli, shared_tmp):
    if os.path.exists("/proc/driver/nvidia/version"):
        pytest.skip("this machine has an NVIDIA driver: scripts/gpu-check-mps runs for real")
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "OUT": str(shared_tmp), "GSBX_BIN": cli}
    r = subprocess.run([str(REPO / "scripts" / "gpu-check-mps")], capture_output=True,
                       text=True, timeout=60, env=env, cwd="/")
    want = ("gpu-check-mps: FAILED: no NVIDIA driver loaded (/proc/driver/nvidia/version is "
            "missing): this check needs a GPU machine")
    assert r.returncode == 1 and r.stdout.strip().splitlines() == [want], r.stdout + r.stderr
    assert (shared_tmp / "gpu-check-mps.log").read_text().strip() == want
