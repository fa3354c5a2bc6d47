"""Integration fixtures: the real CLI, installed into a venv every user can
run, a real root filesystem, and a real unprivileged user.

The CLI is installed (not imported from the checkout) into
$GSBX_TEST_BASE/venv (default /opt/gpusandbox-test/venv) with the test hooks
on: tests/testinstall.py, which scripts/soak uses too.
"""
import hashlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from .. import testinstall

REPO = Path(__file__).resolve().parents[2]
BASE = testinstall.base_from_env()
VENV = BASE / "venv"
CLI = str(VENV / "bin" / "gpusandbox")
TEST_USER = "gsbxtest"
ATTACK_USER = "gsbxatk"      # the second user: tests/integration/crossuser.py
MODES = ["root", "rootless"]

MISSING_ACCOUNTS = "run scripts/test-users as root first (scripts/test does)"


def _ensure_user(name=TEST_USER):
    """Looked up only: scripts/test-users makes the account once before pytest
    starts, because workers creating it on their own raced each other."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pytest.fail(f"test user {name} does not exist: {MISSING_ACCOUNTS}", pytrace=False)


def subid_range(user, path):
    """(start, count) of the user's first range in /etc/subuid or /etc/subgid."""
    try:
        with open(path) as f:
            for line in f:
                parts = line.strip().split(":")
                if len(parts) == 3 and parts[0] in (user.pw_name, str(user.pw_uid)):
                    return int(parts[1]), int(parts[2])
    except FileNotFoundError:
        pass
    pytest.fail(f"{user.pw_name} has no range in {path}: {MISSING_ACCOUNTS}", pytrace=False)


@pytest.fixture(scope="session")
def cli():
    if os.geteuid() != 0:
        pytest.skip("integration tests run as root (they also drive an unprivileged user)")
    testinstall.ensure(BASE)
    return CLI


@pytest.fixture(scope="session")
def test_user():
    return _ensure_user()


@pytest.fixture(scope="session")
def workdir_base():
    d = tempfile.mkdtemp(prefix="gsbx-test-")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def rootfs(workdir_base):
    """A Debian-style rootfs with a shell, coreutils and python3 (read-only use)."""
    root = workdir_base / "rootfs"
    subprocess.run([str(REPO / "scripts" / "mkrootfs"), str(root)], check=True,
                   capture_output=True)
    return root


@pytest.fixture
def shared_tmp():
    """A temp dir the unprivileged test user can reach (pytest's is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="gsbx-test-tmp-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def small_rootfs(tmp_path_factory):
    """A disposable rootfs without python, for tests that write into the image."""
    d = Path(tempfile.mkdtemp(prefix="gsbx-test-small-"))
    os.chmod(d, 0o755)
    subprocess.run([str(REPO / "scripts" / "mkrootfs"), str(d / "root"), "--no-python"],
                   check=True, capture_output=True)
    yield d / "root"
    shutil.rmtree(d, ignore_errors=True)


class Runner:
    """Runs the CLI as root or as the unprivileged test user."""

    def __init__(self, cli, mode, user):
        self.cli = cli
        self.mode = mode
        self.user = user

    @property
    def uid(self):
        return 0 if self.mode == "root" else self.user.pw_uid

    @property
    def gid(self):
        return 0 if self.mode == "root" else self.user.pw_gid

    def argv(self, args):
        cmd = [self.cli] + list(args)
        if not args or args[0] not in ("info", "list", "doctor", "sim", "mps", "version"):
            cmd.insert(1, "run")
        if self.mode == "rootless":
            cmd = ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                   "--clear-groups", "--"] + cmd
        return cmd

    def env(self, extra=None):
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8",
               "HOME": "/"}
        env.update(extra or {})
        return env

    def run(self, args, env=None, timeout=60, input=None):
        return subprocess.run(self.argv(args), capture_output=True, text=True,
                              timeout=timeout, env=self.env(env), cwd="/", input=input)

    def popen(self, args, env=None, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        return subprocess.Popen(self.argv(args), env=self.env(env), cwd="/", text=True, **kw)


@pytest.fixture(params=MODES)
def runner(request, cli, test_user):
    return Runner(cli, request.param, test_user)


@pytest.fixture
def root_runner(cli, test_user):
    return Runner(cli, "root", test_user)


@pytest.fixture
def rootless_runner(cli, test_user):
    return Runner(cli, "rootless", test_user)


@pytest.fixture(scope="session")
def attack_user():
    return _ensure_user(ATTACK_USER)


@pytest.fixture
def attacker(cli, attack_user):
    """The CLI as the second unprivileged user (another account on the node)."""
    return Runner(cli, "rootless", attack_user)


def tree_checksum(root):
    """A checksum of a tree as a host user would compare it: names, modes, sizes, mtimes, and the contents of files up to 64 KiB."""
    h = hashlib.sha256()
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + files):
            p = os.path.join(d, name)
            st = os.lstat(p)
            h.update(f"{p}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
            if stat.S_ISREG(st.st_mode) and st.st_size <= 65536:
                with open(p, "rb") as f:
                    h.update(f.read())
            elif stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(p).encode())
    return h.hexdigest()


# Mounts that peers make in the host's namespace while the benchmark smoke
# tests and the podman tests (tests/integration/oci_fixtures.py) run beside
# other tests (podman's storage under their own temp dirs, removed at their
# end): not ours.
# Mounts that tests running beside each other make on purpose: the bench smoke
# test's and the OCI tests' podman stores, and the network namespaces root
# podman pins under /run/netns for its containers.
_PEER_MOUNTS = ("/tmp/gsbx-bench-", "/tmp/gsbx-test-podman-", "/run/netns/")


def host_mounts():
    with open("/proc/self/mountinfo") as f:
        return sorted(m for m in (line.split(" - ")[0].split(" ", 4)[4] for line in f)
                      if not m.startswith(_PEER_MOUNTS))


def pids_with(marker):
    """Host pids whose command line contains `marker`."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(d))
        except OSError:
            pass
    return found


def comm(pid):
    """The process's name (/proc/PID/comm), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def wait_for(pred, timeout=10.0, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def kill_quietly(proc):
    try:
        os.kill(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


class SimHost:
    """A simulated GPU host made by `gpusandbox sim create`: root is the
    driver root; info is the description the sim printed (--json): GPUs with
    index, uuid, bus_id, minor, and their MIG devices with uuid and minors."""

    def __init__(self, root, info):
        self.root = root
        self.info = info

    @property
    def gpus(self):
        return self.info["gpus"]

    def mig(self, gpu, gi, ci=0):
        return next(m for m in self.gpus[gpu]["mig"] if (m["gi"], m["ci"]) == (gi, ci))

    def __str__(self):
        return self.root


@pytest.fixture(scope="session")
def sim_host(cli):
    """4 simulated GPUs, two MIG devices (gi 1 and gi 2, ci 0) on GPU 2, in a
    world-readable /tmp/gsbx-test-sim-* (on a filesystem without nodev, so
    its device nodes reach the driver layer: ENXIO, or EPERM from a filter)."""
    import json
    base = tempfile.mkdtemp(prefix="gsbx-test-sim-", dir="/tmp")
    os.chmod(base, 0o755)
    root = os.path.join(base, "host")
    try:
        res = subprocess.run([cli, "sim", "create", root, "--gpus", "4", "--mig", "2:1:0,2:2:0",
                              "--json"], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        yield SimHost(root, json.loads(res.stdout))
    finally:
        subprocess.run([cli, "sim", "destroy", root], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
