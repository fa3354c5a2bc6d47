"""cgroup v1 controllers (issue 25): `run --memory/--pids-limit/--cpus`, the
OCI runtime's linux.resources and `update`, on this hybrid host and in a pure
cgroup v1 layout made in a private mount namespace; the limits read back
from the v1 files on the host and from the container's own /sys/fs/cgroup,
and every leaf gone after exit or delete.

Every launch runs with a parent cgroup the test makes in each hierarchy
(`--cgroup-parent`, or for the OCI runtime, which puts its leaves under its
caller's cgroups, a caller moved there first): nothing is made under the
cgroups this machine's own processes sit in.
"""
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from . import nsrun
from .conftest import VENV, wait_for

TOP = "/sys/fs/cgroup"
OCI = str(VENV / "bin" / "gpusandbox-oci")
V1 = ("memory", "pids", "cpu", "cpuset", "blkio", "devices")


def _v1_mounted(ctl):
    with open("/proc/self/mountinfo") as f:
        return any(f" {TOP}/{ctl} " in ln and " - cgroup " in ln for ln in f)


pytestmark = pytest.mark.skipif(
    not all(_v1_mounted(c) for c in ("memory", "pids", "cpu")),
    reason="needs the memory, pids and cpu controllers on cgroup v1 at /sys/fs/cgroup/<name>")


@pytest.fixture
def parent(cli):
    """/gsbx-test-v1-<rand> in every v1 hierarchy used here and in cgroup2
    (cpuset given its root's cpus and mems, as a new v1 cpuset is empty);
    removed at the end, after checking no leaf was left in it."""
    name = f"gsbx-test-v1-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    dirs = [f"{TOP}/{c}/{name}" for c in V1 if _v1_mounted(c)]
    if nsrun.cgroup2_mount():
        dirs.append(f"{nsrun.cgroup2_mount()}/{name}")
    for d in dirs:
        os.mkdir(d)
    for f in ("cpuset.cpus", "cpuset.mems"):
        if os.path.exists(f"{TOP}/cpuset/{name}/{f}"):
            Path(f"{TOP}/cpuset/{name}/{f}").write_text(Path(f"{TOP}/cpuset/{f}").read_text())
    yield name
    left = [f"{d}/{n}" for d in dirs for n in os.listdir(d) if n.startswith(LEAVES)]
    for d in dirs:
        for sub in sorted((t for t, _, _ in os.walk(d)), key=len, reverse=True):
            try:
                os.rmdir(sub)
            except OSError:
                pass
    assert left == [], f"cgroups left behind: {left}"


def _in_parent(name, argv):
    """argv run by a shell that first moves itself into `name` in every
    hierarchy (the OCI runtime makes its leaves under its caller's)."""
    return ["sh", "-c", f'for d in {TOP}/*/{name}; do echo $$ > "$d/cgroup.procs"; done; '
            'exec "$@"', "sh", *argv]


# Leaves: `run`'s, named by gpusandbox; the OCI runtime's, at the config's
# cgroupsPath (/PARENT/CID here, as runc and crun place them).
LEAVES = ("gpusandbox", "gsbx-v1-", "gsbx-v1p-")


def _leaf_files(name, ctl):
    """{file: value} of the one leaf under `name` in `ctl`."""
    base = f"{TOP}/{ctl}/{name}"
    leaves = [n for n in os.listdir(base) if n.startswith(LEAVES)]
    assert len(leaves) == 1, leaves
    return lambda f: Path(f"{base}/{leaves[0]}/{f}").read_text().strip()


