"""The image's environment and files never steer the host side (issue 17 items
1, 2, C, F, 8; issue 16 item 1), through the installed CLI, as root and as an
unprivileged user.

Every variable the launcher reads is set by an image, through /etc/environment
and through a bundle's config.json process.env; the sandbox the launcher
builds (its mount points, /dev, open descriptors) must be the same as for the
image without them.  Image files built to exhaust the launcher (ld.so.cache,
toolkit link fan-out) and files that used to crash it end in exit 0 or 125
with bounded memory and one error line."""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

LEAK_FD = 40
PROBE = ("import os, json\n"
         "m = sorted(l.split()[4] for l in open('/proc/self/mountinfo'))\n"
         "f = sorted(int(x) for x in os.listdir('/proc/self/fd'))\n"
         "names = ('PMIX_SERVER_TMPDIR', 'PMI_FD')\n"
         "print(json.dumps({'mounts': m, 'dev': sorted(os.listdir('/dev')), 'fds': f,\n"
         "                  'env': {k: os.environ.get(k) for k in names}}))\n")


@pytest.fixture
def canary():
    """Host directories an image must not reach: on /var/tmp (not the
    sandbox's own /tmp), readable by the test user, each with a secret."""
    d = Path(tempfile.mkdtemp(prefix="gsbx-env-canary-", dir="/var/tmp"))
    os.chmod(d, 0o755)
    for sub in ("a", "b"):
        (d / sub).mkdir()
        os.chmod(d / sub, 0o777)
        (d / sub / "secret").write_text("CANARY\n")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def image(base, rootfs, env=None, bundle=False, name="img"):
    """A hard-linked copy of rootfs (files shared, directories new: files
    that change are replaced, never written through) with the environment
    in /etc/environment, or as a bundle with it in config.json."""
    top = Path(base) / name
    root = top / "rootfs" if bundle else top
    root.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(root.parent, 0o755)
    subprocess.run(["cp", "-al", str(rootfs), str(root)], check=True)
    lines = [f"{k}={v}" for k, v in (env or {}).items()]
    envfile = root / "etc" / "environment"
    if envfile.exists():
        envfile.unlink()
    if bundle:
        (top / "config.json").write_text(json.dumps(
            {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
             "process": {"cwd": "/", "env": ["PATH=/usr/bin:/bin"] + lines}}))
    else:
        envfile.write_text("".join(line + "\n" for line in lines))
    return top


def replace_file(root, rel, data):
    p = Path(root) / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists() or p.is_symlink():
        p.unlink()
    p.write_bytes(data)
    os.chmod(p, 0o644)


def launch(runner, args, env=None, pass_fds=(), timeout=120):
    proc = runner.popen(list(args), env=env, pass_fds=pass_fds, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"launch did not finish: {err}")
    return proc.returncode, out, err


