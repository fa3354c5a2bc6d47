"""`gpusandbox run` as a user sees it, as root and as an unprivileged user."""
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import time

import pytest

from . import nsrun
from .conftest import host_mounts, pids_with, subid_range, tree_checksum, wait_for


def sh(runner, rootfs, script, *opts, env=None, timeout=60):
    return runner.run([*opts, str(rootfs), "sh", "-c", script], env=env, timeout=timeout)


def test_identity_inside(runner, rootfs):
    r = sh(runner, rootfs, "id -u; id -g")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(runner.uid), str(runner.gid)]


def test_fakeroot_maps_caller_to_root(rootless_runner, rootfs):
    r = sh(rootless_runner, rootfs, "id -u; cat /proc/self/uid_map", "--root")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == "0"
    assert lines[1].split() == ["0", str(rootless_runner.user.pw_uid), "1"]


def test_user_option_under_root(root_runner, rootfs):
    r = sh(root_runner, rootfs, "id -u; id -g; id -G; grep Cap /proc/self/status",
           "--user", "1000:1000")
    assert r.returncode == 0, r.stderr
    out = r.stdout.split("\n")
    assert out[:3] == ["1000", "1000", "1000"]
    assert "CapEff:\t0000000000000000" in r.stdout
    assert "CapBnd:\t0000000000000000" in r.stdout


def test_user_option_refused_rootless(rootless_runner, rootfs):
    r = sh(rootless_runner, rootfs, "true", "--user", "0")
    assert r.returncode == 125
    assert "--user needs real root" in r.stderr


def test_pid_namespace_and_init(runner, rootfs):
    r = sh(runner, rootfs, "echo $$; cat /proc/1/comm; ls /proc | grep -c '^[0-9]'")
    assert r.returncode == 0, r.stderr
    pid, comm, count = r.stdout.split()
    assert pid == "2"
    assert comm == "gpusandbox-init"
    assert int(count) <= 4  # init, sh, ls, grep


def test_hostname(runner, rootfs):
    assert sh(runner, rootfs, "hostname").stdout.strip() == "gpusandbox"
    assert sh(runner, rootfs, "hostname", "--hostname", "node7").stdout.strip() == "node7"


def test_root_read_only_with_writable_tmpfs_dirs(runner, rootfs):
    r = sh(runner, rootfs, "touch /etc/x 2>&1; touch /tmp/a /run/b /dev/shm/c && echo writable")
    assert "Read-only file system" in r.stdout
    assert "writable" in r.stdout
    assert not (rootfs / "etc" / "x").exists()


def test_writable_tmpfs_is_private_and_discarded(runner, small_rootfs):
    # Rootless users run images they unpacked themselves, so they own the files.
    rootfs = small_rootfs
    if runner.mode == "rootless":
        subprocess.run(["chown", "-R", f"{runner.uid}:{runner.gid}", str(rootfs)], check=True)
    before = tree_checksum(rootfs)
    r = sh(runner, rootfs, "echo hi > /etc/newfile && cat /etc/newfile && rm /etc/passwd && "
           "echo gone", "--writable-tmpfs")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["hi", "gone"]
    assert (rootfs / "etc" / "passwd").exists()
    assert tree_checksum(rootfs) == before


def test_rw_writes_through(runner, small_rootfs):
    os.chown(small_rootfs / "home", runner.uid, runner.gid)
    r = sh(runner, small_rootfs, "echo kept > /home/out", "--rw")
    assert r.returncode == 0, r.stderr
    assert (small_rootfs / "home" / "out").read_text() == "kept\n"
    assert os.stat(small_rootfs / "home" / "out").st_uid == runner.uid


def test_dev_contents(runner, rootfs):
    r = sh(runner, rootfs, "ls -A /dev | sort | tr '\\n' ' '")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == sorted(["core", "fd", "full", "null", "ptmx", "pts", "random",
                                       "shm", "stderr", "stdin", "stdout", "tty", "urandom",
                                       "zero"])
    r = sh(runner, rootfs, "head -c 4 /dev/urandom | wc -c; echo x > /dev/null && echo ok")
    assert r.stdout.split() == ["4", "ok"]


