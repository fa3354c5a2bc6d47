"""Live sandboxes through the CLI (docs/live.md): run -d/--name, ps, exec,
logs, stop, kill, wait, rm, as root and as the unprivileged test user; a
second user's attempts; a sandbox steering a later exec; kill -9 of
everything.  Each test uses names of its own (tests run side by side)."""
import json
import os
import shlex
import shutil
import signal
import subprocess

import pytest

from .conftest import Runner, comm, pids_with, wait_for

# What the sandbox's command and an exec both print about themselves.
PROBE = ("id -u; id -g; grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status; "
         "for n in mnt pid net user uts ipc cgroup; do readlink /proc/self/ns/$n; done; "
         "cat /proc/self/cgroup; pwd; env | grep -vE '^(PWD|SHLVL|_|OLDPWD)=' | sort")


def gsbx(runner, *args, timeout=60, input=None, env=None):
    """The CLI (any command) as the runner's user."""
    argv = [runner.cli, *args]
    if runner.mode == "rootless":
        argv = ["setpriv", f"--reuid={runner.user.pw_uid}", f"--regid={runner.user.pw_gid}",
                "--clear-groups", "--"] + argv
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env=runner.env(env), cwd="/", input=input)


def uniq(prefix="t"):
    return f"{prefix}-{os.urandom(4).hex()}"


def ps(runner, *opts):
    r = gsbx(runner, "ps", "--json", *opts)
    assert r.returncode == 0, r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)}


def start(runner, rootfs, name, script, *opts):
    r = gsbx(runner, "run", "-d", "--name", name, *opts, str(rootfs), "sh", "-c", script)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{name}\n"
    return r


def finish(runner, name):
    gsbx(runner, "rm", "-f", name)


def live_dir(runner):
    if runner.mode == "root":
        return "/run/gpusandbox/live"
    # No XDG_RUNTIME_DIR in the runner's environment: /run/user/UID when the
    # node has one for the user (gpusandbox/rundir.py), else the /tmp base.
    run_user = f"/run/user/{runner.uid}"
    if os.path.isdir(run_user) and os.stat(run_user).st_uid == runner.uid:
        return os.path.join(run_user, "gpusandbox", "live")
    return os.path.join(f"/tmp/gpusandbox-{runner.uid}", "live")


def test_detach_ps_exec_logs_stop_rm(runner, rootfs):
    name = uniq()
    marker = f"600.{os.getpid()}{int.from_bytes(os.urandom(3), 'big')}"
    try:
        start(runner, rootfs, name, f"{PROBE}; echo ---; exec sleep {marker}")
        rec_dir = os.path.join(live_dir(runner), name)
        assert os.path.isfile(os.path.join(rec_dir, "record.json"))
        assert os.stat(rec_dir).st_uid == runner.uid and os.stat(rec_dir).st_mode & 0o777 == 0o700
        rows = ps(runner)
        assert rows[name]["state"] == "running" and rows[name]["pid"] > 0
        assert rows[name]["image"] == str(rootfs) and rows[name]["command"][0] == "sh"
        plain = gsbx(runner, "ps")
        assert name in plain.stdout and "running" in plain.stdout
        # Its command's view, from its log, once written.
        logged = wait_for(lambda: "---" in gsbx(runner, "logs", name).stdout and
                          gsbx(runner, "logs", name).stdout)
        assert logged, "the detached command wrote nothing to its log"
        mine = logged.split("---")[0]
        r = gsbx(runner, "exec", name, "sh", "-c", PROBE)
        assert r.returncode == 0, r.stderr
        # Same uid, gid, capabilities, no_new_privs, seccomp mode,
        # namespaces, cgroup, working directory and environment.
        assert r.stdout == mine
        assert "NoNewPrivs:\t1" in mine and "Seccomp:\t2" in mine
        # The exec'd process is in init's cgroup leaf, seen from the host.
        probe = f"700.{int.from_bytes(os.urandom(3), 'big')}"
        p = subprocess.Popen([*(["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
                                 "--clear-groups", "--"] if runner.mode == "rootless" else []),
                              runner.cli, "exec", name, "sleep", probe],
                             env=runner.env(), cwd="/", stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        try:
            inner = wait_for(lambda: [x for x in pids_with(probe) if comm(x) == "sleep"])
            assert inner, "exec'd sleep not found"
            cmd = [x for x in pids_with(marker) if comm(x) == "sleep"][0]
            with open(f"/proc/{inner[0]}/cgroup") as a, open(f"/proc/{cmd}/cgroup") as b:
                assert a.read() == b.read()
            # Signals to exec reach the process: its status passes through.
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=20) == 128 + signal.SIGTERM
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert gsbx(runner, "exec", name, "sh", "-c", "exit 7").returncode == 7
        assert gsbx(runner, "exec", name, "sh", "-c", "kill -KILL $$").returncode == 137
        r = gsbx(runner, "exec", "-e", "FOO=bar", "-w", "/tmp", name, "sh", "-c",
                 "echo $FOO; pwd")
        assert r.returncode == 0 and r.stdout == "bar\n/tmp\n", r.stderr
        r = gsbx(runner, "exec", name, "no-such-command")
        assert r.returncode == 127 and "command not found" in r.stderr
        r = gsbx(runner, "stop", "-t", "10", name)
        assert r.returncode == 0 and r.stdout == f"{name}\n", r.stderr
        # The log's writer ends once the launcher has (it holds the marker too).
        assert wait_for(lambda: not pids_with(marker), timeout=10)
        rows = ps(runner, "-a")
        assert rows[name]["state"] == "exited" and rows[name]["exit_code"] == 143
        assert name not in ps(runner)
        assert gsbx(runner, "wait", name).stdout == "143\n"
        r = gsbx(runner, "exec", name, "true")
        assert r.returncode == 125 and f"sandbox '{name}' is not running" in r.stderr
        r = gsbx(runner, "rm", name)
        assert r.returncode == 0, r.stderr
        assert name not in ps(runner, "-a")
        assert not os.path.exists(os.path.join(live_dir(runner), name))
    finally:
        finish(runner, name)


