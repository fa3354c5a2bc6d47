"""The live row of scripts/bench: `exec` into a running sandbox against a
`run` of the same image (issue 28, docs/live.md).

Per mode (rootless as the benchmark user, then root), one detached sandbox

    gpusandbox run -d --name gsbx-bench-live-PID-MODE --driver-root SIM --gpus 0,1 IMAGE sleep inf

(the options of the launch table's gsbx-MODE-gpu row), then, interleaved
(the order flips every round), warm-up rounds first:

    exec:  gpusandbox exec NAME /bin/true
    run:   gpusandbox run --driver-root SIM --gpus 0,1 IMAGE /bin/true

both spawned by the bench's runner of that mode (posix_spawn, wall clock and
CPU from wait4); medians, and the ratio exec/run (issue 28's target: <= 1).
The sandbox is stopped and removed after, also when a launch fails, and
`ps -a` is checked to hold no sandbox of that name.

`measure` runs in the default set (Bench.launch's runners); `standalone` is
`--live-only`: the same rows with only what they need (the user, a regular
install, the rootfs, the simulated host)."""
import fnmatch
import json
import os
import shutil
import subprocess
import tempfile

from . import PREFIX, host, install, launchers as L, measure as M, rootfs

TARGET = 1.0
TRUE = ["/bin/true"]
ROW = "live"            # the name --only selects this section by
MODES = ("rootless", "root")


def wanted(only):
    """Whether the default run measures the live row: always, unless --only
    names rows and none of them matches `live`."""
    return not only or any(fnmatch.fnmatchcase(ROW, p) for p in only)