SHOW = ("cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max "
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us; ls /sys/fs/cgroup")


def test_run_limits_in_v1_hierarchies(cli, rootfs, parent):
    r = subprocess.run([cli, "run", "--cgroup-parent", f"/{parent}", "--memory", "64m",
                        "--memory-swap", "128m", "--pids-limit", "20", "--cpus", "0.5",
                        str(rootfs), "sh", "-c", SHOW], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert out[:3] == [str(64 << 20), "20", "50000"]
    # Its own v1 view: only the hierarchies it has a leaf in, and cgroup2 beside them.
    assert set(out[3:]) == {"memory", "pids", "cpu", "unified"} - (
        set() if nsrun.cgroup2_mount() else {"unified"})


def test_run_pids_limit_holds(cli, rootfs, parent):
    fork = ("import os, time\n"
            "n = 0\n"
            "try:\n"
            "    while n < 50:\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(2); os._exit(0)\n"
            "        n += 1\n"
            "except BlockingIOError:\n"
            "    print('EAGAIN', n)\n"
            "print(open('/sys/fs/cgroup/pids/pids.events').read())\n")
    r = subprocess.run([cli, "run", "--cgroup-parent", f"/{parent}", "--pids-limit", "5",
                        str(rootfs), "python3", "-c", fork],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert out[0] == "EAGAIN" and int(out[1]) < 5 and out[2] == "max" and int(out[3]) > 0, \
        r.stdout


def test_launcher_killed_leaves_no_v1_leaf(cli, rootfs, parent):
    """kill -9 of the launcher: its reaper removes the v1 leaves too."""
    marker = f"77.{os.getpid()}"
    p = subprocess.Popen([cli, "run", "--cgroup-parent", f"/{parent}", "--memory", "64m",
                          "--pids-limit", "20", str(rootfs), "sleep", marker],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        mine = lambda c: [n for n in os.listdir(f"{TOP}/{c}/{parent}") if n.startswith("gpusandbox")]
        assert wait_for(lambda: mine("memory") and mine("pids")
                        and Path(f"{TOP}/pids/{parent}/{mine('pids')[0]}/cgroup.procs")
                        .read_text().strip())
    finally:
        p.kill()
        p.wait()
    assert wait_for(lambda: not mine("memory") and not mine("pids"), timeout=30), \
        (mine("memory"), mine("pids"))


def _bundle(tmp, rootfs, resources, args=("sleep", "60"), cgroups_path=None):
    b = Path(tmp)
    b.mkdir()
    subprocess.run([OCI, "spec", "--bundle", str(b)], check=True)
    conf = json.loads((b / "config.json").read_text())
    conf["root"]["path"] = str(rootfs)
    conf["process"].update(args=list(args), terminal=False)
    conf["linux"]["resources"] = resources
    if cgroups_path:
        conf["linux"]["cgroupsPath"] = cgroups_path
    (b / "config.json").write_text(json.dumps(conf))
    return str(b)


RESOURCES = {"memory": {"limit": 64 << 20, "swap": 128 << 20, "reservation": 32 << 20},
             "pids": {"limit": 30}, "cpu": {"quota": 50000, "period": 100000, "shares": 512}}


def _oci(state_root, *args, stdin=None, wrap=None):
    argv = [OCI, "--root", state_root, *args]
    if args[0] == "create":
        # The container's stdio is create's: a pipe here would stay open
        # until the container ends.
        with tempfile.TemporaryFile("w+") as err:
            r = subprocess.run(wrap(argv) if wrap else argv, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=err, text=True, timeout=60)
            err.seek(0)
            r.stderr = err.read()
        return r
    return subprocess.run(wrap(argv) if wrap else argv, capture_output=True, text=True,
                          input=stdin, timeout=60)


def test_runtime_create_update_delete(cli, rootfs, parent, tmp_path):
    st = str(tmp_path / "state")
    cid = f"gsbx-v1-{uuid.uuid4().hex[:8]}"
    # The v1 leaves are at cgroupsPath (runc's cgroupfs placement);
    # the cgroup2 leaf goes under the caller's cgroup, as before.
    b = _bundle(tmp_path / "b", rootfs, RESOURCES, cgroups_path=f"/{parent}/{cid}")
    r = _oci(st, "create", "--bundle", b, cid, wrap=lambda a: _in_parent(parent, a))
    assert r.returncode == 0, r.stderr
    try:
        assert _oci(st, "start", cid).returncode == 0
        # Its own view: every v1 hierarchy of a limit controller this host has
        # (limited or not: `update` may set them), cgroup2 at unified.
        r = _oci(st, "exec", cid, "ls", "/sys/fs/cgroup")
        assert {"memory", "pids", "cpu", "cpuset"} <= set(r.stdout.split()), r.stderr
        mem, pids, cpu = (_leaf_files(parent, c) for c in ("memory", "pids", "cpu"))
        assert (mem("memory.limit_in_bytes"), mem("memory.memsw.limit_in_bytes"),
                mem("memory.soft_limit_in_bytes")) == (str(64 << 20), str(128 << 20),
                                                       str(32 << 20))
        assert (pids("pids.max"), cpu("cpu.cfs_quota_us"), cpu("cpu.shares")) == \
            ("30", "50000", "512")
        # runc's flags (raising memory above the old swap limit: order handled)...
        r = _oci(st, "update", "--memory", "256m", "--memory-swap", "512m", "--pids-limit",
                 "40", "--cpu-quota", "20000", "--cpu-shares", "1024", cid)
        assert r.returncode == 0, r.stderr
        assert (mem("memory.limit_in_bytes"), mem("memory.memsw.limit_in_bytes"),
                pids("pids.max"), cpu("cpu.cfs_quota_us"), cpu("cpu.shares")) == \
            (str(256 << 20), str(512 << 20), "40", "20000", "1024")
        # ...and -r - (what podman sends), read inside the container too.
        r = _oci(st, "update", "-r", "-", cid, stdin=json.dumps(
            {"memory": {"limit": 96 << 20}, "pids": {"limit": 50}}))
        assert r.returncode == 0, r.stderr
        r = _oci(st, "exec", cid, "cat", "/sys/fs/cgroup/pids/pids.max",
                 "/sys/fs/cgroup/memory/memory.limit_in_bytes")
        assert r.stdout.split() == ["50", str(96 << 20)], r.stderr
        # A controller the config did not limit: its leaf is there already.
        r = _oci(st, "update", "--cpuset-cpus", "0", cid)
        assert r.returncode == 0, r.stderr
        cpuset = _leaf_files(parent, "cpuset")
        assert cpuset("cpuset.cpus") == "0" and cpuset("cgroup.procs").split() == \
            [str(json.loads(_oci(st, "state", cid).stdout)["pid"])]
        # Bad values: one line (and its hint), exit 1, nothing changed.
        for args, needle in ((["--pids-limit", "abc"], "--pids-limit abc: not a positive number"),
                             (["--memory", "1k"], "--memory 1k: below the 6 MiB minimum"),
                             (["--kernel-memory", "9"], "update --kernel-memory: not supported"),
                             (["--cpu-shares", "1"], "--cpu-shares 1: out of range")):
            r = _oci(st, "update", *args, cid)
            assert r.returncode == 1 and r.stderr.startswith(f"gpusandbox: error: {needle}"), \
                r.stderr
            assert len(r.stderr.splitlines()) == 2 and r.stderr.splitlines()[1].startswith("hint:")
        r = _oci(st, "update", "-r", "-", cid, stdin='{"pids": {"limit": "x"}}')
        assert r.returncode == 1 and "pids.limit: not an integer" in r.stderr
        assert pids("pids.max") == "50"
        # Stopped, then a plain `delete` through the shell entry: the v1 leaves
        # make it hand over to Python, which removes them all.
        assert _oci(st, "kill", cid, "KILL").returncode == 0
        assert wait_for(lambda: json.loads(_oci(st, "state", cid).stdout)["status"] == "stopped")
        r = _oci(st, "update", "--pids-limit", "9", cid)
        assert r.returncode == 1 and "not running" in r.stderr
        r = _oci(st, "delete", cid)
    finally:
        if os.path.exists(f"{st}/{cid}"):
            r = _oci(st, "delete", "--force", cid)
    assert r.returncode == 0, r.stderr
    # (the fixture checks that no leaf is left under the parent)


@pytest.fixture
def pure_v1(parent, tmp_path):
    """A wrapper putting argv in a private mount namespace whose
    /sys/fs/cgroup is a tmpfs with v1 hierarchies only (no cgroup2)."""
    top = nsrun.scratch_dir("v1")
    ctls = [c for c in V1 if _v1_mounted(c)]
    # Each hierarchy mounted at the scratch directory first (the same one as
    # the host's: a v1 mount with the same controllers), then the host's
    # /sys/fs/cgroup goes (lazily: only from this namespace) and the tmpfs
    # takes its place.
    script = "\n".join([f"mount -t tmpfs -o mode=755 none {top}"] +
                       [f"mkdir {top}/{c} && mount -t cgroup -o {c} none {top}/{c}" for c in ctls] +
                       [f"umount --lazy --recursive {TOP}", f"mount --move {top} {TOP}"])
    yield lambda argv: nsrun.private_mounts(argv, script)
    os.rmdir(top)


def test_pure_v1_layout_run_and_runtime(cli, rootfs, parent, pure_v1, tmp_path):
    r = subprocess.run(pure_v1([cli, "run", "--cgroup-parent", f"/{parent}", "--memory", "64m",
                                "--pids-limit", "20", "--cpus", "0.5", str(rootfs), "sh", "-c",
                                SHOW]),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(64 << 20), "20", "50000", "cpu", "memory", "pids"]
    st = str(tmp_path / "state")
    cid = f"gsbx-v1p-{uuid.uuid4().hex[:8]}"
    b = _bundle(tmp_path / "b", rootfs, RESOURCES, cgroups_path=f"/{parent}/{cid}")
    r = _oci(st, "create", "--bundle", b, cid, wrap=lambda a: pure_v1(_in_parent(parent, a)))
    assert r.returncode == 0, r.stderr
    try:
        state = json.loads(Path(st, cid, "state.json").read_text())
        assert state["cgroup_version"] == 1 and "/devices/" in state["cgroup"]
        r = subprocess.run(pure_v1([OCI, "--root", st, "update", "--pids-limit", "70", cid]),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert _leaf_files(parent, "pids")("pids.max") == "70"
        assert _leaf_files(parent, "memory")("memory.limit_in_bytes") == str(64 << 20)
    finally:
        r = subprocess.run(pure_v1([OCI, "--root", st, "delete", "--force", cid]),
                           capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not shutil.which("podman") or not shutil.which("conmon"),
                    reason="podman and conmon are not installed")
def test_podman_limits_and_update(cli, rootfs, tmp_path):
    """Root podman (cgroupfs manager: cgroupsPath /libpod_parent/libpod-ID, so
    the v1 leaves go under /libpod_parent): --memory, --pids-limit, --cpus applied, `podman
    update` changes them, nothing left after rm.  Rootless podman refuses
    limits on cgroup v1 itself (no delegation), before any runtime runs."""
    # podman wants a runroot path of at most 50 characters.
    home = Path(tempfile.mkdtemp(prefix="gsbx-v1p-", dir="/tmp"))
    tar = home / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
    pm = ["podman", "--root", f"{home}/storage", "--runroot", f"{home}/rr", "--tmpdir",
          f"{home}/tmp", "--runtime", OCI]
    image = f"localhost/gsbx-v1-{os.getpid()}:1"

    def podman(*args):
        return subprocess.run(pm + list(args), capture_output=True, text=True, timeout=120,
                              stdin=subprocess.DEVNULL, cwd="/")

    assert podman("import", str(tar), image).returncode == 0
    try:
        r = podman("run", "-d", "--network", "none", "--ulimit", "nofile=1024:1024",
                   "--ulimit", "nproc=1024:1024", "--memory", "64m", "--pids-limit", "20",
                   "--cpus", "0.5", image, "sleep", "60")
        assert r.returncode == 0, r.stderr
        cid = r.stdout.strip()
        state = json.loads(Path(f"/run/gpusandbox-oci/{cid}/state.json").read_text())
        leaves = state["cgroup_v1"]
        # At the config's cgroupsPath, as runc's and crun's.
        assert leaves and all(os.path.isdir(p) and p.endswith(f"/libpod_parent/libpod-{cid}")
                              for p in leaves), leaves
        show = ("cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "/sys/fs/cgroup/pids/pids.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
        r = podman("exec", cid, *show)
        assert r.stdout.split() == [str(64 << 20), "20", "50000"], r.stderr
        # podman 4.3's update has no --pids-limit.
        r = podman("update", "--memory", "128m", "--cpus", "0.25", "--cpuset-cpus", "0", cid)
        assert r.returncode == 0, r.stderr
        r = podman("exec", cid, *show)
        assert r.stdout.split() == [str(128 << 20), "20", "25000"], r.stderr
        # cpuset was not limited at create: its leaf was made anyway.
        state = json.loads(Path(f"/run/gpusandbox-oci/{cid}/state.json").read_text())
        leaves = state["cgroup_v1"]
        cs = [p for p in leaves if p.startswith(f"{TOP}/cpuset/")]
        assert len(cs) == 1 and Path(f"{cs[0]}/cpuset.cpus").read_text().strip() == "0"
        assert podman("rm", "-f", cid).returncode == 0
        assert [p for p in leaves + [state["cgroup"]] if os.path.exists(p)] == []
    finally:
        podman("rm", "-fa")
        podman("rmi", "-f", image)
        podman("system", "reset", "--force")
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.skipif(not shutil.which("podman") or not shutil.which("conmon"),
                    reason="podman and conmon are not installed")
def test_podman_in_pure_v1_layout(cli, rootfs, pure_v1):
    """Root podman in the pure v1 layout (its own /sys/fs/cgroup with no
    cgroup2: podman, conmon and gpusandbox-oci all see v1 only): --memory
    and --pids-limit applied, `podman update` changes them, --uidmap maps
    the container's root to host 100000 with its limits in place, and
    nothing is left after rm.  One script in one namespace: the overlay
    mounts podman makes there are not seen outside."""
    home = Path(tempfile.mkdtemp(prefix="gsbx-v1q-", dir="/tmp"))
    tar = home / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
    image = f"localhost/gsbx-v1q-{os.getpid()}:1"
    pm = (f"podman --root {home}/storage --runroot {home}/rr --tmpdir {home}/tmp "
          f"--runtime {OCI}")
    run = "--network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024"
    show = ("cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max "
            "/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
    script = f"""
P="{pm}"
trap '$P rm -fa >/dev/null 2>&1; $P rmi -f {image} >/dev/null 2>&1; $P system reset --force >/dev/null 2>&1' EXIT
$P import {tar} {image} >/dev/null
stat -f -c 'top %T' /sys/fs/cgroup
cid=$($P run -d {run} --memory 64m --pids-limit 20 --cpus 0.5 {image} sleep 60)
echo "cid $cid"
echo "made $(echo $($P exec $cid {show}))"
$P update --memory 128m --cpus 0.25 $cid
echo "updated $(echo $($P exec $cid {show}))"
$P rm -f $cid >/dev/null
echo "mapped $(echo $($P run --rm {run} --memory 32m --pids-limit 30 --uidmap 0:100000:5000 \\
    --gidmap 0:100000:5000 {image} sh -c 'id -u; cat /proc/self/uid_map; {show}; \\
    touch /tmp/x && echo wrote'))"
"""
    try:
        r = subprocess.run(pure_v1(["sh", "-ec", script]), capture_output=True, text=True,
                           timeout=300, stdin=subprocess.DEVNULL, cwd="/")
        assert r.returncode == 0, r.stderr
        out = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in r.stdout.splitlines()
               if " " in ln}
        assert out["top"] == "tmpfs"
        assert out["made"].split() == [str(64 << 20), "20", "50000"], r.stdout
        assert out["updated"].split() == [str(128 << 20), "20", "25000"], r.stdout
        assert out["mapped"].split() == ["0", "0", "100000", "5000", str(32 << 20), "30",
                                         "-1", "wrote"], r.stdout
        cid = out["cid"]
        left = [f"{TOP}/{c}/libpod_parent/libpod-{cid}" for c in V1]
        assert [p for p in left if os.path.exists(p)] == []
    finally:
        shutil.rmtree(home, ignore_errors=True)