def test_names_clash_per_user_and_foreground_leaves_no_record(runner, rootfs):
    name = uniq()
    try:
        start(runner, rootfs, name, "exec sleep 600")
        for opts in (["-d"], []):
            r = gsbx(runner, "run", *opts, "--name", name, str(rootfs), "true")
            assert r.returncode == 125
            assert f"the name '{name}' is in use by a running sandbox of yours" in r.stderr
        assert ps(runner)[name]["state"] == "running"
    finally:
        finish(runner, name)
    # A foreground named sandbox is listed while it runs and leaves nothing.
    other = uniq()
    r = gsbx(runner, "run", "--name", other, str(rootfs), "sh", "-c", "exit 3")
    assert r.returncode == 3, r.stderr
    assert other not in ps(runner, "-a")
    assert not os.path.exists(os.path.join(live_dir(runner), other))


def test_detached_launch_error_reaches_the_caller_and_leaves_nothing(runner, rootfs):
    name = uniq()
    r = gsbx(runner, "run", "-d", "--name", name, str(rootfs), "no-such-command")
    assert r.returncode == 127 and "command not found in the image" in r.stderr
    assert name not in ps(runner, "-a")
    assert not os.path.exists(os.path.join(live_dir(runner), name))
    r = gsbx(runner, "run", "-d", "-t", str(rootfs), "true")
    assert r.returncode == 125 and "-t and -d together" in r.stderr


def test_detach_without_name_picks_one_and_rm_removes(runner, rootfs):
    r = gsbx(runner, "run", "-d", "--rm", str(rootfs), "sh", "-c", "echo out; exit 0")
    assert r.returncode == 0, r.stderr
    name = r.stdout.strip()
    assert name.startswith(os.path.basename(str(rootfs)) + "-")
    # --rm: gone once it ended.
    assert wait_for(lambda: name not in ps(runner, "-a"), timeout=20)


def test_exec_tty_through_a_pty(runner, rootfs):
    name = uniq()
    try:
        start(runner, rootfs, name, "exec sleep 600")
        inner = f"{runner.cli} exec -t {name} sh -c 'tty; stty size; echo T=$TERM'"
        if runner.mode == "rootless":
            inner = (f"setpriv --reuid={runner.uid} --regid={runner.gid} --clear-groups -- "
                     + inner)
        r = subprocess.run(["script", "-qec", f"stty rows 33 cols 77; {inner}", "/dev/null"],
                           capture_output=True, text=True, timeout=60,
                           env=runner.env({"TERM": "xterm-256color"}), cwd="/")
        assert r.returncode == 0, r.stdout + r.stderr
        out = r.stdout.replace("\r", "")
        assert "/dev/pts/" in out and "33 77" in out and "T=xterm-256color" in out
    finally:
        finish(runner, name)


