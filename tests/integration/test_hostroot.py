"""The host's own userland as the image (`gpusandbox run / CMD`, issue 26), as
root and as an unprivileged user: the host's root read-only, the homes
hidden, fresh /tmp and /run, host sockets covered, GPUs only from the
selection (the simulated host as the driver root), nothing of the host
changed; `--profile untrusted`; the refusals of --rw and --writable-tmpfs.

Each launch runs in a private mount namespace of the test's child with a
tmpfs on /home holding the caller's home and a secret, so a home with
content exists without touching this machine's /home."""
import os
import shutil
import signal
import subprocess
import uuid

import pytest

from .conftest import wait_for
from .crossuser import Canaries
from .nsrun import scratch_dir
from .test_gpu_cli import CONTROL, nvidia_names, smi_uuids

IFACES = "/usr/bin/python3 -c 'import socket; print(\"ifaces\", *sorted(n for _, n in socket.if_nameindex()))'"
CONNECT = ("/usr/bin/python3 -c 'import socket, sys\n"
           "s = socket.socket(socket.AF_UNIX)\n"
           "try:\n s.connect(sys.argv[1]); print(\"connected\")\n"
           "except OSError as e:\n print(\"refused\", e.errno)' ")


def home_of(runner):
    return "/root" if runner.mode == "root" else runner.user.pw_dir


def with_home(runner, args, secret, env=None, cwd="/"):
    """The CLI (args after `run`) in a private mount namespace whose /home
    is a fresh tmpfs holding the caller's home with a secret file (for root,
    /root keeps its own); after it, the home's listing on the host side."""
    home = home_of(runner)
    setup = "mount -t tmpfs -o mode=0755 tmpfs /home\n"
    if runner.mode != "root":
        setup += (f"mkdir -m 0700 {home}\necho {secret} > {home}/secret\n"
                  f"chown -R {runner.uid}:{runner.gid} {home}\n")
    script = setup + f'set +e\n"$@"\necho "rc=$?"\necho ---host-home---\nls -A {home}\n'
    argv = ["unshare", "--mount", "--propagation", "private", "sh", "-ec", script, "sh",
            *runner.argv(args)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                         env=runner.env(env), cwd=cwd)
    out, _, listing = res.stdout.partition("---host-home---\n")
    body, _, rc = out.rpartition("rc=")
    return int(rc.strip() or -1), body, res.stderr, listing.split()


