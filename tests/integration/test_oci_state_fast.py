"""`gpusandbox-oci state ID` answered by the shell entry without starting
Python (the command podman and conmon call most): for every status, for
the default state root and podman's global flags, its JSON equals the
Python path's (`gpusandbox oci state`), and the cases it cannot answer
exactly (missing container, odd id, altered state file) go to Python."""
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpusandbox.oci.runtime import state as ocistate

from .conftest import CLI, MODES, VENV

OCI = str(VENV / "bin" / "gpusandbox-oci")
FAKE_COMM = ("import ctypes, time\n"
             "ctypes.CDLL(None).prctl(15, b'a) Z 1 2\\n) S 3', 0, 0, 0)\n"
             "print('named', flush=True)\ntime.sleep(300)\n")


def _as(mode, user, argv, env):
    if mode == "root":
        return argv
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
            "--", *argv]


class Caller:
    def __init__(self, mode, user, tmp):
        self.mode, self.user, self.tmp = mode, user, tmp
        self.env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "XDG_RUNTIME_DIR": str(tmp / "xdg")}
        if mode == "root":
            # Root's state root in a directory of root's: one of the test
            # user's is refused (the user could swap the hooks root runs).
            os.chown(tmp / "root", 0, 0)

    def run(self, argv, **kw):
        return subprocess.run(_as(self.mode, self.user, argv, self.env), capture_output=True,
                              text=True, env=self.env, cwd="/", timeout=60, **kw)

    def both(self, glob, cid):
        """(fast output, reference output, whether the entry ran python)."""
        trace = self.tmp / "trace"
        fast = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace),
                               *_as(self.mode, self.user, [OCI, *glob, "state", cid], self.env)],
                              capture_output=True, text=True, env=self.env, cwd="/", timeout=60)
        ref = self.run([CLI, "oci", *glob, "state", cid])
        execs = [ln for ln in trace.read_text().splitlines() if "execve(" in ln and "= 0" in ln]
        return fast, ref, any("python" in ln for ln in execs)

    def same(self, glob, cid, fast_path=True):
        fast, ref, py = self.both(glob, cid)
        assert py is not fast_path, (cid, fast.stdout)
        assert fast.returncode == ref.returncode, (fast, ref)
        if ref.returncode == 0:
            assert fast.stderr == ""
            got, want = json.loads(fast.stdout), json.loads(ref.stdout)
            assert got == want
            return got
        assert fast.stdout == ref.stdout and fast.stderr == ref.stderr
        return None


