"""CLI fuzzer: 10,000 mutations of valid command lines through the real entry
point (tests/integration/fuzz_harness.py forks one child per case from a
process that imported the installed CLI), as root and as the test user.

Mutations: an option dropped, doubled, or cut short; a value (or the image,
or a command word) replaced by an empty, huge, binary, path-traversing or
non-UTF-8 string; the line truncated.  Every case must exit 0, 125, 126,
127 or the command's status; print at most one `gpusandbox: error:` line,
followed by at most a `hint:` line; never a traceback.  Afterwards the
leftover audit of scripts/soak finds nothing.  The RNG is seeded
(GSBX_FUZZ_SEED, else fixed); a failure prints the seed and the argv.
"""
import importlib.machinery
import importlib.util
import json
import os
import random
import shutil
import subprocess
import tempfile
import time

import pytest

from .conftest import REPO, VENV

pytestmark = pytest.mark.root

V1_OWN = [f"/sys/fs/cgroup/{c}/gsbx-test-fuzz-{os.getpid()}" for c in ("memory", "pids", "cpu")
          if os.path.isfile(f"/sys/fs/cgroup/{c}/cgroup.procs")]
CASES = int(os.environ.get("GSBX_FUZZ_CASES", "10000"))
SEED = int(os.environ.get("GSBX_FUZZ_SEED", "16016"))
HARNESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_harness.py")