class Listener:
    """A unix socket listening at `path` as `user` (None: root)."""

    def __init__(self, path, user=None):
        argv = ["/usr/bin/python3", "-c", "import socket, sys, time\n"
                "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
                "time.sleep(300)", path]
        if user is not None:
            argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                    "--clear-groups", "--"] + argv
        self.proc = subprocess.Popen(argv)
        assert wait_for(lambda: os.path.exists(path)), "the listener did not start"

    def stop(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def host_dir(runner):
    """A host directory outside /tmp and the homes that the caller could
    write on the host (0777), holding a listening unix socket."""
    d = scratch_dir("hostroot")
    os.chmod(d, 0o777)
    sock = Listener(str(d / "agent.sock"), None if runner.mode == "root" else runner.user)
    yield d
    sock.stop()
    shutil.rmtree(d, ignore_errors=True)


def test_host_root_read_only_homes_hidden_host_unchanged(runner, test_user, shared_tmp,
                                                         host_dir):
    canaries = Canaries.plant(shared_tmp, [test_user])
    name = f"gsbx-hostroot-{uuid.uuid4().hex[:8]}"
    secret = uuid.uuid4().hex
    script = (f"cat $HOME/secret /home/*/secret /root/*/secret 2>/dev/null; "
              f"echo home=$HOME; ls -A $HOME /root; "
              f"for p in /etc/{name} /var/tmp/{name} /usr/{name} {host_dir}/{name}; do "
              f"touch $p 2>/dev/null && echo wrote $p; done; "
              f"touch $HOME/{name} && echo home-write-ok; "
              f"touch /tmp/{name} && echo tmp-write-ok; "
              f"{CONNECT} {host_dir}/agent.sock; echo end")
    try:
        rc, out, err, listing = with_home(runner, ["/", "sh", "-c", script], secret)
        assert rc == 0, err
        assert out.rstrip().endswith("end"), out
        assert secret not in out and "wrote" not in out, out
        assert f"home={home_of(runner)}" in out
        assert "home-write-ok" in out and "tmp-write-ok" in out
        # The socket sits on a host directory the caller may reach: covered.
        assert "refused" in out and "connected" not in out, out
        # Nothing of the host changed: the home, the system directories, the
        # world-writable host directory, the canaries.
        if runner.mode != "root":
            assert listing == ["secret"]
        assert name not in listing
        for p in (f"/etc/{name}", f"/var/tmp/{name}", f"/usr/{name}"):
            assert not os.path.lexists(p), p
        assert sorted(os.listdir(host_dir)) == ["agent.sock"]
        canaries.check(out, err)
    finally:
        canaries.remove()


def test_host_root_gpu_nodes_from_the_selection_and_no_network(runner, sim_host):
    # The simulated driver root is not the host's: its files come under
    # /run/gpusandbox, and nothing is placed over the host's own directories.
    script = (f"nvidia-smi -L; command -v nvidia-smi; ls /usr/bin/nvidia-smi 2>&1; "
              f"echo \"homes=$(ls -A $HOME; ls -A /root).\"; ls -A /dev; {IFACES}")
    rc, out, err, _ = with_home(runner, ["--driver-root", sim_host.root, "--gpus", "0",
                                         "--net", "none", "/", "sh", "-c", script], "x")
    assert rc == 0, err
    assert smi_uuids(out) == [sim_host.gpus[0]["uuid"]]
    assert "/run/gpusandbox/bin/nvidia-smi\n" in out
    assert "No such file" in out and "homes=." in out, out
    assert nvidia_names(out.split("ifaces")[0]) == {"nvidia0"} | CONTROL
    assert out.split("ifaces")[1].split() == ["lo"]
    # Without a selection: no GPU node.
    rc, out, err, _ = with_home(runner, ["--driver-root", sim_host.root, "/", "sh", "-c",
                                         "ls -A /dev"], "x")
    assert rc == 0, err
    assert nvidia_names(out) == set()


def test_host_mounts_made_later_stay_out(runner):
    """The clone of the host's tree is private: a mount the host makes while
    the sandbox runs (a USB stick, an automounted share) never appears there
    with the host's flags.  Run in a private mount namespace whose mounts
    are shared, so that without this they would propagate in."""
    d = scratch_dir("hostroot-prop")
    inner = (f"echo > {d}/started; while [ ! -e {d}/go ]; do sleep 0.1; done; "
             f"ls -A {d}/sub; touch {d}/sub/x 2>/dev/null && echo wrote; echo end")
    script = (f"mount -t tmpfs -o mode=0777 tmpfs {d}\nmkdir -m 0777 {d}/sub\n"
              f"mkfifo -m 0666 {d}/started\n"
              '"$@" &\n'
              f"read x < {d}/started\nmount -t tmpfs -o mode=0777 tmpfs {d}/sub\n"
              f"touch {d}/sub/PROPAGATED {d}/go\nwait $!\n")
    try:
        res = subprocess.run(["unshare", "--mount", "--propagation", "shared", "sh", "-ec",
                              script, "sh", *runner.argv(["/", "sh", "-c", inner])],
                             capture_output=True, text=True, timeout=120, env=runner.env())
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == ["end"], res.stdout
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_profile_untrusted_only_the_current_directory_is_writable(runner, host_dir):
    project = scratch_dir("hostroot-project")
    os.chown(project, runner.uid, runner.gid)
    other = scratch_dir("hostroot-other")
    os.chmod(other, 0o777)
    name = f"gsbx-untrusted-{uuid.uuid4().hex[:8]}"
    script = (f"pwd; touch {name} && echo cwd-write-ok; "
              f"for p in /var/tmp/{name} {other}/{name} /etc/{name}; do "
              f"touch $p 2>/dev/null && echo wrote $p; done; "
              "echo sock=${SSH_AUTH_SOCK:-unset} dbus=${DBUS_SESSION_BUS_ADDRESS:-unset}; "
              f"ls /run/user 2>/dev/null || echo no-run-user; {IFACES}; "
              f"{CONNECT} {host_dir}/agent.sock")
    env = {"SSH_AUTH_SOCK": f"{host_dir}/agent.sock",
           "DBUS_SESSION_BUS_ADDRESS": f"unix:path={host_dir}/agent.sock"}
    try:
        rc, out, err, _ = with_home(runner, ["--profile", "untrusted", "--env-host", "/", "sh",
                                             "-c", script], "x", env=env, cwd=str(project))
        assert rc == 0, err
        lines = out.splitlines()
        assert lines[0] == str(project)
        assert "cwd-write-ok" in out and "wrote" not in out, out
        assert os.path.exists(project / name)
        assert os.listdir(other) == []
        assert "sock=unset dbus=unset" in out
        assert "no-run-user" in out
        assert "ifaces lo" in out
        assert "refused" in out and "connected" not in out
        if runner.mode == "root":
            assert "--profile untrusted under root without --user" in err
    finally:
        shutil.rmtree(project, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


@pytest.mark.parametrize("opt", ["--rw", "--writable-tmpfs"])
def test_host_root_refuses_writable_root_modes(runner, opt):
    name = f"gsbx-hostroot-{uuid.uuid4().hex[:8]}"
    r = runner.run([opt, "/", "touch", f"/var/tmp/{name}"])
    assert r.returncode == 125
    lines = r.stderr.splitlines()
    assert lines[0].startswith(f"gpusandbox: error: {opt} with the host's root (/)"), r.stderr
    assert len(lines) == 2 and lines[1].startswith("hint: drop " + opt)
    assert not os.path.lexists(f"/var/tmp/{name}")


def test_host_root_bind_target_must_exist(runner, shared_tmp):
    r = runner.run(["-v", f"{shared_tmp}:/gsbx-no-such-dir", "/", "true"])
    assert r.returncode == 125
    assert r.stderr.startswith("gpusandbox: error: -v ") and "does not exist on the host" \
        in r.stderr, r.stderr
    assert not os.path.lexists("/gsbx-no-such-dir")


def test_doctor_host_root(runner, sim_host):
    r = runner.run(["doctor", "--driver-root", sim_host.root, "--gpus", "0", "/"], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the host's own userland" in r.stdout
    assert [ln for ln in r.stdout.splitlines() if "CUDA in sandbox" in ln][0].split()[0] \
        == "PASS", r.stdout