@pytest.fixture
def tmp(test_user):
    d = Path(tempfile.mkdtemp(prefix="gsbx-ocifast-"))
    os.chmod(d, 0o755)
    for sub in ("root", "xdg", "bundle", "cg"):
        (d / sub).mkdir()
        os.chown(d / sub, test_user.pw_uid, test_user.pw_gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _save(root, cid, uid, gid, **st):
    d = Path(root) / cid
    d.mkdir(mode=0o700)
    os.chown(d, uid, gid)
    ocistate.save({"id": cid, "bundle": "/b", "rootfs": "/b/rootfs", "created": "now",
                   "annotations": {"a\"\\b": "caf\u00e9 $(touch /tmp/x) `id`\n'%s"},
                   "cgroup": "", "cgroup_version": 2, **st, "_dir": str(d)})
    for name in ocistate.FILES:
        if (d / name).exists():
            os.chown(d / name, uid, gid)     # the caller's, as its own create writes them
    return d


@pytest.mark.parametrize("mode", MODES)
def test_state_of_recorded_processes(mode, tmp, test_user, cli):
    """Each status from a state the test writes for a host process: created
    (exec.fifo), running, paused (cgroup.freeze 1), stopped (a recycled pid:
    another start time), a comm that fakes /proc/PID/stat's fields, the
    default root with podman's flags; and the fallbacks, all equal."""
    c = Caller(mode, test_user, tmp)
    uid, gid = (0, 0) if mode == "root" else (test_user.pw_uid, test_user.pw_gid)
    root = str(tmp / "root")
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        pid = sleeper.pid
        start = ocistate.start_time(pid)[0]
        _save(root, "run1", uid, gid, pid=pid, start_time=start)
        assert c.same(["--root", root], "run1")["status"] == "running"
        d = _save(root, "cre1", uid, gid, pid=pid, start_time=start)
        (d / "exec.fifo").touch()
        assert c.same(["--root=" + root, "--debug"], "cre1")["status"] == "created"
        (tmp / "cg" / "cgroup.freeze").write_text("1\n")
        _save(root, "pau1", uid, gid, pid=pid, start_time=start, cgroup=str(tmp / "cg"))
        assert c.same(["--root", root], "pau1")["status"] == "paused"
        _save(root, "old1", uid, gid, pid=pid, start_time=start + 1)
        got = c.same(["--root", root], "old1")
        assert got["status"] == "stopped" and got["pid"] == 0
        # The workload names its own comm: a fake ") Z ..." inside it and a
        # newline do not change the answer.
        faker = subprocess.Popen(["/usr/bin/python3", "-c", FAKE_COMM], stdout=subprocess.PIPE)
        try:
            assert faker.stdout.readline() == b"named\n"
            _save(root, "fak1", uid, gid, pid=faker.pid,
                  start_time=ocistate.start_time(faker.pid)[0])
            assert c.same(["--root", root], "fak1")["status"] == "running"
        finally:
            faker.kill()
            faker.wait()
        # podman's flags, and the default root (XDG_RUNTIME_DIR for the
        # test user, who has no /run/user/UID here).
        log = tmp / "xdg" / "log.json"
        log.touch()
        os.chown(log, uid, gid)
        dflt = "/run/gpusandbox-oci" if mode == "root" else str(tmp / "xdg" / "gpusandbox-oci")
        os.makedirs(dflt, 0o700, exist_ok=True)
        os.chown(dflt, uid, gid)
        cid = f"ocifast-{os.getpid()}-{mode}"
        try:
            _save(dflt, cid, uid, gid, pid=pid, start_time=start)
            for glob in ([], ["--systemd-cgroup"], ["--log", str(log), "--log-format", "json"],
                         ["--cgroup-manager", "cgroupfs", "--log=file:" + str(log)]):
                assert c.same(glob, cid)["status"] == "running"
        finally:
            shutil.rmtree(os.path.join(dflt, cid), ignore_errors=True)
        assert log.read_text() == ""
        # What the entry cannot answer exactly, the Python path answers.
        c.same(["--root", root], "nosuch", fast_path=False)
        c.same(["--root", root], "-run1", fast_path=False)
        c.same(["--root", root], "run1/../run1", fast_path=False)
        c.same(["--root", root, "--log-format", "xml"], "run1", fast_path=False)
        c.same(["--root", root, "--log", str(tmp / "xdg" / "nolog")], "run1", fast_path=False)
        fast = Path(root) / "run1" / "state.fast"
        fast.write_text(fast.read_text().replace("gsbx-state-fast 1", "gsbx-state-fast 9"))
        c.same(["--root", root], "run1", fast_path=False)
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("mode", MODES)
def test_state_through_a_container_lifecycle(mode, tmp, test_user, rootfs, cli):
    """A real container: created, running, paused (where the container has a
    cgroup2 leaf to freeze), stopped, and gone after delete."""
    c = Caller(mode, test_user, tmp)
    conf = {
        "ociVersion": "1.0.2",
        "process": {"args": ["sleep", "300"], "cwd": "/", "user": {"uid": 0, "gid": 0},
                    "env": ["PATH=/usr/bin:/bin"]},
        "root": {"path": str(rootfs), "readonly": True},
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")]},
        "annotations": {"io.example/x": "y \"z\""},
    }
    if mode == "rootless":
        conf["linux"]["namespaces"].append({"type": "user"})
        conf["linux"]["uidMappings"] = [{"containerID": 0, "hostID": test_user.pw_uid, "size": 1}]
        conf["linux"]["gidMappings"] = [{"containerID": 0, "hostID": test_user.pw_gid, "size": 1}]
    (tmp / "bundle" / "config.json").write_text(json.dumps(conf))
    root = str(tmp / "root" / "s")
    g = ["--root", root]
    # The init inherits create's stdio: a file, not a pipe left open.
    with open(tmp / "create.err", "w+") as err:
        r = subprocess.run(_as(mode, test_user, [OCI, *g, "create", "--bundle",
                                                 str(tmp / "bundle"), "L1"], c.env),
                           stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=c.env,
                           cwd="/", timeout=60)
        err.seek(0)
        assert r.returncode == 0, err.read()
    try:
        got = c.same(g, "L1")
        assert got["status"] == "created" and got["annotations"] == conf["annotations"]
        assert c.run([OCI, *g, "start", "L1"]).returncode == 0
        assert c.same(g, "L1")["status"] == "running"
        if c.run([OCI, *g, "pause", "L1"]).returncode == 0:
            assert c.same(g, "L1")["status"] == "paused"
            assert c.run([OCI, *g, "resume", "L1"]).returncode == 0
        elif mode == "root":
            pytest.fail("pause failed as root")
        assert c.run([OCI, *g, "kill", "L1", "KILL"]).returncode == 0
        deadline = time.monotonic() + 20
        while json.loads(c.run([OCI, *g, "state", "L1"]).stdout)["status"] != "stopped":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        got = c.same(g, "L1")
        assert got["status"] == "stopped" and got["pid"] == 0
    finally:
        r = c.run([OCI, *g, "delete", "--force", "L1"])
    assert r.returncode == 0, r.stderr
    c.same(g, "L1", fast_path=False)
    assert os.listdir(root) == []


@pytest.mark.parametrize("mode", MODES)
def test_created_container_ends_when_its_state_is_removed(mode, tmp, test_user, rootfs, cli):
    """A created container whose state directory goes without `delete` (a
    wiped runroot, a caller that lost it) can never be started: its init ends
    instead of waiting on the exec fifo forever, and the next create removes
    the emptied cgroup leaf."""
    c = Caller(mode, test_user, tmp)
    conf = {"ociVersion": "1.0.2",
            "process": {"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0},
                        "env": ["PATH=/usr/bin:/bin"]},
            "root": {"path": str(rootfs), "readonly": True},
            "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")]}}
    if mode == "rootless":
        conf["linux"]["namespaces"].append({"type": "user"})
        conf["linux"]["uidMappings"] = [{"containerID": 0, "hostID": test_user.pw_uid, "size": 1}]
        conf["linux"]["gidMappings"] = [{"containerID": 0, "hostID": test_user.pw_gid, "size": 1}]
    (tmp / "bundle" / "config.json").write_text(json.dumps(conf))
    root = tmp / "root" / "s"
    g = ["--root", str(root)]

    def create(cid):
        with open(tmp / f"{cid}.err", "w+") as err:
            r = subprocess.run(_as(mode, test_user, [OCI, *g, "create", "--bundle",
                                                     str(tmp / "bundle"), cid], c.env),
                               stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=c.env,
                               cwd="/", timeout=60)
            err.seek(0)
            assert r.returncode == 0, err.read()
        return json.loads(c.run([CLI, "oci", *g, "state", cid]).stdout)["pid"]

    pid = create("R1")
    with open(root / "R1" / "state.json") as f:
        leaf = json.load(f).get("cgroup")
    shutil.rmtree(root / "R1")
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = os.path.exists(f"/proc/{pid}")
    if alive:
        os.kill(pid, 9)
    assert not alive, "the init of a deleted created container kept waiting"
    create("R2")
    try:
        if leaf:
            assert not os.path.exists(leaf), f"{leaf} outlived its init"
    finally:
        assert c.run([OCI, *g, "delete", "--force", "R2"]).returncode == 0
