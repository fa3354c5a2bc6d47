"""A real single-node Slurm for the integration tests (scripts/slurm-testbed).

    tb = slurm_testbed(tmp_root, sim_dir, constrain=True)   # raises TestbedUnavailable
    tb.srun(["--gres=gpu:2", "hostname"]).stdout
    jobid = tb.sbatch(["--gres=gpu:1"], "#!/bin/sh\\nsrun sleep 60\\n")
    tb.wait_state(jobid, "RUNNING"); tb.scancel(jobid); tb.wait_done(jobid)["JobState"]
    tb.stop()

conftest.py wraps slurm_testbed() in a session fixture and calls stop() at the
end; every wait here is bounded so a broken Slurm fails a test instead of
hanging the session.
"""
import os
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTBED = os.path.join(REPO, "scripts", "slurm-testbed")
DONE_STATES = ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
               "PREEMPTED", "BOOT_FAIL", "DEADLINE")


class TestbedUnavailable(Exception):
    """Slurm cannot run here; the message is the skip reason."""


def _free_port_pair(first=16817, tries=40):
    for base in range(first, first + 20 * tries, 20):
        try:
            for port in (base, base + 1):
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise TestbedUnavailable("no free port pair for slurmctld/slurmd near 16817")


class SlurmTestbed:
    def __init__(self, state, conf, node, constrain, sim_dir, prefix=(), holders=None):
        self.state, self.conf, self.node = state, conf, node
        self.constrain, self.sim_dir = constrain, sim_dir
        self._scripts = 0
        # Multi-node: clients run in the fabric's network namespace (prefix), and
        # holders maps each node name to the pid holding its namespaces.
        self.prefix, self.holders = list(prefix), dict(holders or {})
        self.nodes = list(self.holders) or [node]

    # --- clients -------------------------------------------------------------
    def environ(self, extra=None):
        """The caller's environment without any outer job's SLURM_* variables."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        env["SLURM_CONF"] = self.conf
        env.update(extra or {})
        return env

    def run(self, argv, env=None, timeout=60, user=None):
        """A Slurm client command; `user` (a pwd entry) submits as that user, so the
        job's tasks run unprivileged as they do on a cluster."""
        return subprocess.run(self.prefix + _as(user, argv), env=self.environ(env), cwd="/",
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)

    def srun(self, args, env=None, timeout=60, user=None):
        return self.run(["srun", "--quiet", *args], env=env, timeout=timeout, user=user)

    def srun_bg(self, args, env=None, user=None):
        return subprocess.Popen(self.prefix + _as(user, ["srun", "--quiet", *args]),
                                env=self.environ(env),
                                cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def sbatch(self, args, script=None, env=None, timeout=30):
        """Submit `script` (text; omit it with --wrap); returns the job id."""
        argv = ["sbatch", "--parsable", *args]
        if script is not None:
            self._scripts += 1
            path = os.path.join(self.state, f"job{self._scripts}.sh")
            with open(path, "w") as f:
                f.write(script)
            argv.append(path)
        r = self.run(argv, env=env, timeout=timeout)
        if r.returncode:
            raise AssertionError(f"sbatch failed: {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]

    def scancel(self, jobid, signal=None):
        argv = ["scancel"] + ([f"--signal={signal}"] if signal else []) + [str(jobid)]
        r = self.run(argv, timeout=20)
        if r.returncode:
            raise AssertionError(f"scancel {jobid} failed: {r.stderr.strip()}")

    def job(self, jobid):
        """The job record as a dict: scontrol while the controller keeps it
        (MinJobAge), else the jobcomp/filetxt line written at completion."""
        r = self.run(["scontrol", "-o", "show", "job", str(jobid)], timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            return _fields(r.stdout)
        return self.jobcomp(jobid)

    def jobcomp(self, jobid):
        try:
            with open(os.path.join(self.state, "jobcomp.txt")) as f:
                for line in f:
                    rec = _fields(line)
                    if rec.get("JobId") == str(jobid):
                        return rec
        except OSError:
            pass
        return {}

    def wait_state(self, jobid, states, timeout=30):
        states = (states,) if isinstance(states, str) else tuple(states)
        end = time.monotonic() + timeout
        rec = {}
        while time.monotonic() < end:
            rec = self.job(jobid)
            if rec.get("JobState") in states:
                return rec
            time.sleep(0.1)
        raise AssertionError(f"job {jobid} not in {states} after {timeout}s: {rec.get('JobState')}")

    def wait_done(self, jobid, timeout=60):
        """Wait until the job ended and its completion record was written."""
        rec = self.wait_state(jobid, DONE_STATES, timeout)
        end = time.monotonic() + 10
        while not self.jobcomp(jobid) and time.monotonic() < end:
            time.sleep(0.1)
        return rec

    def listpids(self, jobid):
        """Host pids Slurm tracks for the job (proctrack/cgroup: the job's freezer cgroup)."""
        r = self.run(["scontrol", "listpids", str(jobid)], timeout=20)
        pids = []
        for line in r.stdout.splitlines()[1:]:
            first = line.split()[0] if line.split() else ""
            if first.isdigit():
                pids.append(int(first))
        return pids

    def job_cgroups(self, jobid, uid=0):
        """The v1 cgroup directories Slurm made for this job that still exist (any node)."""
        out = []
        for node in self.nodes:
            for ctrl in ("freezer", "devices"):
                uid_dir = os.path.join("/sys/fs/cgroup", ctrl, f"slurm_{node}", f"uid_{uid}")
                path = os.path.join(uid_dir, f"job_{jobid}")
                if os.path.isdir(path):
                    out.append(path)
        return out

    def on_node(self, node, argv, timeout=30):
        """Run argv as root in node's namespaces (network, hostname, mounts)."""
        return subprocess.run(["nsenter", "-t", str(self.holders[node]), "-n", "-u", "-m", "--",
                               *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)

    # --- lifecycle -------------------------------------------------------------
    def stop(self):
        subprocess.run([sys.executable, TESTBED, "stop", "--state", self.state], timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _as(user, argv):
    if user is None:
        return list(argv)
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
            "--", *argv]


def _fields(line):
    """'Key=Value Key2=Value2' records (scontrol -o, jobcomp/filetxt)."""
    out = {}
    for tok in line.split():
        k, sep, v = tok.partition("=")
        if sep and k not in out:
            out[k] = v
    return out


def slurm_testbed(tmp_root, sim_dir, constrain=True, proctrack="cgroup"):
    """Start a testbed whose 4 GPUs are sim_dir/dev/nvidia*; see the module docstring.
    tmp_root must be searchable by every user who submits jobs (not a 0700 pytest tmp dir)."""
    if os.geteuid() != 0:
        raise TestbedUnavailable("the Slurm testbed needs root (slurmd runs as root)")
    if not os.path.isdir("/sys/fs/cgroup/freezer") or \
            (constrain and not os.path.isdir("/sys/fs/cgroup/devices")):
        raise TestbedUnavailable("task/cgroup here needs cgroup v1 freezer and devices controllers")
    state = os.path.join(str(tmp_root), f"slurm-{'constrained' if constrain else 'open'}"
                                        f"{'' if proctrack == 'cgroup' else '-' + proctrack}")
    os.makedirs(state, exist_ok=True)
    port = _free_port_pair()
    r = subprocess.run([sys.executable, TESTBED, "start", "--gpus-dir", str(sim_dir),
                        "--state", state, "--constrain-devices", "yes" if constrain else "no",
                        "--port", str(port), "--proctrack", proctrack],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    if r.returncode:
        raise TestbedUnavailable(f"slurm-testbed start failed: {r.stderr.strip()[-500:]}")
    with open(os.path.join(state, "env")) as f:
        env = dict(ln.strip().split("=", 1) for ln in f if "=" in ln)
    return SlurmTestbed(state, env["SLURM_CONF"], env["NODE"], constrain, str(sim_dir))



def slurm_cluster(state_root, nodes=3, constrain=True):
    """Start `scripts/slurm-testbed --nodes N` in state_root/cluster: N nodes in their
    own namespaces, 2 simulated GPUs each, bound at tb.sim_dir on every node.
    state_root must not be under /tmp (every node has its own /tmp) and must be
    searchable by every user who submits jobs."""
    if os.geteuid() != 0:
        raise TestbedUnavailable("the Slurm testbed needs root (slurmd runs as root)")
    if not os.path.isdir("/sys/fs/cgroup/freezer") or \
            (constrain and not os.path.isdir("/sys/fs/cgroup/devices")):
        raise TestbedUnavailable("task/cgroup here needs cgroup v1 freezer and devices controllers")
    state = os.path.join(str(state_root), "cluster")
    os.makedirs(state, exist_ok=True)
    # Only names hang on the port (cgroup trees slurm_tb<port>n<i>): every cluster
    # has its own network namespaces, so its ports never meet the host's.
    port = 18000 + 2 * (os.getpid() % 1000)
    r = subprocess.run([sys.executable, TESTBED, "start", "--nodes", str(nodes),
                        "--state", state, "--constrain-devices", "yes" if constrain else "no",
                        "--port", str(port)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    if r.returncode:
        raise TestbedUnavailable(f"slurm-testbed start --nodes failed: {r.stderr.strip()[-500:]}")
    with open(os.path.join(state, "env")) as f:
        env = dict(ln.strip().split("=", 1) for ln in f if "=" in ln)
    holders = {n: int(env[f"HOLDER_{n}"]) for n in env["NODES"].split(",")}
    return SlurmTestbed(state, env["SLURM_CONF"], env["NODE"], constrain,
                        os.path.join(state, "sim"),
                        prefix=["nsenter", "-t", env["FABRIC"], "-n", "--"], holders=holders)
