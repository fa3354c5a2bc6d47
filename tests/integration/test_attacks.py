"""Attacks drawn from the container runtimes' CVE history (issue 5).

Each case builds a hostile image or situation and checks that nothing on the
host changed (mount table, a canary tree, the files aimed at) and that the
launch either ran contained or failed with a clear one-line error.
"""
import hashlib
import os
import shlex
import shutil
import signal
import stat
import subprocess

import pytest

from .conftest import host_mounts, kill_quietly, pids_with, wait_for

PY_ERRNO = ("import ctypes, os, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "def call(name, nr, *args):\n"
            "    r = libc.syscall(nr, *args)\n"
            "    print(name, 'ok' if r >= 0 else errno_name(ctypes.get_errno()))\n"
            "import errno\n"
            "def errno_name(e): return errno.errorcode.get(e, str(e))\n")


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


@pytest.fixture
def canary(shared_tmp):
    """A host tree that attacks aim at; returns (dir, snapshot function)."""
    d = shared_tmp / "canary"
    d.mkdir()
    (d / "secret").write_text("host secret\n")
    os.chmod(d, 0o777)

    def snapshot():
        return sorted((p, os.lstat(os.path.join(d, p)).st_mtime_ns) for p in os.listdir(d))
    return d, snapshot


def hostile_copy(small_rootfs, runner):
    if runner.mode == "rootless":
        subprocess.run(["chown", "-R", f"{runner.uid}:{runner.gid}", str(small_rootfs)],
                       check=True)
    return small_rootfs


def replace_with_symlink(root, rel, target):
    p = root / rel.lstrip("/")
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()
    p.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, p)


# 1. Symlinks at every path the launcher mounts or writes -------------------------

@pytest.mark.parametrize("path", ["/dev", "/proc", "/sys", "/tmp", "/run", "/dev/shm"])
@pytest.mark.parametrize("kind", ["absolute", "relative", "chained"])
def test_symlinked_system_mount_points(runner, small_rootfs, canary, path, kind):
    root = hostile_copy(small_rootfs, runner)
    cdir, snap = canary
    target = {"absolute": str(cdir), "relative": "../../../../../../" + str(cdir).lstrip("/"),
              "chained": "/hop"}[kind]
    if kind == "chained":
        os.symlink("/hop2", root / "hop")
        os.symlink(str(cdir), root / "hop2")
    if path == "/dev/shm":
        (root / "dev").mkdir(exist_ok=True)
    replace_with_symlink(root, path, target)
    before, mounts = snap(), host_mounts()
    r = runner.run([str(root), "sh", "-c", "echo ran; touch /tmp/x /run/y /dev/shm/z"])
    if path == "/dev/shm":
        # /dev is a fresh tmpfs: the image's /dev/shm is never looked at.
        assert r.returncode == 0, r.stderr
        assert snap() == before and host_mounts() == mounts
        return
    assert r.returncode == 125, (r.stdout, r.stderr)
    first = r.stderr.splitlines()[0]
    assert first.startswith("gpusandbox: error: ") and "symlink" in first, r.stderr
    assert snap() == before and host_mounts() == mounts


@pytest.mark.parametrize("kind", ["absolute", "relative", "chained"])
def test_symlinked_bind_target_stays_in_root(runner, small_rootfs, canary, shared_tmp, kind):
    root = hostile_copy(small_rootfs, runner)
    cdir, snap = canary
    src = shared_tmp / "src"
    src.mkdir()
    (src / "payload").write_text("payload\n")
    os.chown(src, runner.uid, runner.gid)
    target = {"absolute": str(cdir), "relative": "../../../../../" + str(cdir).lstrip("/"),
              "chained": "/opt/hop"}[kind]
    if kind == "chained":
        os.symlink(str(cdir), root / "opt" / "hop")
    os.symlink(target, root / "mnt" / "evil")
    before, mounts = snap(), host_mounts()
    r = runner.run(["-v", f"{src}:/mnt/evil/inside", str(root), "sh", "-c",
                    "cat /mnt/evil/inside/payload; touch /mnt/evil/inside/written"])
    # Contained: the symlink resolves inside the root, the mount lands there.
    assert r.returncode == 0, r.stderr
    assert "payload" in r.stdout
    assert snap() == before and host_mounts() == mounts
    assert not (cdir / "inside").exists()