def test_proc_masked_and_read_only(runner, rootfs):
    assert os.path.exists("/proc/keys")
    r = sh(runner, rootfs, "wc -c < /proc/keys; head -c 10 /proc/timer_list | wc -c; "
           "echo 1 > /proc/sys/kernel/domainname 2>/dev/null || echo sys-ro; "
           "echo h > /proc/sysrq-trigger 2>/dev/null || echo sysrq-ro; "
           "ls -A /sys/firmware | wc -l; touch /sys/x 2>/dev/null || echo sysfs-ro")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0", "sys-ro", "sysrq-ro", "0", "sysfs-ro"]


def test_host_tree_unreachable(runner, rootfs):
    r = sh(runner, rootfs, "ls /; echo --; cat /proc/self/mountinfo")
    assert r.returncode == 0, r.stderr
    listing, mountinfo = r.stdout.split("\n--\n")
    assert "oldroot" not in r.stdout
    # The host's /work or /root never appears: only the image's own entries.
    assert set(listing.split()) <= set(os.listdir(rootfs)) | {"proc", "sys", "dev", "tmp", "run"}
    # Every mount the command can see sits on the new root or on the paths the
    # sandbox mounts; none is a host mount point (the old root's mounts, kept
    # without the detach, would bring /, /work, /opt... of the host). The
    # image's path may appear only as the overlay's lowerdir option.
    points = [line.split()[4] for line in mountinfo.splitlines()]
    assert points.count("/") == 1, points
    strays = [p for p in points if p != "/" and p.split("/")[1] not in
              ("proc", "sys", "dev", "tmp", "run")]
    assert not strays, strays
    assert not [p for p in points if str(rootfs) in p], points


def test_bind_mounts(runner, rootfs, shared_tmp):
    data = shared_tmp / "data"
    data.mkdir()
    os.chmod(shared_tmp, 0o755)
    os.chown(data, runner.uid, runner.gid)
    (data / "in.txt").write_text("from host\n")
    r = sh(runner, rootfs, "cat /data/in.txt; echo out > /data/out.txt; "
           "echo no > /ro/x 2>/dev/null || echo ro-refused",
           "-v", f"{data}:/data", "-v", f"{data}:/ro:ro")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["from host", "ro-refused"]
    assert os.stat(data / "out.txt").st_uid == runner.uid
    # A bind target the image lacks is created in the private overlay only.
    assert not (rootfs / "data").exists()


def test_env_precedence(runner, rootfs, shared_tmp):
    envfile = shared_tmp / "env"
    envfile.write_text("FROM_FILE=file\nIMAGE_VAR=file-wins\n# comment\n")
    os.chmod(shared_tmp, 0o755)
    os.chmod(envfile, 0o644)
    r = sh(runner, rootfs, "env | sort", "--env-file", str(envfile), "-e", "FROM_E=e",
           "-e", "FROM_FILE=e-wins", "-e", "HOSTVAR",
           env={"SLURM_JOB_ID": "42", "OMPI_X": "1", "LD_PRELOAD": "/evil.so",
                "PYTHONPATH": "/evil", "LD_LIBRARY_PATH": "/evil", "HOSTVAR": "copied",
                "OTHER_HOST": "hidden"})
    env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert env["IMAGE_VAR"] == "file-wins"
    assert env["FROM_FILE"] == "e-wins"
    assert env["FROM_E"] == "e"
    assert env["HOSTVAR"] == "copied"
    assert env["SLURM_JOB_ID"] == "42" and env["OMPI_X"] == "1"
    assert env["LANG"] == "C.UTF-8"  # from the image's /etc/environment
    for k in ("LD_PRELOAD", "PYTHONPATH", "LD_LIBRARY_PATH", "OTHER_HOST"):
        assert k not in env
    r = sh(runner, rootfs, "env", "--env-host", env={"OTHER_HOST": "now", "LD_PRELOAD": "/x"})
    assert "OTHER_HOST=now" in r.stdout and "LD_PRELOAD" not in r.stdout
    r = sh(runner, rootfs, "env", "--env-host", "-e", "LD_PRELOAD=", env={"LD_PRELOAD": "/x"})
    assert "LD_PRELOAD=\n" in r.stdout


