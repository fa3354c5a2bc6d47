"""scripts/bench --spank-only: what the SPANK plugin adds to a step (issue 30).

On the one-node Slurm testbed (scripts/slurm-testbed, ConstrainDevices=yes,
a simulated 4-GPU host) whose plugstack.conf loads the plugin that
`gpusandbox slurm install-plugin` built, the same step two ways, side by
side:

    plugin:  srun -n8 --container-image=IMG true
    run:     srun -n8 gpusandbox run IMG true

IMG is a mkrootfs image directory (nothing to pull: the store is not in the
way, and both lines resolve it the same).  Warm-up rounds first, then the two
lines interleaved, wall time of the whole srun from the submitting side;
medians, and the ratio plugin/run (issue 30's target: <= 1.2).  Both lines
run this checkout through the same interpreter: the task program that
install-plugin writes, and a `gpusandbox` command of the same shape.
"""
import os
import statistics
import subprocess
import sys
import time

TARGET = 1.2


def _command(path, python, repo):
    with open(path, "w") as f:
        f.write(f"#!{python} -I\nimport sys\nsys.path.insert(0, {repo!r})\n"
                "from gpusandbox.__main__ import main\nsys.exit(main())\n")
    os.chmod(path, 0o755)


def run(repo, tmp, log, runs=10, warmup=2, ntasks=8, python=None):
    python = python or sys.executable
    env = dict(os.environ, PYTHONPATH=repo)
    env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SRUN_", "SBATCH_"))}
    sim, img, state = (os.path.join(tmp, n) for n in ("sim", "rootfs", "slurm"))
    bindir = os.path.join(tmp, "bin")
    os.makedirs(bindir)
    gsbx = os.path.join(bindir, "gpusandbox")
    _command(gsbx, python, repo)
    log("simulated host, image")
    subprocess.run([gsbx, "sim", "create", sim, "--gpus", "4"], check=True,
                   capture_output=True, env=env)
    subprocess.run([os.path.join(repo, "scripts", "mkrootfs"), img, "--no-python"],
                   check=True, capture_output=True)
    log("Slurm testbed")
    testbed = os.path.join(repo, "scripts", "slurm-testbed")
    r = subprocess.run([sys.executable, testbed, "start", "--gpus-dir", sim, "--state", state,
                        "--constrain-devices", "yes"], capture_output=True, text=True,
                       timeout=900)
    if r.returncode:
        raise RuntimeError(f"slurm-testbed start failed: {r.stderr.strip()[-300:]}")
    try:
        with open(os.path.join(state, "env")) as f:
            env.update(ln.strip().split("=", 1) for ln in f if "=" in ln)
        env["GPUSANDBOX_DRIVER_ROOT"] = sim
        r = subprocess.run([gsbx, "slurm", "install-plugin", "--dir",
                            os.path.join(tmp, "plugin")], capture_output=True, text=True,
                           env=env, check=True)
        with open(os.path.join(state, "plugstack.conf"), "w") as f:
            f.write(r.stdout.strip() + "\n")
        lines = {"plugin": ["srun", "--quiet", f"-n{ntasks}", f"--container-image={img}",
                            "true"],
                 "run": ["srun", "--quiet", f"-n{ntasks}", gsbx, "run", img, "true"]}
        times = {k: [] for k in lines}

        def once(name):
            t0 = time.monotonic()
            p = subprocess.run(lines[name], env=env, cwd="/", stdin=subprocess.DEVNULL,
                               capture_output=True, text=True, timeout=120)
            dt = time.monotonic() - t0
            if p.returncode:
                raise RuntimeError(f"{' '.join(lines[name])} failed ({p.returncode}): "
                                   f"{p.stderr.strip()[-300:]}")
            return dt

        log(f"{warmup} warm-up rounds, {runs} timed, interleaved")
        for _ in range(warmup):
            for name in lines:
                once(name)
        for i in range(runs):
            for name in (lines if i % 2 == 0 else reversed(list(lines))):
                times[name].append(once(name))
    finally:
        subprocess.run([sys.executable, testbed, "stop", "--state", state], timeout=120,
                       capture_output=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["plugin"] / med["run"]
    return {"lines": {k: " ".join(v) for k, v in lines.items()},
            "ntasks": ntasks, "runs": runs, "warmup": warmup,
            "seconds": times, "median_s": med,
            "ratio": ratio, "target": TARGET, "met": ratio <= TARGET}


def report(res, out=print):
    out(f"\nSPANK plugin vs gpusandbox run, srun -n{res['ntasks']} ... true "
        f"({res['runs']} interleaved runs, medians)")
    for k in ("plugin", "run"):
        v = res["seconds"][k]
        out(f"  {k:7s} {res['median_s'][k]:.3f} s  (min {min(v):.3f}, max {max(v):.3f})  "
            f"{res['lines'][k]}")
    out(f"  ratio plugin/run {res['ratio']:.2f}  (target <= {res['target']}: "
        f"{'met' if res['met'] else 'NOT met'})")