def test_other_user_can_neither_see_nor_touch(runner, rootfs, attacker):
    name = uniq()
    try:
        start(runner, rootfs, name, "echo secret-log-line; exec sleep 600")
        assert name not in ps(attacker, "-a")
        if runner.mode == "rootless":
            # Real root lists everyone's it finds, labelled by owner.
            rows = ps(Runner(runner.cli, "root", runner.user), "-a")
            assert rows[name]["owner"] == runner.uid and rows[name]["state"] == "running"
        for args in (["exec", name, "id"], ["stop", "-t", "0", name], ["kill", name],
                     ["logs", name], ["rm", "-f", name], ["wait", name]):
            r = gsbx(attacker, *args, timeout=20)
            assert r.returncode == 125 and f"no sandbox named '{name}'" in r.stderr, args
            assert "secret-log-line" not in r.stdout + r.stderr
        # The same name is the attacker's own sandbox, not the victim's.
        start(attacker, rootfs, name, "exec sleep 600")
        gsbx(attacker, "stop", "-t", "0", name)
        gsbx(attacker, "rm", name)
        rows = ps(runner)
        assert rows[name]["state"] == "running"
        # Signalling the victim's init by number is the kernel's to refuse.
        r = subprocess.run(["setpriv", f"--reuid={attacker.uid}", f"--regid={attacker.gid}",
                            "--clear-groups", "--", "kill", "-9", str(rows[name]["pid"])],
                           capture_output=True, text=True)
        assert r.returncode != 0
        assert ps(runner)[name]["state"] == "running"
    finally:
        finish(runner, name)


def test_the_sandbox_cannot_steer_a_later_exec(runner, rootfs):
    """The command rewrites what it controls (its environment, its cwd, a
    file under the working directory): exec still starts from the record."""
    name = uniq()
    try:
        start(runner, rootfs, name,
              "cd /tmp && mkdir -p d && exec env -i EVIL=1 PATH=/nowhere /bin/sleep 600")
        r = gsbx(runner, "exec", name, "sh", "-c", "pwd; echo EVIL=${EVIL-unset}; echo $PATH")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "/" and lines[1] == "EVIL=unset" and "/usr/bin" in lines[2]
        # Grants nothing the command lacks: the same bounding set and no_new_privs.
        r = gsbx(runner, "exec", name, "grep", "-E", "^(CapBnd|NoNewPrivs)", "/proc/self/status")
        assert "NoNewPrivs:\t1" in r.stdout
    finally:
        finish(runner, name)


def test_kill9_of_everything_then_ps_and_rm(runner, rootfs):
    name = uniq()
    marker = f"601.{int.from_bytes(os.urandom(3), 'big')}"
    start(runner, rootfs, name, f"exec sleep {marker}")
    pid = ps(runner)[name]["pid"]
    with open(f"/proc/{pid}/stat") as f:
        launcher = int(f.read().rsplit(")", 1)[1].split()[1])
    os.kill(launcher, signal.SIGKILL)
    assert wait_for(lambda: not pids_with(marker), timeout=10)
    # The stale record is cleaned on sight.
    assert name not in ps(runner, "-a")
    assert not os.path.exists(os.path.join(live_dir(runner), name))
    r = gsbx(runner, "rm", name)
    assert r.returncode == 125 and f"no sandbox named '{name}'" in r.stderr
    # The name is free again.
    start(runner, rootfs, name, "true")
    assert wait_for(lambda: ps(runner, "-a")[name]["state"] == "exited", timeout=20)
    assert gsbx(runner, "rm", name).returncode == 0


def test_kill_signal_and_bad_input(runner, rootfs):
    name = uniq()
    try:
        start(runner, rootfs, name, "trap 'echo got-usr1; exit 5' USR1; while :; do sleep 1; done")
        r = gsbx(runner, "kill", "-s", "USR1", name)
        assert r.returncode == 0, r.stderr
        assert wait_for(lambda: ps(runner, "-a")[name]["state"] == "exited", timeout=20)
        assert ps(runner, "-a")[name]["exit_code"] == 5
        assert "got-usr1" in gsbx(runner, "logs", name).stdout
        r = gsbx(runner, "kill", "-s", "NOPE", name)
        assert r.returncode == 125 and "invalid --signal" in r.stderr
        r = gsbx(runner, "exec", "bad/name", "true")
        assert r.returncode == 125 and "invalid sandbox name" in r.stderr
        r = gsbx(runner, "run", "--name", "-x", str(rootfs), "true")
        assert r.returncode == 125 and "invalid sandbox name" in r.stderr
    finally:
        finish(runner, name)