def test_workdir(runner, rootfs):
    assert sh(runner, rootfs, "pwd").stdout.strip() == "/"
    assert sh(runner, rootfs, "pwd", "-w", "/usr/bin").stdout.strip() == "/usr/bin"
    r = sh(runner, rootfs, "pwd", "-w", "/new/dir")
    assert r.stdout.strip() == "/new/dir" and not (rootfs / "new").exists()


@pytest.mark.parametrize("script,code", [("true", 0), ("exit 1", 1), ("exit 3", 3),
                                         ("kill -TERM $$", 143), ("kill -KILL $$", 137)])
def test_exit_codes(runner, rootfs, script, code):
    assert sh(runner, rootfs, script).returncode == code


def test_a_100kb_command_name_fails_in_one_line_without_hanging(runner, rootfs):
    """The error record of the command stage is read by the launcher once init
    has exited: one that filled the pipe would block its writer for ever.
    The name is cut short in the message; the status is the usual 127."""
    name = "x" * 100_000
    r = runner.run([str(rootfs), name], timeout=60)
    assert r.returncode == 127, r.stderr[:300]
    assert r.stderr.startswith("gpusandbox: error: command not found in the image: xxx")
    assert len(r.stderr) < 4096 and r.stderr.count("\n") <= 3, r.stderr[:300]


def test_a_caller_that_ignores_sigchld_still_gets_the_status(runner, rootfs):
    """SIGCHLD ignored by the caller (SIG_IGN survives execve) makes the
    kernel reap children without a signal: the launcher and init must give
    it back its default action, or they wait for ever."""
    argv = runner.argv([str(rootfs), "/bin/sh", "-c", "echo hi; exit 3"])
    at = argv.index(runner.cli)
    argv[at:at] = ["bash", "-c", 'trap "" CHLD; exec "$@"', "bash"]   # dash resets it
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=runner.env(),
                       cwd="/")
    assert (r.returncode, r.stdout) == (3, "hi\n"), r.stderr


def test_not_found_and_not_executable(runner, rootfs):
    r = runner.run([str(rootfs), "no-such-command"])
    assert r.returncode == 127
    assert r.stderr.startswith("gpusandbox: error: command not found in the image: no-such-command")
    r = runner.run([str(rootfs), "/etc/passwd"])
    assert r.returncode == 126
    assert "cannot execute /etc/passwd" in r.stderr
    r = runner.run([str(rootfs), "/etc"])
    assert r.returncode == 126


@pytest.mark.parametrize("args,needle", [
    (["/no/such/dir", "true"], "image directory not found: /no/such/dir"),
    (["/etc/passwd", "true"], "image is not a directory"),
    (["/proc/self", "true"], "does not look like a root filesystem"),
    (["-v", "nocolon", "ROOT", "true"], "invalid --bind 'nocolon'"),
    (["-v", "/tmp:/x:rx", "ROOT", "true"], "unknown mode 'rx'"),
    (["-v", "/no/such/src:/x", "ROOT", "true"], "bind source not found: /no/such/src"),
    (["-e", "1BAD=x", "ROOT", "true"], "invalid --env '1BAD=x'"),
    (["--frobnicate", "ROOT", "true"], "unknown option '--frobnicate'"),
    (["ROOT"], "missing command"),
    (["--net", "bridge", "ROOT", "true"], "invalid --net 'bridge'"),
    (["-w", "relative", "ROOT", "true"], "invalid --workdir 'relative'"),
])
def test_bad_input_one_line_error(runner, rootfs, args, needle):
    args = [str(rootfs) if a == "ROOT" else a for a in args]
    before = host_mounts()
    r = runner.run(args)
    assert r.returncode == 125, r.stderr
    first = r.stderr.splitlines()[0]
    assert first.startswith("gpusandbox: error: ") and needle in first, r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.splitlines()) <= 2
    assert host_mounts() == before


