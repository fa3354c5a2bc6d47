"""gpusandbox inside real Slurm job steps (scripts/slurm-testbed), with and
without ConstrainDevices, on a simulated 4-GPU host.

Every test runs `python -m gpusandbox run` as the step's task, the way a user
writes `srun ... gpusandbox run --gpus auto IMAGE CMD`.
"""
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from tests.integration import slurm_fixture as sf

pytestmark = pytest.mark.slurm


# --- fixtures ------------------------------------------------------------------

@pytest.fixture(scope="session")
def slurm_sim(workdir_base):
    """The simulated 4-GPU host; under workdir_base so unprivileged jobs can read it."""
    root = workdir_base / "slurm-sim"
    r = subprocess.run([sys.executable, "-m", "gpusandbox.sim", "create", str(root),
                        "--gpus", "4"], cwd=sf.REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    return str(root)


@pytest.fixture(scope="module", params=["constrained", "open"])
def tb(request, cli, workdir_base, slurm_sim):
    """A running testbed (ConstrainDevices=yes, then no) and the installed CLI."""
    try:
        bed = sf.slurm_testbed(workdir_base, slurm_sim, constrain=request.param == "constrained")
    except sf.TestbedUnavailable as e:
        pytest.skip(f"Slurm testbed unavailable: {e}")
    bed.cli = cli
    yield bed
    bed.stop()


def sandbox(tb, rootfs, *cmd, opts=(), gpus=True):
    """argv of `gpusandbox run --gpus auto` as a step's task (no GPU options with gpus=False)."""
    gpu = ["--gpus", "auto", "--driver-root", tb.sim_dir] if gpus else []
    return [tb.cli, "run", *gpu, *opts, str(rootfs), *cmd]


def shared_dir(workdir_base, name, user=None):
    """A host directory bind-mounted into sandboxes of every task (and user)."""
    d = workdir_base / name
    d.mkdir()
    if user is not None:
        os.chown(d, user.pw_uid, user.pw_gid)
    return d


def sim_uuids(sim_dir):
    """minor -> UUID of the simulated host's GPUs."""
    out = {}
    base = os.path.join(sim_dir, "proc", "driver", "nvidia", "gpus")
    for bus in os.listdir(base):
        info = dict(ln.split(":", 1) for ln in open(os.path.join(base, bus, "information"))
                    if ":" in ln)
        info = {k.strip(): v.strip() for k, v in info.items()}
        out[int(info["Device Minor"])] = info["GPU UUID"]
    return out


def listed_uuids(text):
    """UUIDs printed by `nvidia-smi -L` lines ("GPU 0: Model (UUID: GPU-...)")."""
    return [ln.split("UUID:", 1)[1].strip(" )") for ln in text.splitlines() if "UUID:" in ln]


def blocker(tb, gpus=1):
    """A job holding the first GPU(s) so the tests' allocations do not start at 0."""
    jobid = tb.sbatch([f"--gres=gpu:{gpus}", "--wrap", "sleep 120", "-o", "/dev/null"])
    tb.wait_state(jobid, "RUNNING")
    return jobid


def release(tb, jobid):
    tb.scancel(jobid)
    tb.wait_done(jobid)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cgroup_paths(pid):
    out = {}
    with open(f"/proc/{pid}/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            out[ctrls or "v2"] = path
    return out


# --- GPU allocation -------------------------------------------------------------

RESOLVE = ("import os, sys; from gpusandbox.gpu import discover; from gpusandbox import slurm; "
           "h = discover.discover(sys.argv[1]); "
           "print(os.environ.get('SLURM_PROCID'), slurm.resolve_auto(os.environ, h))")


@pytest.mark.parametrize("args, want", [
    (["--gres=gpu:2"], {"0": "1,2"}),
    (["--ntasks=2", "--gpus-per-task=1"], {"0": "1", "1": "2"}),
])
def test_resolve_auto_matches_the_step_allocation(tb, args, want):
    """The resolver alone, in real steps: a job holding GPU 0 makes Slurm's
    positions, CUDA_VISIBLE_DEVICES and the host indices all differ."""
    held = blocker(tb)
    try:
        r = tb.srun([*args, sys.executable, "-c", RESOLVE, tb.sim_dir],
                    env={"PYTHONPATH": sf.REPO})
    finally:
        release(tb, held)
    assert r.returncode == 0, r.stderr
    got = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert got == want


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_gres_step_sees_exactly_its_gpus(tb, rootfs, mode, test_user):
    user = test_user if mode == "rootless" else None
    held = blocker(tb)
    try:
        # The allocation is gres 1,2; under ConstrainDevices CUDA_VISIBLE_DEVICES says 0,1.
        argv = sandbox(tb, rootfs, "nvidia-smi", "-L")
        r = tb.srun(["--gres=gpu:2", "bash", "-c", 'echo "STEP=$SLURM_STEP_GPUS"; exec "$@"', "-",
                     *argv], user=user)
    finally:
        release(tb, held)
    assert r.returncode == 0, r.stderr
    step = r.stdout.splitlines()[0].split("=", 1)[1].split(",")
    uuids = sim_uuids(tb.sim_dir)
    # gres.conf lists the nodes in minor order, so gres position N is /dev/nvidiaN.
    assert sorted(listed_uuids(r.stdout)) == sorted(uuids[int(i)] for i in step)
    assert len(step) == 2 and "0" not in step


def test_concurrent_jobs_get_disjoint_gpus(tb, rootfs, tmp_path):
    # Each sandbox lists its GPUs, then waits until both have, so the jobs overlap.
    script = ('nvidia-smi -L; touch /out/$SLURM_JOB_ID; i=0; '
              'while [ "$(ls /out | wc -l)" -lt 2 ] && [ $i -lt 200 ]; do '
              'sleep 0.1; i=$((i+1)); done')
    argv = sandbox(tb, rootfs, "sh", "-c", script, opts=["-v", f"{tmp_path}:/out"])
    procs = [tb.srun_bg(["--gres=gpu:2", *argv]) for _ in range(2)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1] for o in outs]
    a, b = (set(listed_uuids(o[0])) for o in outs)
    assert len(a) == 2 and len(b) == 2
    assert not a & b
    assert len(os.listdir(tmp_path)) == 2


def test_gpus_per_task_each_task_sees_only_its_own(tb, rootfs):
    held = blocker(tb)
    try:
        r = tb.srun(["--ntasks=2", "--gpus-per-task=1", "--label",
                     *sandbox(tb, rootfs, "nvidia-smi", "-L")])
    finally:
        release(tb, held)
    assert r.returncode == 0, r.stderr
    per_task = {}
    for line in r.stdout.splitlines():
        label, _, rest = line.partition(": ")
        per_task.setdefault(label.strip(), []).extend(listed_uuids(rest))
    assert sorted(per_task) == ["0", "1"], r.stdout
    assert all(len(v) == 1 for v in per_task.values()), r.stdout
    assert per_task["0"] != per_task["1"]
    held_uuid = sim_uuids(tb.sim_dir)[0]
    assert held_uuid not in per_task["0"] + per_task["1"]


def test_step_without_gpus_in_a_gpu_job_gets_none(tb, rootfs, tmp_path):
    out = tmp_path / "out.txt"
    argv = shlex.join(sandbox(tb, rootfs, "nvidia-smi", "-L"))
    jobid = tb.sbatch(["--gres=gpu:2", "-o", str(out)], f"#!/bin/sh\nsrun --gres=none {argv}\n")
    tb.wait_done(jobid)
    text = out.read_text()
    assert listed_uuids(text) == [], text
    assert "No devices found" in text, text


# --- signals, exit codes, teardown -------------------------------------------------

def test_exit_code_reaches_srun_and_the_job_record(tb, rootfs, tmp_path):
    r = tb.srun(sandbox(tb, rootfs, "sh", "-c", "exit 3", gpus=False))
    assert r.returncode == 3, r.stderr
    jobid = tb.sbatch(["-o", "/dev/null"], "#!/bin/sh\nsrun " + shlex.join(
        sandbox(tb, rootfs, "sh", "-c", "exit 3", gpus=False)) + "\n")
    rec = tb.wait_done(jobid)
    assert rec["JobState"] == "FAILED"
    assert rec["ExitCode"] == "3:0"
    assert tb.jobcomp(jobid)["ExitCode"] == "3:0"


def test_command_killed_by_signal_exits_128_plus_n(tb, rootfs):
    r = tb.srun(sandbox(tb, rootfs, "sh", "-c", "kill -USR1 $$", gpus=False))
    assert r.returncode == 128 + signal.SIGUSR1, r.stderr


def test_scancel_reaches_the_command_and_leaves_nothing(tb, rootfs, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    cmd = ("trap 'echo TERM > /out/got; exit 143' TERM; echo ready > /out/ready; "
           "while :; do sleep 0.1; done")
    argv = sandbox(tb, rootfs, "sh", "-c", cmd, gpus=False, opts=["-v", f"{out}:/out"])
    jobid = tb.sbatch(["-o", str(tmp_path / "log")],
                      "#!/bin/sh\nexec srun " + shlex.join(argv) + "\n")
    end = time.monotonic() + 30
    while not (out / "ready").exists():
        assert time.monotonic() < end, (tmp_path / "log").read_text()
        time.sleep(0.05)
    pids = tb.listpids(jobid)
    def cmdline(pid):       # the loop's `sleep 0.1` children may be gone by the time we look
        try:
            return open(f"/proc/{pid}/cmdline", "rb").read()
        except FileNotFoundError:
            return b""
    def is_launcher(pid):   # the CLI runs as "<venv>/python3 <venv>/bin/gpusandbox run ..."
        argv = cmdline(pid).split(b"\0")
        return not argv[0].endswith(b"srun") and any(a.endswith(b"/gpusandbox") for a in argv[:2])
    launchers = [p for p in pids if is_launcher(p)]
    shells = [p for p in pids if cmdline(p).startswith(b"sh\0-c")]
    assert launchers and shells, f"Slurm does not track the sandbox: {pids}"
    # Slurm's accounting and limits apply: the command is in the step's v1 cgroups,
    # and its v2 leaf nests under the launcher's cgroup.
    cmd_cg, launcher_cg = cgroup_paths(shells[0]), cgroup_paths(launchers[0])
    assert cmd_cg["freezer"] == launcher_cg["freezer"]
    assert f"/job_{jobid}/step_0" in cmd_cg["freezer"]
    assert os.path.dirname(cmd_cg["v2"]).startswith(launcher_cg["v2"].rstrip("/") or "/")
    assert cmd_cg["v2"] != launcher_cg["v2"]
    leaf = "/sys/fs/cgroup/unified" + cmd_cg["v2"]
    mounts_before = open("/proc/self/mountinfo").read()

    tb.scancel(jobid)
    rec = tb.wait_done(jobid)
    assert rec["JobState"] == "CANCELLED"
    assert (out / "got").read_text() == "TERM\n"
    end = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []
    assert not os.path.exists(leaf), f"sandbox cgroup {leaf} left behind"
    # slurmstepd removes the job's own cgroups after the job is reported
    # done, on a busy node a few seconds later.
    end = time.monotonic() + 15
    while tb.job_cgroups(jobid) and time.monotonic() < end:
        time.sleep(0.1)
    assert tb.job_cgroups(jobid) == []
    assert str(rootfs) not in open("/proc/self/mountinfo").read()
    assert open("/proc/self/mountinfo").read().count(str(out)) == mounts_before.count(str(out))
    comp = tb.jobcomp(jobid)
    assert comp["JobState"] == "CANCELLED"


def test_srun_interrupt_tears_the_sandbox_down(tb, rootfs, tmp_path):
    # Two Ctrl-C within a second make srun cancel the step (Slurm kills every task process).
    # A duration of this test's own: other tests (and this one's other
    # parameter) run `sleep`s beside it.
    dur = f"300.{os.getpid()}{int(time.monotonic() * 1000) % 100000}"
    argv = sandbox(tb, rootfs, "sh", "-c", f"echo ready > /out/ready; exec sleep {dur}",
                   gpus=False, opts=["-v", f"{tmp_path}:/out"])
    p = tb.srun_bg(argv)
    end = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < end and p.poll() is None, p.stderr.read() if p.poll() else ""
        time.sleep(0.05)
    # "ready" is written before the shell execs sleep: wait for the sleep itself.
    end = time.monotonic() + 10
    while not (sleeps := _pids_with_cmdline(b"sleep\x00" + dur.encode() + b"\x00")):
        assert time.monotonic() < end and p.poll() is None, "the sandbox's sleep never started"
        time.sleep(0.02)
    p.send_signal(signal.SIGINT)
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=30)
    assert p.returncode != 0
    end = time.monotonic() + 10
    while any(alive(s) for s in sleeps) and time.monotonic() < end:
        time.sleep(0.05)
    assert sleeps and not any(alive(s) for s in sleeps)


def _pids_with_cmdline(cmdline):
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if open(f"/proc/{p}/cmdline", "rb").read() == cmdline:
                    out.append(int(p))
            except OSError:
                pass
    return out


# --- the job environment ----------------------------------------------------------

def test_two_tasks_exchange_a_message_with_the_job_environment(tb, rootfs, tmp_path):
    cmd = ('if [ "$SLURM_PROCID" = 0 ]; then '
           '  echo "hello from $SLURM_PROCID of $SLURM_NTASKS" > /x/msg.tmp && '
           '  mv /x/msg.tmp /x/msg; '
           'else i=0; while [ ! -e /x/msg ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; '
           '  echo "task $SLURM_PROCID got: $(cat /x/msg)"; fi')
    r = tb.srun(["--ntasks=2", "--label",
                 *sandbox(tb, rootfs, "sh", "-c", cmd, gpus=False, opts=["-v", f"{tmp_path}:/x"])])
    assert r.returncode == 0, r.stderr
    assert "1: task 1 got: hello from 0 of 2" in r.stdout.splitlines(), r.stdout


def test_pmi2_wire_up_reaches_the_command(tb, rootfs):
    # srun --mpi=pmi2 hands each task a connected socket named by PMI_FD; MPI inside
    # the sandbox needs that descriptor inherited, not just the variables.
    cmd = 'echo "rank=$PMI_RANK size=$PMI_SIZE fd=$([ -S /proc/self/fd/$PMI_FD ] || ' \
          '[ -e /proc/self/fd/$PMI_FD ] && echo open)"'
    r = tb.srun(["--ntasks=2", "--mpi=pmi2", "--label",
                 *sandbox(tb, rootfs, "sh", "-c", cmd, gpus=False)])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "0: rank=0 size=2 fd=open" in lines, r.stdout
    assert "1: rank=1 size=2 fd=open" in lines, r.stdout
