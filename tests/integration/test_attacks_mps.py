"""MPS directories as an attack surface (issue 23: items 1, 5, 6 and the
suspected MPS items), on the simulated host, with a second account on the
node (gsbxatk) against a victim (gsbxtest, or root).

The shared place an attacker plants in is the driver root's /tmp: in a
private mount namespace a world-writable sticky directory of the test's is
bound over SIMROOT/tmp, so that the attacker's links and directories and the
victim's launch meet there and nowhere else (nsrun.py).  The MPS stand-in
(gpusandbox/sim/mps.py) serves and journals like the real daemon's pipe
directory; it enforces nothing, and none of these tests needs it to."""
import json
import os
import signal
import subprocess

import pytest

from .conftest import wait_for
from .crossuser import ENV, Canaries, as_user
from .nsrun import private_mounts

PID_FILE = "nvidia-cuda-mps-control.pid"


def _user_argv(user, argv):
    if user is None:
        return list(argv)
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
            "--"] + list(argv)


@pytest.fixture
def simtmp(sim_host, shared_tmp):
    """A sticky world-writable directory that stands for SIMROOT/tmp inside
    private mount namespaces (wrap(): bound there)."""
    os.makedirs(os.path.join(sim_host.root, "tmp"), mode=0o755, exist_ok=True)
    d = shared_tmp / "simtmp"
    d.mkdir()
    os.chmod(d, 0o1777)
    return d


def wrap(argv, sim_host, simtmp):
    return private_mounts(argv, f"mount --bind {simtmp} {sim_host.root}/tmp")


def in_ns(runner, sim_host, simtmp, args, timeout=60):
    return subprocess.run(wrap(runner.argv(args), sim_host, simtmp), capture_output=True,
                          text=True, timeout=timeout, env=runner.env(), cwd="/")


def victim_user(runner):
    return runner.user if runner.mode == "rootless" else None


# A stand-in MPS control daemon (the attacker's, or root's system one): a
# directory of its user's whose `control` socket answers every client and
# logs who connected.
FAKE = r"""
import json, os, socket, struct, sys
d = sys.argv[1]
os.mkdir(d, 0o755)
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(d + "/control")
os.chmod(d + "/control", 0o666)
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    pid, uid, gid = struct.unpack("3i", c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    print(json.dumps({"uid": uid, "msg": c.recv(65536).decode(errors="replace")}), flush=True)
    c.send(b"fake daemon answered")
    c.close()
"""

SHOW = ("ls -la /tmp/nvidia-mps 2>&1; echo get_server_list | nvidia-cuda-mps-control 2>&1; "
        "touch /tmp/nvidia-mps/victim-wrote 2>&1; true")


