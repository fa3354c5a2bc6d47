"""gpusandbox-oci: the config's hooks in the runtime spec's order
(config.md, POSIX-platform hooks; runtime.md, Lifecycle), root and
rootless: prestart then createRuntime, in the runtime's namespaces during
`create`, once the container's namespaces and mounts exist and before the
pivot; then createContainer, in the container's mount namespace; then
startContainer after `start`; poststart; poststop at `delete`.  Each hook
appends what it sees to one log; a prestart hook reaches the container
through /proc/PID.  A failing createRuntime hook fails the create and
leaves nothing behind."""
import glob
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import MODES, VENV
from .test_oci_runtime import _as, _config

OCI = str(VENV / "bin" / "gpusandbox-oci")

# One hook program for every stage: argv STAGE LOG [ROOTFS]; the OCI state on stdin.
HOOK = r"""
import json, os, sys
stage, log = sys.argv[1], sys.argv[2]
st = json.load(sys.stdin)
pid = st.get("pid") or 0
rec = {"stage": stage, "status": st.get("status"), "pid": pid,
       "mnt": os.readlink("/proc/self/ns/mnt")}
if stage in ("prestart", "createRuntime"):
    root, host = os.stat(f"/proc/{pid}/root"), os.stat("/")
    rec["host_root"] = (root.st_dev, root.st_ino) == (host.st_dev, host.st_ino)
    rec["init_mnt"] = os.readlink(f"/proc/{pid}/ns/mnt")
    rec["init_ns"] = sorted(os.listdir(f"/proc/{pid}/ns"))
    rec["cgroup"] = open(f"/proc/{pid}/cgroup").read().split()
    if stage == "prestart":
        # Into the container's own tmpfs (a config mount), through the init's root.
        with open(f"/proc/{pid}/root{sys.argv[3]}/scratch/from-prestart", "w") as f:
            f.write(f"prestart saw {pid}")
with open(log, "a") as f:
    f.write(json.dumps(rec) + "\n")
if stage == "createRuntime" and os.path.exists(log + ".fail"):
    sys.stderr.write("no network for you")
    sys.exit(3)
"""


@pytest.fixture(scope="module")
def hook_dir(cli, test_user):
    d = Path(tempfile.mkdtemp(prefix="gsbx-hookorder-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _bundle(d, name, mode, user, rootfs):
    """A bundle whose hooks log to LOG; the container sees the log's
    directory at /hooklog (startContainer runs inside it)."""
    b = d / name
    logs = b / "logs"
    logs.mkdir(parents=True)
    (logs / "hook.py").write_text(HOOK)
    conf = _config(rootfs, ["sh", "-c", "cat /scratch/from-prestart; echo; "
                            "readlink /proc/self/ns/mnt"], mode, user)
    conf["mounts"].append({"destination": "/hooklog", "type": "bind", "source": str(logs),
                           "options": ["bind", "rw"]})
    out = str(logs / "log")

    def hook(stage, inside=False):
        where = "/hooklog" if inside else str(logs)
        return {"path": "/usr/bin/python3",
                "args": ["python3", f"{where}/hook.py", stage, f"{where}/log", str(rootfs)]}
    # Listed out of the spec's order on purpose: the runtime orders the stages.
    conf["hooks"] = {"poststop": [hook("poststop")], "poststart": [hook("poststart")],
                     "startContainer": [hook("startContainer", inside=True)],
                     "createContainer": [hook("createContainer")],
                     "createRuntime": [hook("createRuntime")],
                     "prestart": [hook("prestart")]}
    (b / "config.json").write_text(json.dumps(conf))
    if mode != "root":
        subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(b)], check=True)
    return b, out