def test_sigterm_reaches_command(runner, rootfs):
    p = runner.popen([str(rootfs), "sh", "-c",
                      "trap 'echo got-term; exit 42' TERM; echo ready; "
                      "while true; do sleep 0.05; done"])
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=20)
    assert "got-term" in out
    assert p.returncode == 42


def test_signal_death_is_128_plus_n(runner, rootfs):
    p = runner.popen([str(rootfs), "sleep", "30"])
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=20)
    assert p.returncode == 130


def test_orphans_are_reaped(runner, rootfs):
    # Children that outlive their parent are re-parented to init and reaped.
    r = sh(runner, rootfs, "for i in 1 2 3 4 5; do (sleep 0.1 &) ; done; sleep 1; "
           "cat /proc/[0-9]*/stat 2>/dev/null | awk '{print $3}' | grep -c Z || true")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


def test_kill_9_leaves_nothing(runner, rootfs, shared_tmp):
    """Neither a finished launch nor one killed with SIGKILL leaves anything
    in /tmp, /var/tmp or $XDG_RUNTIME_DIR.  The launches run in a private
    mount namespace whose /tmp and /var/tmp are empty directories of this
    test (the image is bound outside them), so other processes' files on
    this shared machine cannot hide or fake a leftover."""
    marker = "987.654321"
    before = host_mounts()
    scratch = {}
    for name in ("tmp", "var-tmp"):
        scratch[name] = shared_tmp / name
        scratch[name].mkdir()
        os.chmod(scratch[name], 0o1777)
    # Outside /tmp, which the namespace covers, like /run/user/UID.
    scratch["xdg-runtime"] = nsrun.scratch_dir("xdg-runtime")
    os.chmod(scratch["xdg-runtime"], 0o700)
    os.chown(scratch["xdg-runtime"], runner.uid, runner.gid)
    image = nsrun.scratch_dir("image")
    # /tmp last: the other sources live under it.
    setup = (f"mount --bind {rootfs} {image}\n"
             f"mount --bind {scratch['var-tmp']} /var/tmp\n"
             f"mount --bind {scratch['tmp']} /tmp")
    env = runner.env({"XDG_RUNTIME_DIR": str(scratch["xdg-runtime"]), "TMPDIR": "/tmp"})

    def leftovers():
        return {n: sorted(os.listdir(d)) for n, d in scratch.items() if os.listdir(d)}
    try:
        r = subprocess.run(nsrun.private_mounts(runner.argv([str(image), "true"]), setup),
                           capture_output=True, text=True, timeout=60, env=env, cwd="/")
        assert r.returncode == 0, r.stderr
        assert not leftovers(), leftovers()
        p = subprocess.Popen(nsrun.private_mounts(runner.argv([str(image), "sleep", marker]),
                                                  setup),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/")
        assert wait_for(lambda: pids_with(marker) and len(pids_with(marker)) >= 1)
        # unshare, sh and setpriv exec in turn: the pid started is the launcher's.
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        assert wait_for(lambda: not pids_with(marker)), "sandbox processes survived kill -9"
        assert host_mounts() == before
        assert not leftovers(), leftovers()
    finally:
        image.rmdir()
        shutil.rmtree(scratch["xdg-runtime"])


def test_no_new_privs_and_no_caps_for_user(runner, rootfs):
    if runner.mode == "root":
        opts = ["--user", "1000"]
    else:
        opts = []
    r = sh(runner, rootfs, "grep -E 'NoNewPrivs|Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status",
           *opts)
    fields = dict(line.split(":\t") for line in r.stdout.splitlines())
    assert fields["NoNewPrivs"] == "1"
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert fields[cap] == "0000000000000000", (cap, r.stdout)


def test_only_stdio_fds(runner, rootfs):
    r = sh(runner, rootfs, "ls /proc/self/fd")
    # ls itself opens the directory it lists: 0 1 2 and that one.
    assert r.stdout.split() == ["0", "1", "2", "3"]


def test_net_none_has_loopback_only(runner, rootfs):
    r = sh(runner, rootfs, "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; "
           "cat /sys/class/net/lo/operstate 2>/dev/null; "
           "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); "
           "s.listen(); c=socket.create_connection(s.getsockname()); print(\"lo-ok\")'",
           "--net", "none")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "lo"
    assert "lo-ok" in r.stdout


def test_tty_option_without_terminal_passes_stdio(runner, rootfs):
    r = runner.run(["--tty", str(rootfs), "sh", "-c", "read x; echo got-$x; tty || true"],
                   input="line\n")
    assert r.returncode == 0, r.stderr
    assert "got-line" in r.stdout
    assert "not a tty" in r.stdout


def test_tty_allocates_pty(runner, rootfs):
    # script(1) gives the launcher a terminal on stdin.
    # The pty must come from the sandbox's own devpts: the caller's terminal
    # passed straight through would live on the host's devpts instance.
    cmd = shlex.join(runner.argv(["--tty", str(rootfs), "sh", "-c",
                                  "tty; [ $(stat -L -c %d /proc/self/fd/0) = "
                                  "$(stat -c %d /dev/pts/ptmx) ] && echo own-devpts; echo ok"]))
    r = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True,
                       timeout=30, env=runner.env(), cwd="/")
    assert r.returncode == 0, r.stdout
    lines = r.stdout.replace("\r", "").splitlines()
    assert re.fullmatch(r"/dev/pts/\d+", lines[0]), r.stdout
    assert lines[1:] == ["own-devpts", "ok"], r.stdout