def _first_line(err):
    lines = [x for x in (err or "").strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else "no output"


def _call(runners, ctx, argv, what):
    r = runners.call(ctx, {"op": "time", "argv": argv})
    if r["rc"] != 0:
        raise M.RunnerError(f"{what}: exit {r['rc']}: {_first_line(r.get('err'))}")
    return r


def _cleanup(runners, ctx, gsbx, name):
    """stop + rm of the sandbox, then `ps -a --json` must not list it:
    returns None, or what is left."""
    problems = []
    for argv in ([gsbx, "stop", "-t", "5", name], [gsbx, "rm", name]):
        r = runners.call(ctx, {"op": "time", "argv": argv})
        if r["rc"] != 0:
            problems.append(f"{' '.join(argv[1:])}: exit {r['rc']}: "
                            f"{_first_line(r.get('err'))}")
    if problems:    # the last resort: SIGKILL and remove
        runners.call(ctx, {"op": "time", "argv": [gsbx, "rm", "-f", name]})
    # ps writes its JSON to stdout, which the runner discards: through sh to stderr.
    r = runners.call(ctx, {"op": "time", "capture": True, "argv": [
        "/bin/sh", "-c", 'exec "$0" ps -a --json >&2', gsbx]})
    return "; ".join(problems) or None, r


def one_mode(runners, gsbx, sim, image, mode, runs, warmup, log):
    ctx = (mode, False)
    run_argv = L.gpusandbox(gsbx, mode, "0,1", sim, image).argv(0, TRUE)
    name = f"gsbx-bench-live-{os.getpid()}-{mode}"
    start = run_argv[:2] + ["-d", "--name", name] + run_argv[2:-1] + ["sleep", "inf"]
    forms = {"exec": [gsbx, "exec", name, *TRUE], "run": run_argv}
    wall = {k: [] for k in forms}
    cpu = {k: [] for k in forms}
    out = {"argv": {"detached": start, **forms}}
    log(f"live, {mode}: {' '.join(start[1:])}")
    try:
        _call(runners, ctx, start, "run -d")
    except M.RunnerError as e:   # a failed launch leaves nothing (docs/live.md)
        return {**out, "status": "failed", "reason": str(e)}
    try:
        for rnd in range(warmup + runs):
            for k in (forms if rnd % 2 == 0 else list(forms)[::-1]):
                r = _call(runners, ctx, forms[k], k)
                if rnd >= warmup:
                    wall[k].append(r["ns"] / 1e6)
                    cpu[k].append(r["cpu_ns"] / 1e6)
        out["status"] = "ok"
    except M.RunnerError as e:
        out.update(status="failed", reason=str(e))
    finally:
        problem, ps = _cleanup(runners, ctx, gsbx, name)
        left = _listed(ps, name)
        out["cleanup"] = problem or ("left: " + left if left else "stopped and removed")
        if problem or left:
            out.update(status="failed", reason="cleanup: " + out["cleanup"])
    if out["status"] != "ok":
        return out
    for k in forms:
        out[k] = {**M.stats(wall[k], cpu[k]),
                  "samples_ms": [round(s, 3) for s in wall[k]]}
    out["ratio"] = round(out["exec"]["median_ms"] / out["run"]["median_ms"], 3)
    out["cpu_ratio"] = round(out["exec"]["cpu_median_ms"] / out["run"]["cpu_median_ms"], 3)
    out["target"] = TARGET
    out["met"] = out["ratio"] <= TARGET
    return out


def _listed(ps, name):
    """What `ps -a --json` still lists under name, or None."""
    if ps["rc"] != 0:
        return f"ps -a failed: {_first_line(ps.get('err'))}"
    try:
        rows = json.loads(ps.get("err") or "[]")
    except ValueError:
        return f"ps -a --json printed no JSON: {_first_line(ps.get('err'))}"
    left = [r for r in rows if r.get("name") == name]
    return json.dumps(left) if left else None


def measure(runners, gsbx, sim, image, runs, warmup, log, modes=MODES):
    res = {"runs": runs, "warmup": warmup, "target": TARGET,
           "load_before": host_load()}
    for mode in modes:
        res[mode] = one_mode(runners, gsbx, sim, image, mode, runs, warmup, log)
    res["load_after"] = host_load()
    return res


def host_load():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


def report(res, out=print):
    out(f"\nexec into a running sandbox vs run of the same image, /bin/true, --gpus 0,1 "
        f"({res['runs']} interleaved runs each, medians; load average "
        f"{res['load_before']} before, {res['load_after']} after)")
    for mode in MODES:
        r = res.get(mode)
        if r is None:
            continue
        if r["status"] != "ok":
            out(f"  {mode:8s} {r['status']}: {r['reason']}")
            continue
        e, n = r["exec"], r["run"]
        out(f"  {mode:8s} exec {e['median_ms']:7.1f} ms (CPU {e['cpu_median_ms']:.1f})   "
            f"run {n['median_ms']:7.1f} ms (CPU {n['cpu_median_ms']:.1f})   "
            f"ratio exec/run {r['ratio']:.2f} (CPU {r['cpu_ratio']:.2f}; target <= "
            f"{r['target']:g}: {'met' if r['met'] else 'NOT met'})")


def standalone(repo, gsbx_opt, user, runs, warmup, log, keep=False):
    """--live-only: the benchmark user, the command (a regular install of
    the checkout unless gsbx_opt names one), the bench's rootfs and a
    simulated 4-GPU host under a temp dir, the rows, then everything
    removed again (the user too if it was made here)."""
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    tmp = tempfile.mkdtemp(prefix=PREFIX, dir="/tmp")
    os.chmod(tmp, 0o755)
    uid, gid, created = host.ensure_user(user, log)
    runners = None
    try:
        home, xdg = os.path.join(tmp, "home"), os.path.join(tmp, "xdg")
        for d in (home, xdg):
            os.mkdir(d, 0o700)
            os.chown(d, uid, gid)
        envs = {"root": {"PATH": path, "HOME": "/root", "LANG": "C.UTF-8"},
                "rootless": {"PATH": path, "HOME": home, "XDG_RUNTIME_DIR": xdg,
                             "LANG": "C.UTF-8", "USER": user, "LOGNAME": user}}
        gsbx = install.find_gpusandbox(gsbx_opt, tmp, repo, log)
        py = install.interpreter_of(gsbx, path) if gsbx else None
        if not py:
            raise RuntimeError("gpusandbox not found (pass --gpusandbox PATH)")
        image = rootfs.build(os.path.join(tmp, "image"), (user, uid, gid))
        sim = os.path.join(tmp, "sim")
        subprocess.run([py, "-m", "gpusandbox.sim", "create", sim, "--gpus", "4",
                        "--pad-ldcache", "2000"], check=True, capture_output=True,
                       env=envs["root"])
        runners = M.Runners(tmp, (uid, gid), envs)
        res = measure(runners, gsbx, sim, image, runs, warmup, log)
        res["gpusandbox"] = gsbx
        res["tmp"] = tmp
        return res
    finally:
        if runners:
            runners.close()
        host.reap_all()
        host.unmount_under(tmp, log)
        if keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        if created:
            host.remove_user(user, log)