def test_attacker_mps_directory_is_not_injected(runner, attack_user, sim_host, simtmp, rootfs):
    """Item 1: a directory the attacker made at /tmp/nvidia-mps, with a
    control socket of theirs, never reaches the victim's sandbox (root's or
    another user's), nor `cdi generate`'s spec; `list` and --verbose say why."""
    mpsdir = simtmp / "nvidia-mps"
    fake = subprocess.Popen(_user_argv(attack_user, ["python3", "-c", FAKE, str(mpsdir)]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            cwd="/")
    try:
        assert fake.stdout.readline().strip() == "ready", fake.stderr.read()
        r = in_ns(runner, sim_host, simtmp, ["--driver-root", sim_host.root, "--gpus", "0",
                                             "--verbose", str(rootfs), "sh", "-c", SHOW])
        lst = in_ns(runner, sim_host, simtmp, ["list", "--driver-root", sim_host.root,
                                               "--gpus", "0"])
        cdi = subprocess.run(wrap([runner.cli, "cdi", "generate", "--driver-root",
                                   sim_host.root, "--format", "json"], sim_host, simtmp),
                             capture_output=True, text=True, timeout=60, env=ENV, cwd="/")
    finally:
        fake.kill()
        out, _ = fake.communicate()
    assert r.returncode == 0, r.stderr
    assert "fake daemon answered" not in r.stdout, r.stdout
    assert out.strip() == "", f"the victim's client talked to the attacker: {out}"
    assert sorted(os.listdir(mpsdir)) == ["control"]
    host_path = f"{sim_host.root}/tmp/nvidia-mps"
    why = f"MPS pipe directory {host_path} not injected: owned by uid {attack_user.pw_uid}"
    assert why in r.stderr, r.stderr
    assert lst.returncode == 0, lst.stderr
    assert any(ln.startswith(f"skipped: {why}") for ln in lst.stdout.splitlines()), lst.stdout
    assert host_path not in lst.stdout.replace(f"skipped: {why}", "")
    assert cdi.returncode == 0, cdi.stderr
    spec = json.loads(cdi.stdout)
    assert not [m for m in spec["containerEdits"]["mounts"] if m["hostPath"] == host_path]
    assert f"gpusandbox: note: {why}" in cdi.stderr, cdi.stderr


def test_system_mps_directory_is_injected_read_only(runner, sim_host, simtmp, rootfs):
    """The counterpart: root's own /tmp/nvidia-mps (the system daemon's) is
    injected, bound from the inode checked, and read-only: its socket
    answers, nothing can be created or removed there."""
    fake = subprocess.Popen(["python3", "-c", FAKE, str(simtmp / "nvidia-mps")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            cwd="/")
    try:
        assert fake.stdout.readline().strip() == "ready", fake.stderr.read()
        r = in_ns(runner, sim_host, simtmp, ["--driver-root", sim_host.root, "--gpus", "0",
                                             str(rootfs), "sh", "-c", SHOW])
    finally:
        fake.kill()
        out, _ = fake.communicate()
    assert r.returncode == 0, r.stderr
    assert "fake daemon answered" in r.stdout.splitlines(), r.stdout
    assert json.loads(out.splitlines()[0])["uid"] == runner.uid, out
    assert "touch: cannot touch '/tmp/nvidia-mps/victim-wrote': Read-only file system" in \
        r.stdout, r.stdout
    assert sorted(os.listdir(simtmp / "nvidia-mps")) == ["control"]


def test_attacker_link_to_a_private_directory_is_not_injected(runner, attack_user, test_user,
                                                              sim_host, simtmp, rootfs):
    """Item 1: `ln -s <victim's private directory> /tmp/nvidia-mps` by the
    attacker (here, inside the driver root's /tmp) shows the victim's
    sandbox nothing of that directory, and lets it write nothing there."""
    c = Canaries.plant(str(simtmp), [test_user], root_dir=str(simtmp))
    os.chmod(simtmp, 0o1777)
    try:
        victim = "root" if runner.mode == "root" else test_user.pw_name
        target = "/tmp/" + os.path.basename(c.dirs[victim])
        res = as_user(attack_user, ["ln", "-s", target, str(simtmp / "nvidia-mps")])
        assert res.returncode == 0, res.stderr
        r = in_ns(runner, sim_host, simtmp, [
            "--driver-root", sim_host.root, "--gpus", "0", "--verbose", str(rootfs), "sh",
            "-c", "cat /tmp/nvidia-mps/secret 2>&1; touch /tmp/nvidia-mps/planted 2>&1; true"])
        assert r.returncode == 0, r.stderr
        c.check(r.stdout, r.stderr)
        assert (f"MPS pipe directory {sim_host.root}/tmp/nvidia-mps not injected: a symlink"
                in r.stderr), r.stderr
    finally:
        c.remove()


# --- the caller's own daemon ----------------------------------------------------

def mps(runner, sim, *args, timeout=60):
    return runner.run(["mps", *args, "--driver-root", sim.root, "--gpus", "0", "--json"],
                      timeout=timeout)


def status(runner, sim):
    r = mps(runner, sim, "status", timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)[0]


def journal(st):
    with open(os.path.join(st["log"], "journal.jsonl")) as f:
        return [json.loads(ln) for ln in f]


@pytest.fixture
def daemon(runner, sim_host):
    """The caller's daemon on GPU 0, up for the test and down (or killed, by
    the pid it had) after it."""
    r = mps(runner, sim_host, "up")
    assert r.returncode == 0, r.stderr
    st = status(runner, sim_host)
    assert st["running"], st
    yield st
    r = mps(runner, sim_host, "down", timeout=30)
    if os.path.exists(f"/proc/{st['pid']}"):
        os.kill(st["pid"], signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{st['pid']}/exe"))
        mps(runner, sim_host, "down", timeout=30)


HIJACK = r"""
import os, socket
p = "/run/nvidia-mps/control"
try:
    os.unlink(p)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(p)
    s.listen(8)
    res = "replaced"
except OSError as e:
    res = str(e.errno)
with open("/sync/a", "w") as f:
    f.write(res)
if res == "replaced":
    s.settimeout(30)
    while True:
        c, _ = s.accept()
        c.recv(65536)
        c.send(b"")
        c.close()
"""


def test_a_sandbox_cannot_take_over_the_control_socket(runner, sim_host, rootfs, shared_tmp,
                                                       daemon):
    """Item 5: the pipe directory is read-only inside: sandbox A cannot
    replace `control` with its own socket, so sandbox B's client and the
    host's `mps down` reach the daemon, which then stops."""
    sync = shared_tmp / "sync"
    sync.mkdir(mode=0o777)
    os.chmod(sync, 0o777)
    base = ["--driver-root", sim_host.root, "--gpus", "0", "--gpu-memory", "1G"]
    a = runner.popen(base + ["-v", f"{sync}:/sync", str(rootfs), "python3", "-c", HIJACK])
    try:
        assert wait_for(lambda: (sync / "a").exists() or a.poll() is not None, 30)
        assert (sync / "a").read_text() == "30", a.communicate() if a.poll() is not None else ""
        b = runner.run(base + [str(rootfs), "sh", "-c",
                               "echo get_server_list | nvidia-cuda-mps-control"])
        assert b.returncode == 0, b.stderr
    finally:
        a.kill()
        a.communicate()
    cmds = [(e["cmd"], e["uid"]) for e in journal(daemon)]
    assert ("get_server_list", runner.uid) in cmds, cmds
    r = mps(runner, sim_host, "down", timeout=30)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["stopped"] is True
    assert wait_for(lambda: not os.path.exists(f"/proc/{daemon['pid']}/exe"), 10)


IMPOSTOR = r"""
import os, socket, sys
p = sys.argv[1]
os.unlink(p)
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(p)
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    print(c.recv(65536).decode(errors="replace"), flush=True)
    c.send(b"")
    c.close()
"""


def test_mps_down_confirms_the_daemon_it_stopped(runner, sim_host, daemon):
    """Item 5: `mps down` reports a daemon stopped only when the process it
    started is gone: a socket that answered `quit` in its place (left by a
    sandbox of an older version, here put there on the host) gives one
    error line, and the daemon is still there to stop."""
    control = os.path.join(daemon["pipe"], "control")
    imp = subprocess.Popen(_user_argv(victim_user(runner), ["python3", "-c", IMPOSTOR, control]),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                           cwd="/")
    try:
        assert imp.stdout.readline().strip() == "ready", imp.stderr.read()
        r = mps(runner, sim_host, "down", timeout=30)
    finally:
        imp.kill()
        heard, _ = imp.communicate()
    assert "quit" in heard
    assert r.returncode == 125, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == (f"gpusandbox: error: MPS daemon for GPU 0 (pid {daemon['pid']}) still "
                        f"runs after 'quit': the control socket in {daemon['pipe']} did not "
                        "reach it"), r.stderr
    assert lines[1].startswith(f"hint: stop it with 'kill {daemon['pid']}'"), r.stderr
    assert os.path.exists(f"/proc/{daemon['pid']}/exe")


def test_a_sandbox_cannot_plant_the_pid_file(runner, sim_host, rootfs, daemon):
    """Item 6, from a sandbox: the pid file cannot be replaced by a FIFO
    (which made host `mps status` and the next launch hang)."""
    plant = ("import os\np = '/run/nvidia-mps/" + PID_FILE + "'\ntry:\n"
             "    os.unlink(p)\n    os.mkfifo(p)\n    print('planted')\n"
             "except OSError as e:\n    print(e.errno)\n")
    r = runner.run(["--driver-root", sim_host.root, "--gpus", "0", "--gpu-memory", "1G",
                    str(rootfs), "python3", "-c", plant])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["30"], r.stdout     # EROFS
    st = status(runner, sim_host)
    assert st["running"] and st["pid"] == daemon["pid"], st


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_planted_pid_file_neither_hangs_nor_is_followed(runner, test_user, sim_host, rootfs,
                                                          shared_tmp, kind):
    """Item 6, on the host: a pid file that is a FIFO or a link (to another
    file of the victim's: root's under /root) is refused by `mps status` and
    the next launch with one line, without hanging and without reading what
    the link leads to; `mps down` still stops the daemon and removes it."""
    c = Canaries.plant(str(shared_tmp), [test_user])
    r = mps(runner, sim_host, "up")
    assert r.returncode == 0, r.stderr
    before = status(runner, sim_host)
    try:
        pid_file = os.path.join(before["pipe"], PID_FILE)
        victim = "root" if runner.mode == "root" else test_user.pw_name
        plant = (f"rm -f {pid_file} && mkfifo {pid_file}" if kind == "fifo" else
                 f"rm -f {pid_file} && ln -s {c.dirs[victim]}/secret {pid_file}")
        res = as_user(victim_user(runner), ["sh", "-c", plant])
        assert res.returncode == 0, res.stderr
        st = status(runner, sim_host)
        why = "not a regular file" if kind == "fifo" else "a symlink"
        assert st["running"] is False and why in st.get("error", ""), st
        r = runner.run(["--driver-root", sim_host.root, "--gpus", "0", "--gpu-memory", "1G",
                        str(rootfs), "true"], timeout=30)
        assert r.returncode == 125, r.stderr
        lines = r.stderr.splitlines()
        assert len(lines) == 2 and lines[0].startswith("gpusandbox: error: MPS daemon for GPU 0")
        assert why in lines[0] and "gpusandbox mps down --gpus 0" in lines[1], r.stderr
        c.check(json.dumps(st), r.stderr)
        r = mps(runner, sim_host, "down", timeout=30)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)[0]["stopped"] is True
        assert wait_for(lambda: not os.path.exists(f"/proc/{before['pid']}/exe"), 10)
        assert not os.path.exists(before["dir"])
        c.check()
    finally:
        if os.path.exists(f"/proc/{before['pid']}/exe"):
            os.kill(before["pid"], signal.SIGKILL)
        c.remove()


def test_the_server_follows_no_link_planted_in_shm(runner, test_user, sim_host, rootfs,
                                                   shared_tmp, daemon):
    """Suspected item: shm/ is the sandboxes' /dev/shm and the daemon's; in
    the daemon's mount namespace (where its servers run, root's for root)
    a link a sandbox planted there is not followed."""
    c = Canaries.plant(str(shared_tmp), [test_user])
    try:
        victim = "root" if runner.mode == "root" else test_user.pw_name
        target = f"{c.dirs[victim]}/secret"
        r = runner.run(["--driver-root", sim_host.root, "--gpus", "0", "--gpu-memory", "1G",
                        str(rootfs), "ln", "-s", target, "/dev/shm/gsbx-planted"])
        assert r.returncode == 0, r.stderr
        assert os.path.islink(os.path.join(daemon["shm"], "gsbx-planted"))
        enter = ["nsenter", f"--target={daemon['pid']}", "--mount"]
        if runner.mode == "rootless":
            enter += ["--user", "--preserve-credentials"]
        res = as_user(victim_user(runner), enter + ["cat", "/dev/shm/gsbx-planted"])
        assert res.returncode != 0, res.stdout
        assert "Too many levels of symbolic links" in res.stderr, res.stderr
        c.check(res.stdout, res.stderr)
        # The daemon's own segment is still there for its clients.
        res = as_user(victim_user(runner), enter + ["ls", "/dev/shm"])
        assert f"cuda.shm.sim.{daemon['pid']}" in res.stdout.split(), res.stdout + res.stderr
    finally:
        c.remove()