def test_symlinked_workdir_stays_in_root(runner, small_rootfs, canary):
    root = hostile_copy(small_rootfs, runner)
    cdir, snap = canary
    os.symlink("../../../../../../" + str(cdir).lstrip("/"), root / "opt" / "wd")
    r = runner.run(["-w", "/opt/wd", str(root), "sh", "-c", "pwd; ls"])
    assert r.returncode == 0, r.stderr
    assert "secret" not in r.stdout


# 2. A second sandbox swapping a directory and a symlink while another starts ------

def test_swap_race_in_shared_writable_image(runner, small_rootfs, canary, shared_tmp):
    root = hostile_copy(small_rootfs, runner)
    cdir, snap = canary
    src = shared_tmp / "bindsrc"
    src.mkdir()
    os.chmod(src, 0o777)
    (root / "mnt" / "t").mkdir()
    os.chmod(root / "mnt", 0o777)
    os.chmod(root / "mnt" / "t", 0o777)
    before, mounts = snap(), host_mounts()
    swapper = runner.popen(["--rw", str(root), "sh", "-c",
                            f"end=$(( $(date +%s) + 8 )); while [ $(date +%s) -lt $end ]; do "
                            f"rm -rf /mnt/t; ln -sfn {cdir} /mnt/t; rm -f /mnt/t; mkdir /mnt/t; "
                            f"done"])
    ran = set()
    try:
        for i in range(15):
            r = runner.run(["-v", f"{src}:/mnt/t/x", str(root), "sh", "-c",
                            f"touch /mnt/t/x/probe-{i} && echo inside"])
            if r.returncode == 0:
                assert r.stdout.strip() == "inside", r.stdout
                ran.add(f"probe-{i}")
            else:
                assert r.returncode == 125 and r.stderr.startswith("gpusandbox: error:"), r.stderr
            assert snap() == before, "the race reached the host canary"
    finally:
        kill_quietly(swapper)
    assert host_mounts() == mounts
    # Every launch that ran wrote through its own bind, into the source: a
    # bind that landed elsewhere (the canary, the image, the overlay) loses
    # the probe, and a refused launch wrote nothing.
    assert set(os.listdir(src)) == ran
    # Without the race the same launch runs: the refusals above were the race's.
    r = runner.run(["-v", f"{src}:/mnt/t/x", str(root), "sh", "-c", "touch /mnt/t/x/calm"])
    assert r.returncode == 0, r.stderr
    assert (src / "calm").exists()


# 3. The image's environment never reaches host-side code ----------------------------