def _soak():
    loader = importlib.machinery.SourceFileLoader("soak_script", str(REPO / "scripts" / "soak"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def bases(rootfs, sim, token, work):
    """Valid command lines: (argv, roles, statuses it may end with when only
    options are mutated).  roles: 'opt', 'val', 'image', 'cmd', 'sub'."""
    envfile = os.path.join(work, "env")
    img, cmd0, cmd3 = [rootfs], ["true", token], ["sh", "-c", "exit 3", token]
    out = []

    def run(opts, cmd):
        argv, roles = ["run"], ["sub"]
        for o in opts:
            argv += o
            roles += ["opt"] + ["val"] * (len(o) - 1)
        argv += img + cmd
        roles += ["image"] + ["cmd"] * len(cmd)
        out.append((argv, roles))

    run([], cmd0)
    run([["--gpus", "0"], ["--driver-root", sim]], cmd0)
    run([["--driver-root", sim], ["--gpus", "all"], ["--gpu-caps", "utility,compute"],
         ["--no-require"]], cmd3)
    run([["-e", "A=1"], ["--env", "B"], ["--env-file", envfile], ["-w", "/tmp"],
         ["--hostname", "fz"]], cmd3)
    run([["-v", f"{work}:/mnt:ro"], ["--bind", "/etc/hostname:/h"], ["--writable-tmpfs"]], cmd0)
    run([["--userns", "auto"], ["--seccomp", "default"], ["--verbose"]], cmd0)
    run([["--memory", "256m"], ["--pids-limit", "64"], ["--cpus", "1.5"],
         ["--best-effort-limits"]], cmd0)
    run([["--device", "/dev/null:/dev/fz"], ["--root"], ["--dev-root", "/dev"]], cmd3)
    run([["--user", "1000:1000"], ["--seccomp", "unconfined"], ["--", ]], cmd0)
    # docker's spellings (tests/integration/test_cli_docker.py)
    run([["-it"], ["--rm"], ["--mount", f"type=bind,src={work},dst=/mnt,ro"],
         ["--mount", "type=tmpfs,dst=/scratch,tmpfs-size=1m,tmpfs-mode=1777"], ["-v", work]], cmd0)
    run([["--driver-root", sim], ["--gpus", "count=2"], ["-w/tmp"], ["-u", "0:0"]], cmd3)
    run([["--driver-root", sim], ["--gpus", '"device=0,1"']], cmd0)
    for argv in (["info", "--driver-root", sim], ["info", "--driver-root", sim, "--json"],
                 ["list", "--driver-root", sim, "--gpus", "0,1", "--gpu-caps", "all"],
                 ["version"]):
        roles = ["sub"] + ["opt" if a.startswith("-") else "val" for a in argv[1:]]
        out.append((argv, roles))
    return out


def _huge(r):
    return "x" * r.choice([4096, 65536, 131072])


def _binary(r):
    # Everything but NUL (execve cannot pass one), as argv decoding gives it.
    return bytes(r.randrange(1, 256) for _ in range(r.randrange(1, 40))).decode(
        "utf-8", "surrogateescape")


NASTY = [
    lambda r: "",
    _huge,
    _binary,
    lambda r: r.choice(["../../../../etc/shadow", "/../../..", "..", "../", "/proc/self/root",
                        "/dev/../etc", "a/../../b:/c:ro", "/tmp/../../:/..", "//"]),
    lambda r: b"\xff\xfe\xc3(".decode("utf-8", "surrogateescape"),
    lambda r: r.choice(["-", "--", "-1", "=", ":", "::", "0", "all,none", "999999999999999999999",
                        "nan", "inf", "1e309", "GPU-", "MIG-", " ", "\t\n", "%s%n", "${HOME}"]),
]


def mutate(r, argv, roles):
    argv, roles = list(argv), list(roles)
    touched = set()
    # Mostly several mutations: most cases then fail at parse or plan time
    # (fast) and a quarter still launch for real.
    for _ in range(r.choice([1, 2, 2, 3])):
        op = r.choice(["drop", "double", "cut", "replace", "replace", "replace", "truncate"])
        if len(argv) < 2:
            break
        i = r.randrange(1, len(argv))
        if op == "drop":
            touched.add("shift")
            del argv[i], roles[i]
        elif op == "double":
            argv.insert(i, argv[i])
            roles.insert(i, roles[i])
            touched.add("shift" if roles[i] in ("image", "cmd") else roles[i])
        elif op == "cut":
            argv[i] = argv[i][:r.randrange(0, max(1, len(argv[i])))]
            touched.add(roles[i] if roles[i] != "opt" else "shift")
        elif op == "replace":
            argv[i] = r.choice(NASTY)(r)
            touched.add(roles[i] if roles[i] != "opt" else "shift")
        else:
            touched.add("shift")
            del argv[i:], roles[i:]
    return argv, touched


def check(argv, touched, code, err):
    """Problems with one case's outcome (empty when it behaved)."""
    problems = []
    lines = err.splitlines()
    if "Traceback (most recent call last)" in err:
        problems.append("traceback")
    errors = [n for n, ln in enumerate(lines) if ln.startswith("gpusandbox: error:")]
    if len(errors) > 1:
        problems.append(f"{len(errors)} error lines")
    if errors:
        tail = lines[errors[0] + 1:]
        if len(tail) > 1 or (tail and not tail[0].startswith("hint: ")):
            problems.append(f"lines after the error: {tail[:3]}")
        if any(not ln.startswith("gpusandbox: ") for ln in lines[:errors[0]]):
            problems.append("unprefixed lines before the error")
    command_may_run = argv and argv[0] == "run" and touched & {"cmd", "image", "shift"}
    if code in (125,):
        if len(errors) != 1 and not command_may_run:
            problems.append("exit 125 without one error line")
    elif code in (0, 126, 127):
        pass
    elif command_may_run:
        if errors:
            problems.append(f"exit {code} with a gpusandbox error line")
    elif not (argv and argv[0] == "run" and code == 3):
        problems.append(f"exit {code}")
    return problems


@pytest.fixture
def fuzz_env(rootfs, sim_host, test_user):
    # Root's limits go to v1 leaves under the launcher's own v1 cgroups on a
    # hybrid host: the root harness runs in cgroups of the test's (V1_OWN).
    for d in V1_OWN:
        os.mkdir(d)
    work = tempfile.mkdtemp(prefix="gsbx-test-fuzz-")
    os.chmod(work, 0o755)
    with open(os.path.join(work, "env"), "w") as f:
        f.write("FZ=1\n")
    shutil.copy(HARNESS, os.path.join(work, "fuzz_harness.py"))
    tmp = os.path.join(work, "tmp")
    os.mkdir(tmp)
    os.chmod(tmp, 0o1777)
    yield work
    shutil.rmtree(work, ignore_errors=True)
    for d in V1_OWN:
        os.rmdir(d)


def _start_harness(work, cases, as_user, user, tag):
    cpath = os.path.join(work, f"cases-{tag}.json")
    rpath = os.path.join(work, f"results-{tag}.json")
    with open(cpath, "w") as f:
        json.dump(cases, f)
    os.chmod(cpath, 0o644)
    os.chmod(work, 0o777)
    cmd = [str(VENV / "bin" / "python"), os.path.join(work, "fuzz_harness.py"), cpath, rpath]
    if not as_user and V1_OWN:
        cmd = ["sh", "-c", 'for d in "$@"; do [ "$d" = -- ] && shift && break; '
               'echo $$ > "$d/cgroup.procs"; shift; done; exec "$@"', "sh", *V1_OWN, "--"] + cmd
    if as_user:
        cmd = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
               "--"] + cmd
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8",
           "HOME": "/", "TMPDIR": os.path.join(work, "tmp")}
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, cwd="/"), rpath