def leaked_dir_fd(path):
    """A directory descriptor at LEAK_FD, as a careless caller leaks one."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    os.dup2(fd, LEAK_FD, inheritable=True)
    os.close(fd)
    return LEAK_FD


def attack_env(canary, sim_root=None):
    """A value for every variable the launcher reads from its caller."""
    return {
        "PMIX_SERVER_TMPDIR": str(canary / "a"), "PMIX_SYSTEM_TMPDIR": str(canary / "b"),
        "PMI_FD": str(LEAK_FD),
        "NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0,1,2,3",
        "NVIDIA_DRIVER_CAPABILITIES": "all", "NVIDIA_MIG_CONFIG_DEVICES": "all",
        "NVIDIA_MIG_MONITOR_DEVICES": "all", "CUDA_MPS_PIPE_DIRECTORY": str(canary / "a"),
        "SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_GPUS": "0,1,2,3",
        "SLURM_JOB_GPUS": "0,1,2,3", "SLURM_GPUS_ON_NODE": "4",
        "SLURM_CONF": str(canary / "a" / "slurm.conf"), "SLURMD_NODENAME": "x",
        "XDG_CACHE_HOME": str(canary / "a"), "TERM": "evil",
        "GPUSANDBOX_TEST_PAUSE": "init",
    }


# --- every variable, both image sources, plain and GPU launches -----------------------

@pytest.mark.parametrize("bundle", [False, True], ids=["etc-environment", "config-json"])
@pytest.mark.parametrize("gpu", [False, True], ids=["plain", "gpu"])
def test_image_variables_change_nothing_on_the_host_side(runner, rootfs, sim_host, shared_tmp,
                                                         canary, bundle, gpu):
    evil = attack_env(canary)
    base = image(shared_tmp, rootfs, bundle=bundle, name="base")
    bad = image(shared_tmp, rootfs, evil, bundle=bundle, name="bad")
    opts = ["--driver-root", sim_host.root, "--gpus", "1"] if gpu else []
    fd = leaked_dir_fd(str(canary))
    try:
        views = []
        for img in (base, bad):
            rc, out, err = launch(runner, opts + [str(img), "python3", "-c", PROBE],
                                  pass_fds=(fd,))
            assert rc == 0, err
            views.append(json.loads(out))
        # Control: the same variable from the caller does bind its directory,
        # so the comparison below would see an image-made bind.
        rc, out, err = launch(runner, opts + [str(base), "python3", "-c", PROBE],
                              env={"PMIX_SERVER_TMPDIR": str(canary / "a")}, pass_fds=(fd,))
        assert rc == 0, err
        assert str(canary / "a") in json.loads(out)["mounts"]
    finally:
        os.close(fd)
    plain, attacked = views
    # The image's values did reach the command, as data ...
    assert attacked["env"] == {"PMIX_SERVER_TMPDIR": str(canary / "a"), "PMI_FD": str(LEAK_FD)}
    # ... and changed nothing the launcher chose.
    assert attacked["mounts"] == plain["mounts"]
    assert attacked["dev"] == plain["dev"]
    assert attacked["fds"] == plain["fds"] and LEAK_FD not in attacked["fds"]
    assert not any(str(canary) in m for m in attacked["mounts"])
    if gpu:
        assert {n for n in attacked["dev"] if n.startswith("nvidia") and n[6:].isdigit()} \
            == {"nvidia1"}


# --- PMI_FD: only the caller's, only a socket -------------------------------------------

@pytest.mark.parametrize("how", ["image", "bundle", "caller-dir"])
def test_pmi_fd_never_keeps_a_leaked_directory(runner, rootfs, shared_tmp, canary, how):
    env_img = {"PMI_FD": str(LEAK_FD)} if how != "caller-dir" else None
    img = image(shared_tmp, rootfs, env_img, bundle=(how == "bundle"))
    caller = {"PMI_FD": str(LEAK_FD)} if how == "caller-dir" else None
    fd = leaked_dir_fd(str(canary / "a"))
    script = (f"ls /proc/self/fd/; cat /proc/self/fd/{LEAK_FD}/secret; "
              f"ls /proc/self/fd/{LEAK_FD}/../; echo END")
    try:
        rc, out, err = launch(runner, [str(img), "sh", "-c", script], env=caller,
                              pass_fds=(fd,))
    finally:
        os.close(fd)
    assert rc == 0, err
    assert "END" in out
    assert str(LEAK_FD) not in out.split()
    assert "CANARY" not in out and canary.name not in out and "secret" not in out


def test_callers_pmi_fd_socket_is_kept(runner, rootfs, shared_tmp):
    img = image(shared_tmp, rootfs)
    a, b = socket.socketpair()
    os.dup2(a.fileno(), LEAK_FD, inheritable=True)
    try:
        rc, out, err = launch(runner, [str(img), "python3", "-c",
                                          f"import os; os.write({LEAK_FD}, b'hello\\n')"],
                              env={"PMI_FD": str(LEAK_FD)}, pass_fds=(LEAK_FD,))
        os.close(LEAK_FD)
        a.close()
        b.settimeout(10)
        assert rc == 0, err
        assert b.recv(100) == b"hello\n"
    finally:
        b.close()


# --- -e and --env-file count for the requirement check (issue 16 item 1) ------------------

@pytest.mark.parametrize("how", ["-e", "--env-file"])
def test_user_rows_decide_the_requirement_check(runner, rootfs, sim_host, shared_tmp, how):
    needs = image(shared_tmp, rootfs, {"NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}, name="needs")
    plain = image(shared_tmp, rootfs, name="plain")
    envfile = shared_tmp / "vars"

    def with_rows(img, *rows):
        if how == "-e":
            opts = [x for r in rows for x in ("-e", r)]
        else:
            envfile.write_text("".join(r + "\n" for r in rows))
            os.chmod(envfile, 0o644)
            opts = ["--env-file", str(envfile)]
        return launch(runner, ["--driver-root", sim_host.root, "--gpus", "0", *opts,
                               str(img), "true"])

    rc, out, err = with_rows(needs, "UNRELATED=1")           # the ceiling is 12.4: refused
    assert rc == 125 and "cuda>=12.8" in err, err
    rc, out, err = with_rows(needs, "NVIDIA_DISABLE_REQUIRE=true")
    assert rc == 0, err
    assert "warning" in err and "skipped" in err
    rc, out, err = with_rows(needs, "NVIDIA_REQUIRE_CUDA=cuda>=12.0")   # the caller's word wins
    assert rc == 0 and "warning" not in err, err
    rc, out, err = with_rows(plain, "NVIDIA_REQUIRE_CUDA=cuda>=99.0")
    assert rc == 125 and "cuda>=99.0" in err and "Traceback" not in err, err
    assert err.startswith("gpusandbox: error: ")


# --- bombs: bounded memory before any cgroup exists (C) ----------------------------------

MEASURE = ("import resource, subprocess, sys\n"
           # A safety net for the unfixed launcher, far above the assertion.
           "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
           "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
           "sys.stdout.write(r.stdout); sys.stderr.write(r.stderr)\n"
           "print('MAXRSS', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,"
           " file=sys.stderr)\n"
           "sys.exit(r.returncode)\n")


def measured(runner, args):
    """(rc, stderr, peak RSS in KiB of the launcher and its children)."""
    res = subprocess.run([sys.executable, "-c", MEASURE, *runner.argv(args)],
                         capture_output=True, text=True, timeout=300, env=runner.env(), cwd="/")
    lines = res.stderr.splitlines()
    peak = int(lines[-1].split()[1])
    return res.returncode, "\n".join(lines[:-1]), peak


def cache_bomb(nentries, strlen):
    ent = struct.Struct("<iIIIQ")
    off = 48 + nentries * ent.size
    table = ent.pack(0x0303, off, off, 0, 0) * nentries
    strings = b"L" * strlen + b"\0"
    return struct.pack("<20sIIB3xI12x", b"glibc-ld.so.cache1.1", nentries, len(strings), 2,
                       0) + table + strings


@pytest.mark.parametrize("nentries, strlen", [(60000, 4000), (8000, 64 << 10)])
def test_ld_so_cache_bomb(runner, rootfs, sim_host, shared_tmp, nentries, strlen):
    img = image(shared_tmp, rootfs)
    replace_file(img, "etc/ld.so.cache", cache_bomb(nentries, strlen))
    rc, err, peak = measured(runner, ["--driver-root", sim_host.root, "--gpus", "0",
                                      str(img), "true"])
    assert rc in (0, 125), err
    assert "Traceback" not in err
    assert peak < 300 << 10, f"{peak} KiB"


def test_toolkit_link_fan_out_bomb(runner, rootfs, sim_host, shared_tmp):
    img = image(shared_tmp, rootfs)
    lib = img / "opt" / "one" / "lib64"
    lib.mkdir(parents=True)
    for k in range(2000):
        (lib / f"libcudart.so.12.{k}").touch()
    (img / "usr" / "local").mkdir(parents=True, exist_ok=True)
    for n in range(2000):
        os.symlink("/opt/one", img / "usr" / "local" / f"cuda-{n}")
    rc, err, peak = measured(runner, ["--driver-root", sim_host.root, "--gpus", "0",
                                      str(img), "true"])
    assert rc in (0, 125), err
    assert "Traceback" not in err
    assert peak < 300 << 10, f"{peak} KiB"


# --- image content that used to crash the launcher (F) ------------------------------------

def _one_error_line(rc, err):
    assert rc == 125, err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[0].startswith("gpusandbox: error: ")
    assert len(lines) <= 2 and all(ln.startswith(("gpusandbox: error: ", "hint: "))
                                   for ln in lines), err


@pytest.mark.parametrize("config", [b'{"process": {"env": 5}}', b"[" * 100000,
                                    b'{"process": {"cwd": 5}}'],
                         ids=["env-5", "deep", "cwd-5"])
def test_bad_bundle_is_one_error_line(runner, rootfs, shared_tmp, config):
    img = image(shared_tmp, rootfs, bundle=True)
    (img / "config.json").write_bytes(config)
    rc, out, err = launch(runner, [str(img), "true"])
    _one_error_line(rc, err)
    rc, out, err = launch(runner, ["doctor", "--json", str(img)])
    assert "Traceback" not in err and rc in (0, 1), err
    checks = {(c["section"], c["name"]): c for c in json.loads(out)["checks"]}
    assert checks[("image", "rootfs")]["status"] == "fail"


@pytest.mark.parametrize("value", ["12.²", "1" * 5000 + ".0"], ids=["unicode-digit", "5000-digits"])
def test_bad_cuda_version_is_one_error_line(runner, rootfs, sim_host, shared_tmp, value):
    img = image(shared_tmp, rootfs, {"CUDA_VERSION": value})
    rc, out, err = launch(runner, ["--driver-root", sim_host.root, "--gpus", "0", str(img),
                                   "true"])
    _one_error_line(rc, err)


def test_odd_library_names_and_version_json_types_are_ignored(runner, rootfs, sim_host,
                                                               shared_tmp):
    img = image(shared_tmp, rootfs)
    replace_file(img, "usr/lib/x86_64-linux-gnu/libcudart.so.1².0", b"")
    replace_file(img, "usr/local/cuda/version.json", b'{"cuda": {"version": 12.4}}')
    rc, out, err = launch(runner, ["--driver-root", sim_host.root, "--gpus", "0", str(img),
                                   "true"])
    assert rc == 0 and "Traceback" not in err, err


# --- the CUDA ceiling, cached per driver (item 8) -------------------------------------------

@pytest.fixture
def own_sim(cli):
    """A private one-GPU simulated host whose libcuda the test may break."""
    base = Path(tempfile.mkdtemp(prefix="gsbx-env-sim-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    subprocess.run([cli, "sim", "create", str(base / "host"), "--gpus", "1"], check=True,
                   capture_output=True)
    yield base / "host"
    subprocess.run([cli, "sim", "destroy", str(base / "host")], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def test_ceiling_comes_from_the_cache_once_known(runner, rootfs, own_sim, shared_tmp):
    cache = shared_tmp / "cache"
    cache.mkdir()
    os.chown(cache, runner.uid, runner.gid)
    env = {"XDG_CACHE_HOME": str(cache)}
    ok = image(shared_tmp, rootfs, {"NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, name="ok")
    new = image(shared_tmp, rootfs, {"NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}, name="new")
    args = ["--driver-root", str(own_sim), "--gpus", "0"]
    rc, out, err = launch(runner, args + [str(ok), "true"], env=env)
    assert rc == 0 and "warning" not in err, err
    entries = list((cache / "gpusandbox" / "ceiling").iterdir())
    assert len(entries) == 1 and entries[0].stat().st_uid == runner.uid
    # Make the host libcuda unloadable without changing what the key records
    # (same inode, size and mtime): only the cache can still answer.
    libcuda = next(p for p in own_sim.rglob("libcuda.so.*") if p.is_file() and not p.is_symlink())
    st = libcuda.stat()
    with open(libcuda, "r+b") as f:
        f.write(b"\0" * st.st_size)
    os.utime(libcuda, ns=(st.st_atime_ns, st.st_mtime_ns))
    rc, out, err = launch(runner, args + [str(ok), "true"], env=env)
    assert rc == 0 and "warning" not in err, err
    rc, out, err = launch(runner, args + [str(new), "true"], env=env)
    assert rc == 125 and "up to 12.4" in err, err