def test_image_env_does_not_reach_launcher(runner, small_rootfs, shared_tmp):
    root = hostile_copy(small_rootfs, runner)
    evil = shared_tmp / "evil"
    evil.mkdir()
    os.chmod(evil, 0o777)
    (evil / "sitecustomize.py").write_text(
        f"open({str(evil / 'PWNED-python')!r}, 'w').write('x')\n")
    csrc = evil / "evil.c"
    csrc.write_text('#include <stdio.h>\n__attribute__((constructor)) static void f(void)'
                    f'{{FILE*o=fopen("{evil}/PWNED-preload","w");if(o)fclose(o);}}\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(evil / "evil.so"), str(csrc)],
                   check=True)
    os.chmod(evil / "evil.so", 0o755)
    (root / "etc" / "environment").write_text(
        f"LD_PRELOAD={evil}/evil.so\nLD_AUDIT={evil}/evil.so\nGCONV_PATH={evil}\n"
        f"PYTHONPATH={evil}\nPYTHONHOME={evil}\nNVIDIA_VISIBLE_DEVICES=all\n")
    r = runner.run([str(root), "sh", "-c", "echo $LD_PRELOAD; ls /dev | grep -c nvidia || true"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == f"{evil}/evil.so"  # it is the command's, as data
    assert r.stdout.split()[-1] == "0"  # the image's NVIDIA_VISIBLE_DEVICES selects nothing
    assert not (evil / "PWNED-python").exists()
    assert not (evil / "PWNED-preload").exists()


# 4. Device nodes inside the image --------------------------------------------------

def test_device_nodes_in_image_cannot_be_opened(runner, small_rootfs):
    root = hostile_copy(small_rootfs, runner)
    os.mknod(root / "opt" / "blk", stat.S_IFBLK | 0o666, os.makedev(7, 0))
    os.mknod(root / "opt" / "nv2", stat.S_IFCHR | 0o666, os.makedev(195, 2))
    os.mknod(root / "opt" / "mem", stat.S_IFCHR | 0o666, os.makedev(1, 1))
    r = runner.run([str(root), "sh", "-c",
                    "for n in blk nv2 mem; do head -c1 /opt/$n >/dev/null 2>&1 && echo $n-open "
                    "|| echo $n-refused; done"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["blk-refused", "nv2-refused", "mem-refused"]


def test_mknod_inside_refused(runner, rootfs):
    """A root command (real root, or --root in a user namespace) holds no
    CAP_MKNOD: /dev/null's numbers, which the device filter allows with 'm',
    cannot be made on the writable /tmp (EPERM from the capability check)."""
    opts = ["--root"] if runner.mode == "rootless" else []
    r = runner.run([*opts, str(rootfs), "python3", "-c",
                    "import os, stat, errno\n"
                    "caps = dict(l.split(':\\t') for l in open('/proc/self/status').read()"
                    ".splitlines() if l.startswith('Cap'))\n"
                    "print(os.getuid(), *(int(caps[k], 16) >> 27 & 1 for k in "
                    "('CapEff', 'CapPrm', 'CapBnd')))\n"
                    "try:\n"
                    "    os.mknod('/tmp/m', stat.S_IFCHR | 0o600, os.makedev(1, 3))\n"
                    "    print('made')\n"
                    "except OSError as e:\n"
                    "    print(errno.errorcode[e.errno])\n"])
    assert r.returncode == 0, r.stderr
    # uid 0 inside, without CAP_MKNOD in any set.
    assert r.stdout.splitlines() == ["0 0 0 0", "EPERM"], r.stdout


# 5. setuid-root and file-capability binaries gain nothing ------------------------

def test_setuid_and_file_caps_gain_nothing(runner, small_rootfs):
    root = small_rootfs
    shutil.copy2("/usr/bin/id", root / "usr" / "bin" / "suid-id")
    os.chown(root / "usr" / "bin" / "suid-id", 0, 0)
    os.chmod(root / "usr" / "bin" / "suid-id", 0o4755)
    shutil.copy2(root / "usr" / "bin" / "cat", root / "usr" / "bin" / "capcat")
    subprocess.run(["setcap", "cap_dac_read_search,cap_dac_override+ep",
                    str(root / "usr" / "bin" / "capcat")], check=True)
    (root / "root" / "secret").write_text("root only\n")
    os.chmod(root / "root" / "secret", 0o600)
    os.chmod(root / "root", 0o700)
    opts = ["--user", "1000:1000"] if runner.mode == "root" else []
    r = runner.run([*opts, str(root), "sh", "-c",
                    "suid-id -u; capcat /root/secret 2>/dev/null || echo denied; "
                    "grep -E 'NoNewPrivs|CapEff|CapPrm|CapBnd' /proc/self/status"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("1000" if runner.mode == "root" else str(runner.uid))
    assert lines[1] == "denied"
    assert "NoNewPrivs:\t1" in r.stdout
    assert r.stdout.count("0000000000000000") == 3


# 6. Leaked fds and /proc/self/fd workdirs -----------------------------------------

def test_leaked_host_fd_and_proc_fd_workdir(runner, rootfs, canary):
    cdir, snap = canary
    fd = os.open(str(cdir), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.set_inheritable(fd, True)
        before = snap()
        p = subprocess.run(runner.argv([str(rootfs), "sh", "-c",
                                        "ls /proc/self/fd; echo --; "
                                        f"ls /proc/self/fd/{fd}/ 2>&1; "
                                        f"touch /proc/self/fd/{fd}/PWNED 2>/dev/null; "
                                        "ls /proc/1/fd 2>&1; echo end"]),
                           capture_output=True, text=True, pass_fds=(fd,), env=runner.env(),
                           timeout=60)
        assert p.returncode == 0 and p.stdout.endswith("end\n"), p.stderr
        # The whole listing: stdio and the directory ls itself opened, no more.
        assert p.stdout.split("\n--\n")[0].split() == ["0", "1", "2", "3"], p.stdout
        assert "secret" not in p.stdout
        r = subprocess.run(runner.argv(["-w", f"/proc/self/fd/{fd}", str(rootfs), "ls"]),
                           capture_output=True, text=True, pass_fds=(fd,), env=runner.env(),
                           timeout=60)
        assert "secret" not in r.stdout
        assert r.returncode == 125
        assert r.stderr.startswith("gpusandbox: error: opening the working directory")
    finally:
        os.close(fd)
    assert snap() == before


# 7. Overwriting the runtime through /proc/self/exe or /proc/1/exe ----------------

def test_proc_exe_overwrite_refused(runner, rootfs, cli):
    py = os.path.realpath(os.path.join(os.path.dirname(cli), "python"))
    targets = [py, cli]
    before = [digest(t) for t in targets]
    r = runner.run([str(rootfs), "python3", "-c",
                    "import os\n"
                    "for p in ('/proc/1/exe', '/proc/self/exe', '/proc/1/cwd/x', '/proc/1/root/x'):\n"
                    "    try:\n"
                    "        fd = os.open(p, os.O_WRONLY | os.O_CREAT)\n"
                    "        os.write(fd, b'pwned'); print(p, 'WROTE')\n"
                    "    except OSError as e:\n"
                    "        print(p, 'refused', e.errno)\n"])
    assert r.returncode == 0, r.stderr
    assert "WROTE" not in r.stdout, r.stdout
    assert r.stdout.count("refused") == 4
    assert [digest(t) for t in targets] == before


# 8. TIOCSTI / TIOCLINUX -------------------------------------------------------------

TIOCSTI_SCRIPT = ("import fcntl, os, errno\n"
                  "for name, req in (('TIOCSTI', 0x5412), ('TIOCLINUX', 0x541C)):\n"
                  "    try:\n"
                  "        fcntl.ioctl(0, req, b'X')\n"
                  "        print(name, 'INJECTED')\n"
                  "    except OSError as e:\n"
                  "        print(name, errno.errorcode[e.errno])\n")


@pytest.mark.parametrize("tty", [False, True])
def test_tiocsti_does_not_reach_caller(runner, rootfs, tty):
    opts = ["--tty"] if tty else []
    cmd = shlex.join(runner.argv([*opts, str(rootfs), "python3", "-c", TIOCSTI_SCRIPT]))
    # script(1) gives the launcher a real terminal as its stdin.
    r = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True,
                       timeout=60, env=runner.env(), cwd="/", input="")
    assert "INJECTED" not in r.stdout, r.stdout
    assert "TIOCSTI EPERM" in r.stdout


# 9. Writes to kernel interfaces ----------------------------------------------------

def test_kernel_interface_writes_refused(runner, rootfs):
    core = open("/proc/sys/kernel/core_pattern").read()
    r = runner.run([str(rootfs), "sh", "-c",
                    "for p in /proc/sys/kernel/core_pattern /proc/sysrq-trigger "
                    "/sys/kernel/mm/transparent_hugepage/enabled "
                    "/sys/fs/cgroup/unified/cgroup.procs /sys/fs/cgroup/cgroup.procs; do "
                    "(echo x > $p) 2>/dev/null && echo $p WROTE || echo $p refused; done"])
    assert "WROTE" not in r.stdout, r.stdout
    assert open("/proc/sys/kernel/core_pattern").read() == core


# 10. Escapes through the kernel API inside --------------------------------------------

ESCAPES = PY_ERRNO + (
    "call('unshare_user', 272, 0x10000000)\n"
    "call('unshare_ns', 272, 0x00020000)\n"
    "call('mount', 165, b'none', b'/tmp', b'tmpfs', 0, None)\n"
    "call('pivot_root', 155, b'/tmp', b'/tmp')\n"
    "call('keyctl', 250, 0, 0, 0, 0, 0)\n"
    "call('bpf', 321, 0, 0, 0)\n"
    "call('perf_event_open', 298, 0, 0, -1, -1, 0)\n"
    "call('getpid', 39)\n")


def test_escape_syscalls_denied(runner, rootfs):
    for opts in ([], ["--root"] if runner.mode == "rootless" else []):
        r = runner.run([*opts, str(rootfs), "python3", "-c", ESCAPES])
        res = dict(line.split() for line in r.stdout.splitlines())
        assert res.pop("getpid") == "ok"
        for name, verdict in res.items():
            assert verdict == "EPERM", (name, verdict, opts)
    r = runner.run([str(rootfs), "sh", "-c", "unshare -U true 2>/dev/null && echo nested || "
                    "echo refused"])
    assert "nested" not in r.stdout


def test_perf_allowed_by_profiling_profile(runner, rootfs):
    r = runner.run(["--seccomp", "profiling", str(rootfs), "python3", "-c",
                    PY_ERRNO + "call('perf_event_open', 298, 0, 0, -1, -1, 0)\n"])
    assert "perf_event_open EPERM" not in r.stdout


# 11. Exhaustion from inside -------------------------------------------------------------

def test_process_flood_and_tmpfs_fill(runner, rootfs):
    marker = "471.1234"
    r = runner.run([str(rootfs), "sh", "-c",
                    f"i=0; while [ $i -lt 300 ]; do sleep {marker} & i=$((i+1)); done; "
                    "dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>/dev/null; "
                    "dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>/dev/null; echo filled"],
                   timeout=120)
    assert "filled" in r.stdout
    assert wait_for(lambda: not pids_with(marker)), "flood processes survived the sandbox"


# 12. kill -9 of the launcher at each setup stage --------------------------------------

@pytest.mark.parametrize("stage", ["after-cgroup", "after-clone", "init-start", "init-mounts",
                                   "before-exec"])
def test_kill_9_at_each_stage(runner, rootfs, stage):
    mounts = host_mounts()
    cg_before = cgroup_leaves()
    p = runner.popen([str(rootfs), "sleep", "555.5"], env={"GPUSANDBOX_TEST_PAUSE": stage})
    line = p.stderr.readline()
    assert f"paused at {stage}" in line, line
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    assert wait_for(lambda: not pids_with("555.5") and not init_pids_paused("555.5"))
    assert host_mounts() == mounts
    # The next launch removes a leaf the dead launcher left.
    runner.run([str(rootfs), "true"])
    assert wait_for(lambda: cgroup_leaves() <= cg_before)


def test_kill_9_before_exec_after_init_took_another_uid(root_runner, rootfs):
    """A plain launch's pid 1 takes the command's identity before it spawns
    the command (stages/command.spawn): a launcher killed there still takes
    the sandbox with it (the parent-death signal, which the change of uid
    clears and init sets again; as root, the reaper's cgroup.kill too)."""
    p = root_runner.popen(["--user", "1000:1000", str(rootfs), "sleep", "555.6"],
                          env={"GPUSANDBOX_TEST_PAUSE": "before-exec"})
    line = p.stderr.readline()
    assert "paused at before-exec" in line, line
    paused = init_pids_paused("555.6")
    assert paused and all(_uid(pid) == 1000 for pid in paused)
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    assert wait_for(lambda: not pids_with("555.6"))


def _uid(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(ln for ln in f if ln.startswith("Uid:")).split()[1])


def init_pids_paused(marker):
    """This launch's init (a fork of its launcher: the launcher's command line,
    renamed gpusandbox-init), not the inits of launches running beside it."""
    return [p for p in pids_with(marker) if _comm(p) == "gpusandbox-init"]


def _comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def cgroup_leaves():
    found = set()
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        if not os.path.isdir(base):
            continue
        for d, dirs, _ in os.walk(base):
            for name in dirs:
                if name.startswith("gpusandbox-"):
                    found.add(os.path.join(d, name))
            if d.count("/") > 6:
                dirs[:] = []
    return found


def test_fork_bomb_contained_by_pids_limit(root_runner, rootfs):
    """A real fork bomb needs a real limit: where the pids controller is on the
    cgroup2 side (pure v2 hosts) the leaf's pids.max holds it; this hybrid
    machine binds pids to cgroup v1, where --pids-limit is refused (tested in
    test_cgroup_cli), so the bomb is not let loose here."""
    from gpusandbox.linux import cgroup
    if "pids" not in (cgroup.status().get("controllers") or []):
        pytest.skip("the pids controller is not available on the cgroup2 side of this host "
                    "(bound to cgroup v1); this runs on pure cgroup v2 hosts")
    marker = "bomb-4711"
    # Other tests' sandboxes (and gpusandbox-oci's containers) come and go
    # beside this one: only a leaf that was not there before is the bomb's.
    cg_before = cgroup_leaves()
    # The bomb's shells all carry the marker in their command line (fork
    # keeps it); the counting below uses shell builtins only, which need no
    # fork while the bomb holds every pid the limit allows.
    r = root_runner.run(["--pids-limit", "64", str(rootfs), "sh", "-c",
                         f"sh -c 'b() {{ b | b & }}; b' {marker} & "
                         "sleep 2; set -- /proc/[0-9]*; echo procs $#; echo survived"],
                        timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[-1] == "survived", r.stdout
    procs = int(lines[-2].split()[1])
    assert 0 < procs <= 64, r.stdout
    assert wait_for(lambda: not pids_with(marker)), "bomb processes outlived the sandbox"
    assert wait_for(lambda: cgroup_leaves() <= cg_before), "the bomb's cgroup leaf outlived it"