def test_many_sandboxes_share_one_image(runner, rootfs):
    procs = [runner.popen([str(rootfs), "sh", "-c", f"echo {i} > /tmp/x; sleep 0.3; cat /tmp/x"])
             for i in range(6)]
    outs = [p.communicate(timeout=30)[0].strip() for p in procs]
    assert outs == [str(i) for i in range(6)]
    assert all(p.returncode == 0 for p in procs)


def test_bundle_config_env_and_cwd(runner, small_rootfs, shared_tmp):
    bundle = shared_tmp / "bundle"
    bundle.mkdir()
    os.chmod(shared_tmp, 0o755)
    os.chmod(bundle, 0o755)
    os.rename(small_rootfs, bundle / "rootfs")
    (bundle / "config.json").write_text(
        '{"ociVersion": "1.0.2", "process": {"env": ["FROM_OCI=yes", "PATH=/usr/bin:/bin"],'
        ' "cwd": "/usr", "args": ["sh"]}, "root": {"path": "rootfs"}}')
    os.chmod(bundle / "config.json", 0o644)
    r = runner.run([str(bundle), "sh", "-c", "echo $FROM_OCI; pwd; echo ${IMAGE_VAR:-none}"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["yes", "/usr", "none"]
    os.rename(bundle / "rootfs", small_rootfs)


def test_bundle_rootfs_symlink_is_not_followed(runner, shared_tmp):
    """An image-provided rootfs -> / link must not make the host root the
    sandbox's root (nothing from the image is ever a mount source)."""
    bundle = shared_tmp / "evil-bundle"
    bundle.mkdir()
    os.chmod(shared_tmp, 0o755)
    os.symlink("/", bundle / "rootfs")
    (bundle / "config.json").write_text('{"process": {"env": []}}')
    r = runner.run([str(bundle), "sh", "-c", "ls /"])
    assert r.returncode == 125, r.stdout
    assert "does not look like a root filesystem" in r.stderr


def test_image_dir_with_colon_and_comma(runner, small_rootfs, shared_tmp):
    odd = shared_tmp / "img:v1,x"
    os.rename(small_rootfs, odd)
    try:
        r = runner.run([str(odd), "sh", "-c", "echo ok"])
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "ok"
    finally:
        os.rename(odd, small_rootfs)


def test_image_files_that_are_fifos_or_devices_are_not_opened(runner, small_rootfs):
    """The launcher reads the image's /etc/environment and /etc/passwd on the
    host side: a FIFO there must not hang it, a device node must not be opened."""
    env = small_rootfs / "etc" / "environment"
    env.unlink()
    os.mkfifo(env)
    passwd = small_rootfs / "etc" / "passwd"
    passwd.unlink()
    os.mknod(passwd, 0o644 | stat.S_IFCHR, os.makedev(1, 3))
    r = runner.run([str(small_rootfs), "sh", "-c", "echo ran"], timeout=20)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ran"


@pytest.fixture
def subid_user(test_user):
    """The test user and its subordinate uid range (made by scripts/test-users)."""
    import types
    subid_range(test_user, "/etc/subgid")
    return types.SimpleNamespace(pw_name=test_user.pw_name, pw_uid=test_user.pw_uid,
                                 subuid=subid_range(test_user, "/etc/subuid"))


def test_userns_subids_maps_a_full_range(rootless_runner, rootfs, subid_user):
    r = sh(rootless_runner, rootfs, "cat /proc/self/uid_map; id -u; touch /tmp/f && "
           "chown 1234:1234 /tmp/f && stat -c %u /tmp/f", "--userns", "subids", "--root")
    assert r.returncode == 0, r.stderr
    lines = [ln.split() for ln in r.stdout.splitlines()]
    maps = [ln for ln in lines if len(ln) == 3]
    assert ["0", str(subid_user.pw_uid), "1"] in maps
    start, count = subid_user.subuid
    assert ["1", str(start), str(count)] in maps
    assert lines[-2] == ["0"] and lines[-1] == ["1234"]


def test_userns_subids_keeps_caller_uid(rootless_runner, rootfs, subid_user):
    r = sh(rootless_runner, rootfs, "id -u; cat /proc/self/uid_map | wc -l", "--userns", "subids")
    assert r.returncode == 0, r.stderr
    uid, nmaps = r.stdout.split()
    assert uid == str(subid_user.pw_uid) and int(nmaps) >= 2


def test_userns_subids_without_range_is_one_clear_line(root_runner, rootfs, tmp_path):
    # nobody has no subordinate range on this machine.
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                        root_runner.cli, "run", "--userns", "subids", str(rootfs), "true"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 125
    assert r.stderr.startswith("gpusandbox: error: --userns subids: no subordinate id range")
    assert "hint: add a range" in r.stderr


def test_no_signal_is_ignored_in_the_command(runner, rootfs):
    # CPython (the launcher) ignores SIGPIPE and SIGXFSZ; the command must not.
    r = sh(runner, rootfs, "grep SigIgn /proc/self/status; yes | head -n 1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["SigIgn:\t0000000000000000", "y"]
    assert "Broken pipe" not in r.stderr


def test_userns_single_as_root_maps_one_id(root_runner, rootfs):
    # Real root asking for a user namespace: init writes a one-id map for
    # itself from inside it, which the kernel accepts only after setgroups
    # is denied (it holds no CAP_SETGID in the parent namespace there).
    r = sh(root_runner, rootfs, "id -u; cat /proc/self/uid_map /proc/self/gid_map "
           "/proc/self/setgroups", "--userns", "single")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("\n")
    assert lines[0] == "0"
    assert lines[1].split() == ["0", "0", "1"] and lines[2].split() == ["0", "0", "1"]
    assert lines[3] == "deny"
