"""`gpusandbox-oci start` of a created container, `delete` of a stopped one
(what podman calls around every `run --rm`) and `kill` of a live one are
done by the shell entry without starting Python, with the Python path's results: the container
running after start, its state directory and cgroup leaf gone after delete.
Every other case (an error, a hook, a leaf with a child cgroup) goes to the
Python path, whose words the entry's answers then are, root and rootless."""
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from .conftest import CLI, MODES, VENV

OCI = str(VENV / "bin" / "gpusandbox-oci")


class Caller:
    def __init__(self, mode, user, tmp):
        self.mode, self.user, self.tmp = mode, user, tmp
        self.env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "XDG_RUNTIME_DIR": str(tmp / "xdg")}
        self.g = ["--root", str(tmp / "root" / "s")]
        if mode == "root":
            # Root's state root in a directory of root's: one of the test
            # user's is refused (the user could swap the hooks root runs).
            for d in (tmp, tmp / "root"):
                os.chown(d, 0, 0)

    def argv(self, argv):
        if self.mode == "root":
            return argv
        return ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                "--clear-groups", "--", *argv]

    def run(self, argv, **kw):
        return subprocess.run(self.argv(argv), capture_output=True, text=True, env=self.env,
                              cwd="/", timeout=60, **kw)

    def entry(self, *args):
        """The entry's result and whether it ran Python (strace -f execve)."""
        trace = self.tmp / "trace"
        r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace),
                            *self.argv([OCI, *self.g, *args])], capture_output=True, text=True,
                           env=self.env, cwd="/", timeout=60)
        execs = [ln for ln in trace.read_text().splitlines() if "execve(" in ln and "= 0" in ln]
        py = [ln for ln in execs if "python" in ln]
        # The test install holds the package as files: Python starts
        # without site, the venv's package directory given directly.
        assert all('"-I", "-S"' in ln for ln in py), py
        return r, bool(py)

    def same(self, *args):
        """The entry and the Python path (`gpusandbox oci`) answer alike: an
        error, so the entry must have handed it to Python."""
        fast, py = self.entry(*args)
        ref = self.run([CLI, "oci", *self.g, *args])
        assert (fast.returncode, fast.stdout, fast.stderr) == \
            (ref.returncode, ref.stdout, ref.stderr), args
        assert py, args
        return ref

    def state(self, cid):
        return json.loads(self.run([OCI, *self.g, "state", cid]).stdout)

    def create(self, cid, conf):
        bundle = self.tmp / f"bundle-{cid}"
        bundle.mkdir()
        (bundle / "config.json").write_text(json.dumps(conf))
        # The init inherits create's stdio: a file, not a pipe left open.
        with open(self.tmp / f"{cid}.err", "w+") as err:
            r = subprocess.run(self.argv([OCI, *self.g, "create", "--bundle", str(bundle), cid]),
                               stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=self.env,
                               cwd="/", timeout=60)
            err.seek(0)
            assert r.returncode == 0, err.read()
        with open(self.tmp / "root" / "s" / cid / "state.json") as f:
            return json.load(f).get("cgroup")

    def wait_stopped(self, cid):
        deadline = time.monotonic() + 20
        while self.state(cid)["status"] != "stopped":
            assert time.monotonic() < deadline, f"{cid} did not stop"
            time.sleep(0.05)


@pytest.fixture
def tmp(test_user):
    d = Path(tempfile.mkdtemp(prefix="gsbx-ocifast2-"))
    os.chmod(d, 0o755)
    for sub in ("root", "xdg", "out"):
        (d / sub).mkdir()
        os.chown(d / sub, test_user.pw_uid, test_user.pw_gid)
    os.chown(d, test_user.pw_uid, test_user.pw_gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _conf(rootfs, mode, user, **extra):
    conf = {"ociVersion": "1.0.2",
            "process": {"args": ["sleep", "300"], "cwd": "/", "user": {"uid": 0, "gid": 0},
                        "env": ["PATH=/usr/bin:/bin"]},
            "root": {"path": str(rootfs), "readonly": True},
            "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")]},
            **extra}
    if mode == "rootless":
        conf["linux"]["namespaces"].append({"type": "user"})
        conf["linux"]["uidMappings"] = [{"containerID": 0, "hostID": user.pw_uid, "size": 1}]
        conf["linux"]["gidMappings"] = [{"containerID": 0, "hostID": user.pw_gid, "size": 1}]
    return conf


@pytest.mark.parametrize("mode", MODES)
def test_start_and_delete_without_python(mode, tmp, test_user, rootfs, cli):
    c = Caller(mode, test_user, tmp)
    root = tmp / "root" / "s"
    leaf = c.create("F1", _conf(rootfs, mode, test_user))
    # Refused while created (the Python path's error), and nothing removed.
    c.same("delete", "F1")
    assert c.state("F1")["status"] == "created"
    r, py = c.entry("start", "F1")
    assert (r.returncode, r.stdout, r.stderr, py) == (0, "", "", False)
    assert c.state("F1")["status"] == "running"
    assert not (root / "F1" / "exec.fifo").exists()
    c.same("start", "F1")                     # already running
    c.same("delete", "F1")                    # not stopped, no --force
    c.same("kill", "F1", "NOPE")
    c.same("kill", "F1", "65")
    c.same("kill", "F1", "SIG")
    r, py = c.entry("kill", "F1", "KILL")
    assert (r.returncode, r.stdout, r.stderr, py) == (0, "", "", False)
    c.wait_stopped("F1")
    c.same("start", "F1")                     # stopped
    c.same("kill", "F1", "9")                 # not running
    # cgroup v1 leaves (root on a hybrid or v1 host): Python's delete removes them.
    v1 = json.loads((root / "F1" / "state.json").read_text()).get("cgroup_v1") or []
    r, py = c.entry("delete", "--force", "F1")
    assert (r.returncode, r.stdout, r.stderr, py) == (0, "", "", bool(v1))
    assert os.listdir(root) == [] and not [p for p in v1 if os.path.exists(p)]
    if leaf:
        assert not os.path.exists(leaf), f"{leaf} outlived delete"
    c.same("delete", "F1")                    # does not exist
    c.same("start", "F1")


@pytest.mark.parametrize("mode", MODES)
def test_hooks_and_child_cgroups_go_to_python(mode, tmp, test_user, rootfs, cli):
    """poststart and poststop hooks run (the Python path does it), and a
    leaf with a child cgroup is removed with its child."""
    c = Caller(mode, test_user, tmp)
    out = tmp / "out"
    hook = lambda name: {"path": "/bin/sh", "args": ["sh", "-c", f"cat > {out}/{name}"]}
    leaf = c.create("H1", _conf(rootfs, mode, test_user,
                                hooks={"poststart": [hook("poststart")],
                                       "poststop": [hook("poststop")]}))
    r, py = c.entry("start", "H1")
    assert (r.returncode, r.stderr, py) == (0, "", True)
    assert json.loads((out / "poststart").read_text())["id"] == "H1"
    assert c.run([OCI, *c.g, "kill", "H1", "KILL"]).returncode == 0
    c.wait_stopped("H1")
    child = None
    if leaf and os.access(leaf, os.W_OK):
        child = Path(leaf) / "sub"
        child.mkdir()
    r, py = c.entry("delete", "H1")
    assert (r.returncode, r.stderr, py) == (0, "", True)
    assert json.loads((out / "poststop").read_text())["status"] == "stopped"
    assert os.listdir(tmp / "root" / "s") == []
    if leaf:
        assert not os.path.exists(leaf), f"{leaf} outlived delete"
