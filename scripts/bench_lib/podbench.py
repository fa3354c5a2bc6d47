"""scripts/bench --pod-only: pod mode against isolated ranks (docs/pod.md).

1. Intra-node MPI ping-pong (pingpong.c, built against Debian's Open MPI, two
   ranks started by mpirun): latency at 8 B and bandwidth at 1 MiB for the same
   ranks unsandboxed (vader), in one pod (`--share node`, vader) and isolated
   (`--share none`, which needs btl self,tcp).  Rows interleaved, medians.
2. N ranks launched at once on this node (`/bin/true`), pod against isolated:
   p50 and p99 wall per rank and CPU per rank (the launcher and what it waited
   for, from wait4; the pod's keeper is extra and not counted).

Runs as root; ranks get --net host (PMIx and TCP reach mpirun on loopback).
"""
import os
import shutil
import statistics
import subprocess
import time
import uuid

MPICC = "mpicc.openmpi"
MPIRUN = "mpirun.openmpi"
RUNTIME_TREES = ("/usr/lib/x86_64-linux-gnu/openmpi", "/usr/lib/x86_64-linux-gnu/pmix2",
                 "/usr/share/openmpi", "/usr/share/pmix", "/etc/openmpi")
HERE = os.path.dirname(os.path.abspath(__file__))


def _copy_in(src, root):
    real = os.path.realpath(src)
    dst, dst_real = root + src, root + real
    os.makedirs(os.path.dirname(dst_real), exist_ok=True)
    if not os.path.lexists(dst_real):
        shutil.copy2(real, dst_real)
    if src != real and not os.path.lexists(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.symlink(real, dst)


def build(tmp):
    """(host program, image dir): pingpong.c built and put in a mkrootfs image
    with the Open MPI runtime and its library closure."""
    prog = os.path.join(tmp, "pingpong")
    subprocess.run([MPICC, "-O2", "-o", prog, os.path.join(HERE, "pingpong.c")], check=True)
    image = os.path.join(tmp, "mpi-image")
    subprocess.run([os.path.join(os.path.dirname(HERE), "mkrootfs"), image, "--no-python"],
                   check=True, capture_output=True)
    shutil.copy2(prog, os.path.join(image, "pingpong"))
    elves = [prog]
    for tree in RUNTIME_TREES:
        for dirpath, _, names in os.walk(tree):
            for name in names:
                if name.endswith((".a", ".la")):
                    continue
                path = os.path.join(dirpath, name)
                _copy_in(path, image)
                if ".so" in name and not os.path.islink(path):
                    elves.append(path)
    seen = set()
    for elf in elves:
        out = subprocess.run(["ldd", elf], capture_output=True, text=True).stdout
        for lib in (t for line in out.splitlines() for t in line.split() if t.startswith("/")):
            if lib not in seen:
                seen.add(lib)
                _copy_in(lib, image)
    subprocess.run(["ldconfig", "-r", image], check=True)
    return prog, image


def _pingpong(argv, env, iters):
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"{' '.join(argv[:8])}...: exit {r.returncode}: {r.stderr[-400:]}")
    out = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) == 5 and f[0] == "pingpong":
            out[int(f[1])] = (float(f[3]), float(f[4]))
    return out


def pingpong_rows(gsbx, prog, image, iters, reps, log):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    mpirun = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-n", "2"]
    rows = {
        "unsandboxed": lambda: (mpirun + ["-x", "OMPI_MCA_btl=self,vader", prog, str(iters)]),
        "pod": lambda: (mpirun + ["-x", "OMPI_MCA_btl=self,vader", "-x",
                                  f"GPUSANDBOX_POD=bench-{uuid.uuid4().hex[:8]}",
                                  gsbx, "run", "--share", "node", "--net", "host", image,
                                  "/pingpong", str(iters)]),
        "isolated (tcp)": lambda: (mpirun + ["-x", "OMPI_MCA_btl=self,tcp", gsbx, "run",
                                             "--share", "none", "--net", "host", image,
                                             "/pingpong", str(iters)]),
    }
    got = {name: [] for name in rows}
    for rep in range(reps):
        for name, argv in rows.items():
            log(f"pingpong {name} ({rep + 1}/{reps})")
            got[name].append(_pingpong(argv(), base, iters))
    res = {}
    for name, runs in got.items():
        res[name] = {str(size): {"lat_us": statistics.median(r[size][0] for r in runs),
                                 "mb_s": statistics.median(r[size][1] for r in runs)}
                     for size in runs[0]}
    return res


