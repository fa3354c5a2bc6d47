"""gpusandbox as an OCI runtime (gpusandbox-oci): the runc command line
driven directly by a minimal conmon (oci_caller.py), and podman 4.3 with
--runtime pointing at it, as root and as the unprivileged test user."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import MODES, VENV

HERE = Path(__file__).resolve().parent
OCI = str(VENV / "bin" / "gpusandbox-oci")
# podman's default nofile/nproc limits exceed this host's hard limits (runc
# refuses them too): the tests ask for limits any host allows.
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


def _as(mode, user, argv, env=None):
    if mode == "root":
        return argv
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
            "--", "env", "-i", *(f"{k}={v}" for k, v in (env or {}).items()), *argv]


def _config(rootfs, args, mode, user, **extra):
    conf = {
        "ociVersion": "1.0.2",
        "process": {"args": args, "cwd": "/", "user": {"uid": 0, "gid": 0},
                    "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GREETING=from-config"]},
        "root": {"path": str(rootfs), "readonly": True},
        "hostname": "ocitest",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                    "options": ["nosuid", "noexec", "nodev"]},
                   {"destination": "/scratch", "type": "tmpfs", "source": "tmpfs",
                    "options": ["nosuid", "size=1m", "mode=0700"]}],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
                  "maskedPaths": ["/proc/kcore"], "readonlyPaths": ["/proc/sys"]},
    }
    if mode == "rootless":
        conf["linux"]["namespaces"].append({"type": "user"})
        conf["linux"]["uidMappings"] = [{"containerID": 0, "hostID": user.pw_uid, "size": 1}]
        conf["linux"]["gidMappings"] = [{"containerID": 0, "hostID": user.pw_gid, "size": 1}]
    conf["linux"].update(extra)
    return conf


@pytest.fixture
def oci_dirs(request, cli, test_user):
    d = Path(tempfile.mkdtemp(prefix="gsbx-oci-"))
    os.chmod(d, 0o755)
    # The caller's own: root's state root in a directory of the test user's
    # is refused (the user could swap the hooks root runs).
    rootless = getattr(request.node, "callspec", None) and \
        request.node.callspec.params.get("mode") == "rootless"
    for sub in ("root", "bundle"):
        (d / sub).mkdir()
        if rootless:
            os.chown(d / sub, test_user.pw_uid, test_user.pw_gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("mode", MODES)
def test_lifecycle_with_a_caller_as_subreaper(mode, oci_dirs, rootfs, test_user):
    """create leaves the init blocked until start; the pid file names the
    init, which is the caller's child once create has exited (no gpusandbox
    process above it); the caller reaps the workload's own exit status; the
    config's env, hostname, mounts and masks apply; delete leaves nothing."""
    script = ("echo $GREETING $(hostname) $(id -u); grep -c ' /dev/mqueue mqueue ' /proc/mounts; "
              "grep ' /scratch ' /proc/mounts | grep -c 'size=1024k'; "
              "test -s /proc/kcore || echo masked; touch /x 2>/dev/null || echo ro-root; exit 3")
    conf = _config(rootfs, ["sh", "-c", script], mode, test_user)
    hook_file = oci_dirs / "root" / "hooks"
    conf["hooks"] = {"prestart": [{"path": "/bin/sh", "args": ["sh", "-c", f"cat > {hook_file}"]}],
                     "poststop": [{"path": "/bin/sh",
                                   "args": ["sh", "-c", f"printf '\\nstopped\\n' >> {hook_file}"]}]}
    (oci_dirs / "bundle" / "config.json").write_text(json.dumps(conf))
    out_file = oci_dirs / "root" / "out"
    with open(out_file, "w") as out:
        os.chown(out_file, test_user.pw_uid, test_user.pw_gid)
        r = subprocess.run(_as(mode, test_user, ["/usr/bin/python3", str(HERE / "oci_caller.py"), OCI,
                                                 str(oci_dirs / "root" / "s"),
                                                 str(oci_dirs / "bundle"), "c1"]),
                           stdout=subprocess.PIPE, stderr=out, text=True, timeout=60)
    res = json.loads(r.stdout)
    assert res["create"] == [0, ""], res
    assert res["comm"] == "gpusandbox-init"
    assert res["ppid_is_caller"] is True
    assert res["created"] == ["created", True]
    assert res["start"] == [0, ""]
    assert res["exit"] == 3
    assert res["stopped"] == "stopped"
    assert res["delete"] == [0, ""]
    assert res["left"] == []
    assert out_file.read_text().split() == ["from-config", "ocitest", "0", "1", "1", "masked",
                                            "ro-root"]
    # Hooks got the state on stdin: prestart at create, poststop at delete.
    hook_state, stopped = hook_file.read_text().splitlines()
    assert json.loads(hook_state)["status"] == "created" and stopped == "stopped"


def test_errors_for_callers(cli, oci_dirs, rootfs, test_user):
    """What cannot be honoured is refused with one line (and a JSON record in
    --log, as podman reads it), leaving no state; runc's phrases for a
    missing container."""
    conf = _config(rootfs, ["true"], "root", test_user, intelRdt={"closID": "x"})
    (oci_dirs / "bundle" / "config.json").write_text(json.dumps(conf))
    root, log = oci_dirs / "root" / "s", oci_dirs / "log.json"
    rt = [OCI, "--root", str(root), "--log", str(log), "--log-format", "json"]
    r = subprocess.run(rt + ["create", "--bundle", str(oci_dirs / "bundle"), "c2"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert r.stderr == "gpusandbox: error: OCI config linux: intelRdt is not supported\n"
    rec = json.loads(log.read_text().splitlines()[-1])
    assert rec["level"] == "error" and "intelRdt" in rec["msg"]
    assert os.listdir(root) == []
    r = subprocess.run(rt + ["state", "nosuch"], capture_output=True, text=True)
    assert r.returncode == 1 and 'container "nosuch" does not exist' in r.stderr
    r = subprocess.run(rt + ["delete", "--force", "nosuch"], capture_output=True, text=True)
    assert r.returncode == 0


@pytest.mark.parametrize("mode", MODES)
def test_gpu_selected_by_process_env(mode, oci_dirs, rootfs, test_user, sim_host):
    """NVIDIA_VISIBLE_DEVICES in process.env selects the GPU, injected by
    the code `run` uses, from the driver root the caller's environment names
    (never the config)."""
    script = "nvidia-smi -L | wc -l; ls /dev | grep -c '^nvidia[0-9]'"
    conf = _config(rootfs, ["sh", "-c", script], mode, test_user)
    conf["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=2")
    (oci_dirs / "bundle" / "config.json").write_text(json.dumps(conf))
    out_file = oci_dirs / "root" / "out"
    env = {"PATH": "/usr/bin:/bin", "GPUSANDBOX_DRIVER_ROOT": sim_host.root}
    with open(out_file, "w") as out:
        r = subprocess.run(_as(mode, test_user, ["/usr/bin/python3", str(HERE / "oci_caller.py"),
                                                 OCI, str(oci_dirs / "root" / "s"),
                                                 str(oci_dirs / "bundle"), "g1"], env),
                           stdout=subprocess.PIPE, stderr=out, text=True, timeout=60,
                           env={**os.environ, **env})
    res = json.loads(r.stdout)
    assert res["create"] == [0, ""] and res["exit"] == 0, res
    assert out_file.read_text().split() == ["1", "1"]
