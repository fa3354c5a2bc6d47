"""Pod mode (`run --share node`, hpc/pod.py) outside Slurm: ranks named by
GPUSANDBOX_POD share one user, pid and IPC namespace and /dev/shm, see the
host's hostname, reach each other with kcmp and process_vm_readv (CMA), keep
their own GPUs, and live and die independently while the pod's keeper lives.
"""
import json
import os
import signal
import socket
import uuid

import pytest

from tests.integration.conftest import comm, pids_with, wait_for

# One rank: wait for every peer's file in /dev/shm (the shared tmpfs), read
# the first peer's buffer through process_vm_readv, and report.
RANK = r"""
import ctypes, json, os, sys, time
me, peers, code = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(b"secret-of-" + me.encode(), 64)
with open(f"/dev/shm/{me}.tmp", "w") as f:
    f.write(f"{os.getpid()} {ctypes.addressof(buf)}")
os.rename(f"/dev/shm/{me}.tmp", f"/dev/shm/{me}")
end = time.monotonic() + 60
while not all(os.path.exists(f"/dev/shm/{p}") for p in peers) and time.monotonic() < end:
    time.sleep(0.02)
pid, addr = map(int, open(f"/dev/shm/{peers[0]}").read().split())
class Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
out = ctypes.create_string_buffer(64)
loc, rem = Iov(ctypes.addressof(out), 20), Iov(addr, 20)
n = libc.process_vm_readv(pid, ctypes.byref(loc), 1, ctypes.byref(rem), 1, 0)
cma = out.value.decode() if n > 0 else f"errno {ctypes.get_errno()}"
nr = {"x86_64": 312, "aarch64": 272}[os.uname().machine]
kc = libc.syscall(nr, os.getpid(), pid, 1, 0, 0)       # KCMP_VM
kcmp = kc if kc >= 0 else -ctypes.get_errno()
ns = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("pid", "ipc", "user", "mnt")}
print(json.dumps({"ns": ns, "shm": os.stat("/dev/shm").st_dev, "host": os.uname().nodename,
                  "cma": cma, "kcmp": kcmp, "pid": os.getpid(),
                  "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "gpus": sorted(d for d in os.listdir("/dev") if d[6:].isdigit()
                                 and d.startswith("nvidia"))}))
with open(f"/dev/shm/{me}.done", "w"):
    pass
while not all(os.path.exists(f"/dev/shm/{p}.done") for p in peers) and time.monotonic() < end:
    time.sleep(0.02)
sys.exit(code)
"""


@pytest.fixture
def pod_env():
    return {"GPUSANDBOX_POD": "t-" + uuid.uuid4().hex[:12]}


def _rank(runner, rootfs, env, me, peers, code, extra=()):
    return runner.popen(["--share", "node", *extra, str(rootfs), "python3", "-c", RANK,
                         me, ",".join(peers), str(code)], env=env)


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_ranks_share_namespaces_shm_and_cma_and_keep_their_gpus(
        mode, cli, test_user, rootfs, sim_host, pod_env):
    """Three ranks started at once: one keeper (one pid namespace), one
    /dev/shm, the host's hostname, kcmp and process_vm_readv across ranks,
    each rank's own GPU only (or the job's, own first, with
    --gpu-visibility step), and each rank's own exit code."""
    from tests.integration.conftest import Runner
    runner = Runner(cli, mode, test_user)
    names = ["a", "b", "c"]
    procs = []
    # The job holds GPUs 0-2 (NVIDIA_VISIBLE_DEVICES); rank c asks to see them all.
    env = {**pod_env, "NVIDIA_VISIBLE_DEVICES": "0,1,2"}
    for i, me in enumerate(names):
        peers = [p for p in names if p != me]
        gpu = ("--driver-root", sim_host.root, "--gpus", str(i))
        if me == "c":
            gpu += ("--gpu-visibility", "step")
        procs.append(_rank(runner, rootfs, env, me, peers, 3 + i, gpu))
    outs = [p.communicate(timeout=90) for p in procs]
    reps = []
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 3 + i, err
        reps.append(json.loads(out.strip().splitlines()[-1]))
    for n in ("pid", "ipc", "user"):
        assert len({r["ns"][n] for r in reps}) == 1, (n, reps)
    assert reps[0]["ns"]["pid"] != os.readlink("/proc/self/ns/pid")
    assert len({r["ns"]["mnt"] for r in reps}) == 3, reps
    assert len({r["shm"] for r in reps}) == 1, reps
    assert len({r["pid"] for r in reps}) == 3, reps
    assert {r["host"] for r in reps} == {socket.gethostname()}
    assert [r["cma"] for r in reps] == ["secret-of-b", "secret-of-a", "secret-of-a"]
    assert all(r["kcmp"] >= 0 for r in reps), reps
    minors = [g["minor"] for g in sim_host.gpus]
    assert [r["gpus"] for r in reps[:2]] == [[f"nvidia{minors[i]}"] for i in range(2)]
    # --gpu-visibility step: every GPU of the job, the rank's own first for CUDA.
    assert reps[2]["gpus"] == sorted(f"nvidia{minors[i]}" for i in range(3))
    uuids = [g["uuid"] for g in sim_host.gpus]
    assert reps[2]["cvd"] == ",".join([uuids[2], uuids[0], uuids[1]])
    assert reps[0]["cvd"] is None