def _burst(gsbx, image, n, share):
    env = dict(os.environ, GPUSANDBOX_POD=f"burst-{uuid.uuid4().hex[:8]}")
    argv = [gsbx, "run", "--share", share, image, "/bin/true"]
    start = {}
    t0 = time.monotonic()
    for _ in range(n):
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        start[p.pid] = (time.monotonic(), p)
    walls, cpus, bad = [], [], 0
    while start:
        pid, status, ru = os.wait4(-1, 0)
        if pid not in start:
            continue
        began, p = start.pop(pid)
        p.returncode = os.waitstatus_to_exitcode(status)
        bad += p.returncode != 0
        walls.append((time.monotonic() - began) * 1000)
        cpus.append((ru.ru_utime + ru.ru_stime) * 1000)
    total = (time.monotonic() - t0) * 1000
    walls.sort()
    return {"n": n, "failed": bad, "p50_ms": statistics.median(walls),
            "p99_ms": walls[min(len(walls) - 1, int(len(walls) * 0.99))],
            "cpu_ms_per_rank": statistics.mean(cpus), "all_done_ms": total}


def burst_rows(gsbx, image, sizes, reps, log):
    res = []
    for n in sizes:
        for share in ("node", "none"):
            runs = []
            for rep in range(reps):
                log(f"burst of {n}, --share {share} ({rep + 1}/{reps})")
                runs.append(_burst(gsbx, image, n, share))
            med = {k: statistics.median(r[k] for r in runs)
                   for k in ("p50_ms", "p99_ms", "cpu_ms_per_rank", "all_done_ms")}
            med.update(n=n, share=share, failed=sum(r["failed"] for r in runs))
            res.append(med)
    return res


def print_tables(res, w=print):
    pp = res["pingpong"]
    ref = pp["unsandboxed"]
    w("\nMPI ping-pong, 2 ranks on one node (Open MPI, median of the rounds):")
    w("| ranks | 8 B latency | vs unsandboxed | 1 MiB bandwidth | vs unsandboxed |")
    w("|---|---|---|---|---|")
    for name, row in pp.items():
        lat, bw = row["8"]["lat_us"], row["1048576"]["mb_s"]
        w(f"| {name} | {lat:.2f} us | {lat / ref['8']['lat_us']:.2f}x | {bw:.0f} MB/s | "
          f"{ref['1048576']['mb_s'] / bw:.2f}x |")
    w("\nN ranks launched at once (/bin/true), per rank:")
    w("| N | mode | p50 wall | p99 wall | CPU | failed |")
    w("|---|---|---|---|---|---|")
    for b in res["burst"]:
        mode = "pod" if b["share"] == "node" else "isolated"
        w(f"| {b['n']} | {mode} | {b['p50_ms']:.0f} ms | {b['p99_ms']:.0f} ms | "
          f"{b['cpu_ms_per_rank']:.0f} ms | {b['failed']} |")


def run(gsbx, tmp, log, iters=2000, reps=3, sizes=(8, 32), burst_reps=3):
    for tool in (MPICC, MPIRUN):
        if not shutil.which(tool):
            raise RuntimeError(f"{tool} missing: apt-get install openmpi-bin libopenmpi-dev")
    prog, image = build(tmp)
    res = {"pingpong": pingpong_rows(gsbx, prog, image, iters, reps, log),
           "burst": burst_rows(gsbx, image, sizes, burst_reps, log)}
    print_tables(res)
    return res