def test_exec_gets_the_sandbox_gpus_on_the_simulated_host(runner, rootfs, sim_host):
    from .test_gpu_cli import smi_uuids
    name = uniq()
    want = sim_host.gpus[1]["uuid"]
    try:
        start(runner, rootfs, name, "ls /dev | grep nvidia | sort; echo ---; exec sleep 600",
              "--driver-root", sim_host.root, "--gpus", "device=1")
        row = ps(runner)[name]
        assert row["gpus"], row
        logged = wait_for(lambda: "---" in gsbx(runner, "logs", name).stdout and
                          gsbx(runner, "logs", name).stdout)
        r = gsbx(runner, "exec", name, "sh", "-c", "ls /dev | grep nvidia | sort")
        assert r.returncode == 0 and r.stdout == logged.split("---")[0], r.stderr
        r = gsbx(runner, "exec", name, "nvidia-smi", "-L")
        assert r.returncode == 0, r.stderr
        assert smi_uuids(r.stdout) == [want]
    finally:
        finish(runner, name)


def test_stop_a_foreground_named_sandbox(runner, rootfs):
    name = uniq()
    p = runner.popen(["--name", name, str(rootfs), "sh", "-c", "exec sleep 600"])
    try:
        assert wait_for(lambda: ps(runner).get(name, {}).get("state") == "running", timeout=20)
        r = gsbx(runner, "stop", "-t", "5", name)
        assert r.returncode == 0, r.stderr
        assert p.wait(timeout=20) == 128 + signal.SIGTERM
        assert name not in ps(runner, "-a")
        assert not os.path.exists(os.path.join(live_dir(runner), name))
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_exec_user_only_drops_privilege(runner, rootfs):
    name = uniq()
    try:
        start(runner, rootfs, name, "exec sleep 600", *(["--root"] if runner.mode == "rootless"
                                                        else []))
        r = gsbx(runner, "exec", "-u", "0", name, "id", "-u")
        assert r.returncode == 0 and r.stdout == "0\n", r.stderr
        r = gsbx(runner, "exec", "--user", "1000:1000", name, "sh", "-c",
                 "id -u; id -g; grep CapEff /proc/self/status")
        if runner.mode == "root":
            assert r.returncode == 0, r.stderr
            assert r.stdout.splitlines() == ["1000", "1000", "CapEff:\t0000000000000000"]
        else:
            # One id mapped (rootless --root): no other uid exists inside.
            assert r.returncode == 125 and r.stderr.startswith("gpusandbox: error: ")
        r = gsbx(runner, "exec", "-u", "x", name, "true")
        assert r.returncode == 125 and "invalid --user" in r.stderr
    finally:
        finish(runner, name)
    # A non-root command: exec keeps its identity.
    if runner.mode == "rootless":
        name = uniq()
        try:
            start(runner, rootfs, name, "exec sleep 600")
            r = gsbx(runner, "exec", "-u", "0", name, "id", "-u")
            assert r.returncode == 125 and "the sandbox's command runs as uid" in r.stderr
        finally:
            finish(runner, name)


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux not installed")
def test_exec_tty_follows_window_size_changes(runner, rootfs):
    name = uniq()
    sock = f"gsbx-live-{os.urandom(3).hex()}"
    inner = f"{runner.cli} exec -t {name} sh -c " + shlex.quote(
        "stty size; trap 'stty size' WINCH; while :; do sleep 0.1; done")
    if runner.mode == "rootless":
        inner = f"setpriv --reuid={runner.uid} --regid={runner.gid} --clear-groups -- " + inner

    def tmux(*args):
        return subprocess.run(["tmux", "-L", sock, *args], capture_output=True, text=True,
                              timeout=20, env=runner.env({"TERM": "xterm"}))

    def pane():
        return [ln for ln in tmux("capture-pane", "-p").stdout.splitlines() if ln.strip()]
    try:
        start(runner, rootfs, name, "exec sleep 600")
        assert tmux("new-session", "-d", "-x", "80", "-y", "24", inner).returncode == 0
        assert wait_for(lambda: "24 80" in pane(), timeout=20), pane()
        assert tmux("resize-window", "-x", "100", "-y", "40").returncode == 0
        assert wait_for(lambda: "40 100" in pane(), timeout=20), pane()
    finally:
        tmux("kill-server")
        finish(runner, name)