def _ns_of(pid, name="pid"):
    try:
        return os.readlink(f"/proc/{pid}/ns/{name}")
    except OSError:
        return None


def _sleeps(marker):
    return [p for p in pids_with(marker) if comm(p) == "sleep"]


def _rank_pids(marker):
    """The rank's processes: the keeper, forked by whichever launcher came
    first, carries that launcher's command line too."""
    return [p for p in pids_with(marker) if comm(p) not in (None, "gpusandbox-pod")]


def _keepers(pidns):
    """Live keepers whose own pid namespace is `pidns`."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if "(gpusandbox-pod)" in stat and stat.rpartition(")")[2].split()[0] != "Z" \
                and _ns_of(d) == pidns:
            out.append(int(d))
    return out


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_kill9_of_one_launcher_ends_that_rank_only_and_keeper_ends_all(
        mode, cli, test_user, rootfs, pod_env):
    from tests.integration.conftest import Runner
    runner = Runner(cli, mode, test_user)
    ma, mb = f"31{os.getpid()}41", f"27{os.getpid()}18"
    # Each rank forks a background child, so "that rank and what it forked" is tested.
    a = runner.popen(["--share", "node", str(rootfs), "sh", "-c",
                      f"sleep {ma} & sleep {ma}"], env=pod_env)
    b = runner.popen(["--share", "node", str(rootfs), "sh", "-c",
                      f"sleep {mb} & sleep {mb}"], env=pod_env)
    try:
        assert wait_for(lambda: len(_sleeps(ma)) == 2 and len(_sleeps(mb)) == 2, 30)
        pidns = _ns_of(_sleeps(mb)[0])
        assert _ns_of(_sleeps(ma)[0]) == pidns != os.readlink("/proc/self/ns/pid")
        keepers = _keepers(pidns)
        assert len(keepers) == 1
        os.kill(a.pid, signal.SIGKILL)
        a.wait(timeout=10)
        assert wait_for(lambda: not _rank_pids(ma), 10), "rank a's processes outlived its launcher"
        assert b.poll() is None and len(_sleeps(mb)) == 2
        os.kill(keepers[0], signal.SIGKILL)
        assert b.wait(timeout=20) == 128 + signal.SIGKILL
        assert wait_for(lambda: not _rank_pids(mb) and not _rank_pids(ma), 10)
        assert wait_for(lambda: not _keepers(pidns), 10)
        # The killed keeper left its pod directory; the next new pod removes it.
        # (A pod that a test running beside this one starts in the same runtime
        # directory may sweep it first: that is the same sweep.)
        base = "/run/gpusandbox/pods" if mode == "root" else \
            f"/tmp/gpusandbox-{test_user.pw_uid}/pods"
        stale = f"{base}/{pod_env['GPUSANDBOX_POD']}"
        r = runner.run(["--share", "node", str(rootfs), "true"],
                       env={"GPUSANDBOX_POD": pod_env["GPUSANDBOX_POD"] + "-next"})
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(stale)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_keeper_outlives_signals_from_ranks_and_host(mode, cli, test_user, rootfs, pod_env):
    """A rank's `kill -INT|-TERM|-HUP 1`, and the same signals from the host
    (`scancel -s SIG` reaches every process of the step), leave the keeper
    running: the other rank goes on and exits with its own status, a later
    rank joins the same pod, and the keeper ends after the last rank."""
    from tests.integration.conftest import Runner
    runner = Runner(cli, mode, test_user)
    mb = f"23{os.getpid()}57"
    # Rank b runs until a later rank creates /dev/shm/go in the pod's tmpfs.
    b = runner.popen(["--share", "node", str(rootfs), "sh", "-c",
                      f"sleep {mb} & while [ ! -e /dev/shm/go ]; do sleep 0.05; done; "
                      "kill $!; exit 5"], env=pod_env)
    try:
        assert wait_for(lambda: _sleeps(mb), 30)
        pidns = _ns_of(_sleeps(mb)[0])
        keepers = _keepers(pidns)
        assert len(keepers) == 1
        a = runner.run(["--share", "node", str(rootfs), "sh", "-c",
                        "kill -INT 1 && kill -TERM 1 && kill -HUP 1 && "
                        "readlink /proc/self/ns/pid && exit 3; exit 9"], env=pod_env)
        assert (a.returncode, a.stdout) == (3, pidns + "\n"), a.stderr
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            os.kill(keepers[0], sig)
        # A rank that joins now meets the same keeper (pid 1 of the same pod).
        c = runner.run(["--share", "node", str(rootfs), "sh", "-c",
                        "readlink /proc/self/ns/pid; cat /proc/1/comm; touch /dev/shm/go"],
                       env=pod_env)
        assert (c.returncode, c.stdout) == (0, f"{pidns}\ngpusandbox-pod\n"), c.stderr
        assert b.wait(timeout=30) == 5, b.stderr.read()
        assert wait_for(lambda: not _keepers(pidns), 10)
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()


def test_last_rank_ends_the_keeper_and_a_new_pod_starts_fresh(root_runner, rootfs, pod_env):
    """The keeper ends with its last rank; the next launch under the same name
    makes a new pod (a new pid namespace) instead of reaching a dead one."""
    probe = "readlink /proc/self/ns/pid; echo $$"
    r1 = root_runner.run(["--share", "node", str(rootfs), "sh", "-c", probe], env=pod_env)
    assert r1.returncode == 0, r1.stderr
    ns1 = r1.stdout.split()[0]
    assert wait_for(lambda: not _keepers(ns1), 10)
    r2 = root_runner.run(["--share", "node", str(rootfs), "sh", "-c", probe], env=pod_env)
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout.split()[0] != ns1
    # The ending keeper removes the pod's directory (root's runtime directory).
    pod_dir = "/run/gpusandbox/pods/" + pod_env["GPUSANDBOX_POD"]
    assert wait_for(lambda: not os.path.exists(pod_dir), 10), os.listdir(pod_dir)


@pytest.mark.parametrize("args,env,needle", [
    (["--share", "node", "--hostname", "x"], {"GPUSANDBOX_POD": "p"}, "--hostname cannot"),
    (["--share", "node"], {}, "needs a pod name"),
    (["--share", "node"], {"GPUSANDBOX_POD": "../x"}, "invalid pod name"),
    (["--share", "pod"], {}, "invalid --share"),
])
def test_bad_pod_options_are_one_line_refusals(root_runner, rootfs, args, env, needle):
    r = root_runner.run([*args, str(rootfs), "true"], env=env)
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    assert lines[0].startswith("gpusandbox: error: ") and needle in lines[0], r.stderr
    assert len(lines) <= 2


def test_full_id_map_is_refused_for_a_pod_rank(rootless_runner, rootfs, pod_env):
    """A pod's user namespace maps one id: --userns subids (a full range of
    subordinate ids) is refused before any namespace exists, in one line."""
    from tests.integration.conftest import subid_range
    subid_range(rootless_runner.user, "/etc/subuid")
    r = rootless_runner.run(["--userns", "subids", "--share", "node", str(rootfs), "true"],
                            env=pod_env)
    assert r.returncode == 125, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == ("gpusandbox: error: --share node works with --userns single or host: "
                        "a pod's user namespace has a one-id map"), r.stderr
    assert len(lines) <= 2


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_doctor_mpi_probe_rank_sees_the_pod(mode, cli, test_user, rootfs, pod_env):
    from tests.integration.conftest import Runner
    runner = Runner(cli, mode, test_user)
    r = runner.run(["doctor", "--mpi", "--share", "node", "--json", str(rootfs)], env=pod_env)
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert "rank probe" not in checks, checks["rank probe"]
    assert checks["/dev/shm (rank)"]["status"] == "pass", checks
    assert "1024 MiB" in checks["/dev/shm (rank)"]["detail"]
    assert checks["hostname (rank)"]["status"] == "pass", checks
    ns = checks["namespaces (rank)"]["detail"]
    assert os.readlink("/proc/self/ns/pid") not in ns
    assert os.readlink("/proc/self/ns/uts") in ns


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_ranks_cannot_reach_the_keepers_host_root_or_fds(mode, cli, test_user, rootfs, pod_env):
    """The keeper is pid 1 of every rank's /proc, and its root and fds are the
    host's: /proc/1/root and /proc/1/fd/* must stay closed to the ranks."""
    from tests.integration.conftest import Runner
    runner = Runner(cli, mode, test_user)
    r = runner.run(["--share", "node", str(rootfs), "sh", "-c",
                    "cat /proc/1/comm; ls /proc/1/root/ && echo ROOT-OPEN; "
                    "readlink /proc/1/fd/3 && echo FD-OPEN; "
                    "readlink /proc/1/cwd && echo CWD-OPEN; exit 0"], env=pod_env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "gpusandbox-pod"
    assert "OPEN" not in r.stdout, r.stdout
