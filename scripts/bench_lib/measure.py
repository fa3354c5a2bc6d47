"""Runners, interleaved timing, concurrent bursts and memory sampling."""
import json
import os
import statistics
import subprocess
import sys
import time

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")


class RunnerError(RuntimeError):
    pass


class Runners:
    """One runner process per (mode, view) context, started on first use."""

    def __init__(self, tmp, user_ids, envs):
        self.tmp = tmp
        self.user_ids = user_ids          # (uid, gid) of the benchmark user
        self.envs = envs                  # mode -> environment
        self.procs = {}

    def _start(self, ctx):
        mode, view = ctx
        errdir = os.path.join(self.tmp, f"runner-{mode}")
        os.makedirs(errdir, mode=0o700, exist_ok=True)
        argv = [sys.executable, RUNNER, "--errfile",
                os.path.join(errdir, f"stderr-{'view' if view else 'host'}")]
        if mode == "rootless":
            uid, gid = self.user_ids
            os.chown(errdir, uid, gid)
            argv += ["--uid", str(uid), "--gid", str(gid)]
        # view: True (the cgroup2 view), or ("dev", DIR, cgroup2 view or not):
        # a private /dev that also holds DIR's device nodes (runner.py).
        dev = view[1] if isinstance(view, tuple) else None
        if view:
            argv = ["unshare", "--mount", "--propagation", "private", "--", *argv]
            if view is True or (dev and view[2]):
                argv.append("--cgroup2-view")
            if dev:
                argv += ["--dev-from", dev]
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=self.envs[mode],
                             cwd="/")
        line = p.stdout.readline()
        if not line:
            err = p.stderr.read().strip().splitlines()
            p.wait()
            raise RunnerError(err[-1] if err else f"runner exited with {p.returncode}")
        self.procs[ctx] = p
        return p

    def call(self, ctx, req):
        p = self.procs.get(ctx) or self._start(ctx)
        p.stdin.write(json.dumps(req) + "\n")
        p.stdin.flush()
        line = p.stdout.readline()
        if not line:
            raise RunnerError(f"runner {ctx} died")
        reply = json.loads(line)
        if "error" in reply:
            raise RunnerError(reply["error"])
        return reply

    def close(self):
        for p in self.procs.values():
            try:
                p.stdin.write(json.dumps({"op": "exit"}) + "\n")
                p.stdin.close()
            except (BrokenPipeError, ValueError):
                pass
        for p in self.procs.values():
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


def stats(samples, cpu=()):
    if not samples:
        return None
    out = {"median_ms": round(statistics.median(samples), 3),
           "min_ms": round(min(samples), 3), "max_ms": round(max(samples), 3),
           "n": len(samples)}
    if cpu:
        out["cpu_median_ms"] = round(statistics.median(cpu), 3)
    return out


def _first_line(err):
    lines = [l for l in (err or "").strip().splitlines() if l.strip()]
    return lines[-1][:300] if lines else "no output"


def interleaved(launchers, runners, runs, warmup, cmd, progress):
    """Round-robin over the launchers (A B C A B C ...), starting each round
    one place further, so no launcher always follows the same neighbour."""
    active = [l for l in launchers if l.status == "ok"]
    counter = 0
    total = warmup + runs
    for rnd in range(total):
        if not active:
            break
        k = rnd % len(active)
        for l in active[k:] + active[:k]:
            if l.status != "ok":
                continue
            counter += 1
            try:
                r = runners.call(l.context, {"op": "time", "argv": l.argv(counter, cmd)})
            except RunnerError as e:
                l.status, l.reason = "failed", f"runner: {e}"
                continue
            if r["rc"] != 0:
                l.status = "failed"
                l.reason = f"exit {r['rc']}: {_first_line(r.get('err'))}"
                continue
            if rnd >= warmup:
                l.samples.append(r["ns"] / 1e6)
                l.cpu.append(r["cpu_ns"] / 1e6)
        active = [l for l in active if l.status == "ok"]
        progress(rnd + 1, total)


def burst(pair, runners, n, rounds, cmd):
    """n copies at once, per launcher; rounds alternate between the two."""
    out = {l.name: {"walls_ms": [], "failed": 0} for l in pair}
    counter = 0
    for _ in range(rounds):
        for l in pair:
            argvs = []
            for _ in range(n):
                counter += 1
                argvs.append(l.argv(counter, cmd))
            r = runners.call(l.context, {"op": "burst", "argvs": argvs})
            out[l.name]["walls_ms"].append(round(r["ns"] / 1e6, 3))
            out[l.name]["failed"] += sum(1 for rc in r["rcs"] if rc != 0)
    for v in out.values():
        v["median_ms"] = round(statistics.median(v["walls_ms"]), 3)
    return out


def _proc_table():
    """pid -> (ppid, comm) for every process now."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                data = f.read()
        except OSError:
            continue
        comm = data[data.index("(") + 1:data.rindex(")")]
        ppid = int(data[data.rindex(")") + 2:].split()[1])
        table[int(name)] = (ppid, comm)
    return table


def _descendants(root, table):
    kids = {}
    for pid, (ppid, _c) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def _field_kb(path, key):
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def memory(launcher, runners, seconds, command_comm="sleep"):
    """RSS of the launcher and every process it started except the command
    (and anything the command started), while the command runs."""
    r = runners.call(launcher.context,
                     {"op": "spawn", "argv": launcher.argv(0, ["/bin/sleep", str(seconds)])})
    root = r["pid"]
    best = None
    try:
        deadline = time.monotonic() + seconds + 5
        cmd_pid = None
        while time.monotonic() < deadline and cmd_pid is None:
            table = _proc_table()
            if root not in table:
                break
            for pid in _descendants(root, table):
                if pid != root and table[pid][1] == command_comm:
                    cmd_pid = pid
                    break
            else:
                time.sleep(0.005)
        if cmd_pid is None:
            return {"error": "the command never started (launcher exited early)"}
        end = time.monotonic() + min(1.0, seconds / 2)
        while time.monotonic() < end:
            table = _proc_table()
            skip = set(_descendants(cmd_pid, table))
            procs = []
            for pid in _descendants(root, table):
                if pid in skip:
                    continue
                rss = _field_kb(f"/proc/{pid}/status", "VmRSS:")
                pss = _field_kb(f"/proc/{pid}/smaps_rollup", "Pss:")
                procs.append({"pid": pid, "comm": table[pid][1], "rss_kb": rss or 0,
                              "pss_kb": pss or 0})
            total = sum(p["rss_kb"] for p in procs)
            if best is None or total > best["rss_kb"]:
                best = {"rss_kb": total, "pss_kb": sum(p["pss_kb"] for p in procs),
                        "processes": procs}
            time.sleep(0.1)
    finally:
        rc = runners.call(launcher.context, {"op": "wait", "pid": root})["rc"]
    best["rss_mb"] = round(best["rss_kb"] / 1024, 2)
    best["pss_mb"] = round(best["pss_kb"] / 1024, 2)
    best["command_rc"] = rc
    return best