def _log(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.parametrize("mode", MODES)
def test_hooks_in_the_spec_order(mode, hook_dir, rootfs, test_user):
    b, log = _bundle(hook_dir, f"order-{mode}", mode, test_user, rootfs)
    root = b / "state"
    r = subprocess.run(_as(mode, test_user, [OCI, "--root", str(root), "run", "--bundle",
                                             str(b), f"ho-{mode}"],
                           {"PATH": "/usr/bin:/bin"}),
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       cwd="/")
    assert r.returncode == 0, r.stdout + r.stderr
    recs = _log(log)
    assert [x["stage"] for x in recs] == ["prestart", "createRuntime", "createContainer",
                                          "startContainer", "poststart", "poststop"]
    pre, crt, cc, sc, ps, stop = recs
    pid = pre["pid"]
    assert pid > 1
    # The runtime's namespace, during create, before the pivot: the init's
    # root is still the host's, its mount namespace already its own.
    # prestart sees it created (runtime-tools' hooks_stdin), createRuntime
    # creating (runc's).
    for x, status in ((pre, "created"), (crt, "creating")):
        assert (x["status"], x["pid"], x["host_root"]) == (status, pid, True)
        assert x["mnt"] == os.readlink("/proc/self/ns/mnt") != x["init_mnt"]
        assert {"mnt", "pid", "uts", "ipc"} <= set(x["init_ns"])
    # createContainer: in the init's mount namespace, created (crun's
    # test_in_container_hooks_state).
    assert (cc["status"], cc["pid"], cc["mnt"]) == ("created", pid, pre["init_mnt"])
    assert (sc["status"], sc["pid"], sc["mnt"]) == ("created", pid, pre["init_mnt"])
    assert (ps["status"], ps["pid"]) == ("running", pid)
    assert stop["status"] == "stopped"
    # What the prestart hook wrote through /proc/PID/root is in the container.
    assert r.stdout.splitlines() == [f"prestart saw {pid}", pre["init_mnt"]]
    assert os.listdir(root) == []


@pytest.mark.parametrize("mode", MODES)
def test_failing_create_runtime_hook_leaves_nothing(mode, hook_dir, rootfs, test_user):
    b, log = _bundle(hook_dir, f"fail-{mode}", mode, test_user, rootfs)
    Path(log + ".fail").touch()
    root = b / "state"
    r = subprocess.run(_as(mode, test_user, [OCI, "--root", str(root), "create", "--bundle",
                                             str(b), f"hf-{mode}"],
                           {"PATH": "/usr/bin:/bin"}),
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       cwd="/")
    assert r.returncode == 1
    assert r.stderr.startswith("gpusandbox: error: createRuntime hook /usr/bin/python3: "
                               "exit 3: no network for you"), r.stderr
    recs = _log(log)
    assert [x["stage"] for x in recs] == ["prestart", "createRuntime"]
    pid = recs[1]["pid"]
    assert not os.path.exists(f"/proc/{pid}")      # killed and reaped by create
    assert os.listdir(root) == []
    for line in recs[1]["cgroup"]:
        path = line.split(":", 2)[2]
        if "gpusandbox-oci" in path:
            assert not glob.glob(f"/sys/fs/cgroup/*{path}") + glob.glob(f"/sys/fs/cgroup{path}")


@pytest.mark.parametrize("mode", MODES)
def test_failing_start_container_hook_fails_start(mode, hook_dir, rootfs, test_user):
    """startContainer hooks run before the init answers `start`: a failing
    one fails `start` itself (no workload), and the container is destroyed
    with its poststop hooks run (runtime.md, Lifecycle)."""
    b, log = _bundle(hook_dir, f"sfail-{mode}", mode, test_user, rootfs)
    conf = json.loads((b / "config.json").read_text())
    conf["process"]["args"] = ["sh", "-c", "echo workload ran"]
    conf["hooks"]["startContainer"].append({"path": "/bin/sh",
                                            "args": ["sh", "-c", "echo hook says no >&2; exit 4"]})
    (b / "config.json").write_text(json.dumps(conf))
    root = b / "state"
    r = subprocess.run(_as(mode, test_user, [OCI, "--root", str(root), "run", "--bundle",
                                             str(b), f"hs-{mode}"],
                           {"PATH": "/usr/bin:/bin"}),
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                       cwd="/")
    assert r.returncode == 1
    assert "workload ran" not in r.stdout
    # The init's error (on the container's stderr, here run's), then start's.
    assert "startContainer hook /bin/sh: exit 4: hook says no" in r.stderr
    assert r.stderr.endswith("gpusandbox: error: cannot start the container: its init exited "
                             "before start: a startContainer hook failed or the init was "
                             "killed\n"), r.stderr
    assert [x["stage"] for x in _log(log)] == ["prestart", "createRuntime", "createContainer",
                                               "startContainer", "poststop"]
    assert os.listdir(root) == []