def _finish_harness(p, rpath):
    err = p.communicate(timeout=3000)[1]
    assert p.returncode == 0, err[-3000:]
    with open(rpath) as f:
        return json.load(f)


def test_fuzz_cli(rootfs, sim_host, test_user, fuzz_env, cli):
    soak = _soak()
    work = fuzz_env
    token = f"{SEED}.{os.getpid()}"
    r = random.Random(SEED)
    base = bases(str(rootfs), str(sim_host), token, work)
    cases = []
    for _ in range(CASES):
        argv, roles = r.choice(base)
        cases.append((*mutate(r, argv, roles), r.random() < 0.5))
    before = {"mounts": soak.mount_points(), "bpf": soak.device_programs()}
    t0 = time.monotonic()
    results = {}
    # Root and rootless harnesses side by side (one per core).
    runs = []
    for as_user in (False, True):
        idx = [i for i, c in enumerate(cases) if c[2] == as_user]
        runs.append((idx, _start_harness(work, [cases[i][0] for i in idx], as_user, test_user,
                                         "user" if as_user else "root")))
    for idx, (p, rpath) in runs:
        results.update(zip(idx, _finish_harness(p, rpath)))
    elapsed = time.monotonic() - t0
    failures = []
    launchers = set()
    for i, (argv, touched, as_user) in enumerate(cases):
        code, err, pid = results[i]
        launchers.add(pid)
        for prob in check(argv, touched, code, err):
            failures.append(f"case {i} ({'rootless' if as_user else 'root'}) {prob}: "
                            f"argv={[a[:80] for a in argv]!r} exit={code} stderr={err[:600]!r}")
    codes = {}
    for code, _, _ in results.values():
        codes[code] = codes.get(code, 0) + 1
    print(f"fuzz: seed {SEED}, {CASES} cases in {elapsed:.1f} s, exit codes {sorted(codes.items())}, "
          f"{len(failures)} failing")
    assert not failures, f"seed {SEED}: {len(failures)} failing cases; first:\n" + \
        "\n".join(failures[:15])
    # Leftovers, scoped as scripts/soak scopes them.
    end = time.monotonic() + 10
    while True:
        left = {"mounts": sorted(soak.mount_points() - before["mounts"]),
                "cgroups": sorted(soak.leaves(launchers)),
                "processes": soak.pids_with(token),
                "tempfiles": os.listdir(os.path.join(work, "tmp"))}
        progs = soak.device_programs() - before["bpf"]
        left["bpf"] = sorted(progs - soak.foreign_attached(set(left["cgroups"])))
        if not any(left.values()) or time.monotonic() > end:
            break
        time.sleep(0.2)
    assert not any(left.values()), left
