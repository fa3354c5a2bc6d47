"""Host facts and the things the benchmark creates on the host (and removes)."""
import ctypes
import os
import platform
import pwd
import signal
import subprocess
import time

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """Orphans of the peers (conmon, podman's pause process) then become our
    children, so we reap them instead of leaving zombies on pid 1."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_all():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def mounts():
    """[(mount point, fs type)] from our mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            point = left.split()[4].replace("\\040", " ")
            out.append((point, right.split()[0]))
    return out


def cgroup_layout():
    """("unified" | "hybrid" | "legacy", path of the cgroup2 mount or None)."""
    ms = mounts()
    cg2 = next((p for p, t in ms if t == "cgroup2"), None)
    if any(p == "/sys/fs/cgroup" and t == "cgroup2" for p, t in ms):
        return "unified", "/sys/fs/cgroup"
    if cg2:
        return "hybrid", cg2
    return "legacy", None


def cgroup2_supported():
    with open("/proc/filesystems") as f:
        return any(line.split()[-1] == "cgroup2" for line in f if line.strip())


def machine():
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kb = None
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    distro = None
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    distro = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    layout, cg2 = cgroup_layout()
    return {"hostname": platform.node(), "kernel": platform.release(),
            "arch": platform.machine(), "cpu": model, "cpus": os.cpu_count(),
            "mem_gb": round(mem_kb / 1048576, 1) if mem_kb else None,
            "distro": distro, "cgroups": layout, "cgroup2_mount": cg2}


def ensure_user(name, log):
    """(uid, gid, created) of the unprivileged benchmark user."""
    try:
        pw = pwd.getpwnam(name)
        return pw.pw_uid, pw.pw_gid, False
    except KeyError:
        pass
    log(f"+ useradd --system --no-create-home --shell /usr/sbin/nologin {name}")
    subprocess.run(["useradd", "--system", "--no-create-home",
                    "--shell", "/usr/sbin/nologin", name], check=True)
    pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid, True


def remove_user(name, log):
    p = subprocess.run(["userdel", name], capture_output=True, text=True)
    if p.returncode != 0:
        log(f"could not remove user {name}: {p.stderr.strip()}")


def kill_owned(pid_file, uid, word, log):
    """Stop the process a peer left running (podman's rootless pause
    process), after checking it is the one we started: owned by the
    benchmark user and named as expected."""
    try:
        with open(pid_file) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/status") as f:
            status = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except (OSError, ValueError):
        return
    uid_line = next((l for l in status.splitlines() if l.startswith("Uid:")), "")
    if str(uid) not in uid_line.split()[1:2] or word.encode() not in cmd:
        return
    log(f"stopping {word} process {pid} left by the benchmark")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(50):
        if not os.path.exists(f"/proc/{pid}") or _zombie(pid):
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def remove_cgroup_tree(path, log):
    """rmdir our cgroup and any (empty) children the runtimes left in it."""
    if not os.path.isdir(path):
        return
    for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda w: -len(w[0])):
        try:
            os.rmdir(dirpath)
        except OSError as e:
            log(f"could not remove cgroup {dirpath}: {e.strerror}")


def unmount_under(path, log):
    """Mounts left under our temp dir (none expected): lazily detach them,
    deepest first, so the directory can be removed."""
    left = sorted((p for p, _t in mounts() if p == path or p.startswith(path + "/")),
                  key=len, reverse=True)
    for p in left:
        log(f"detaching leftover mount {p}")
        subprocess.run(["umount", "-l", p], check=False)
