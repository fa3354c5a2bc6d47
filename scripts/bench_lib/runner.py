"""A launch runner: spawns commands for the benchmark and times them.

The benchmark drives one runner per context (root or the benchmark user, on
the host's mount namespace or in a private one whose /sys/fs/cgroup is a
cgroup2 view), so every launcher is spawned the same way (posix_spawn and
waitpid, no shell, no setpriv in the timed path) and only the launcher's own
cost lands in the figure.

Protocol: one JSON object per line on stdin, one JSON reply per line on
stdout.  Run as `python3 runner.py [--cgroup2-view] [--dev-from DIR] [--uid U --gid G]`.
"""
import ctypes
import json
import os
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
ERR_TAIL = 4000


class Runner:
    def __init__(self, errfile):
        self.devnull = os.open(os.devnull, os.O_RDWR)
        self.err = os.open(errfile, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self.done = {}        # pid -> wait status, for children reaped early
        self.live = {}        # pid -> argv of children started by "spawn"

    def _spawn(self, argv, env, err_fd):
        acts = [(os.POSIX_SPAWN_DUP2, self.devnull, 0),
                (os.POSIX_SPAWN_DUP2, self.devnull, 1),
                (os.POSIX_SPAWN_DUP2, err_fd, 2)]
        return os.posix_spawnp(argv[0], argv, env, file_actions=acts)

    def _wait(self, pid):
        if pid in self.done:
            return self.done.pop(pid)
        return os.waitpid(pid, 0)[1]

    def _wait_cpu(self, pid):
        """Wait status and CPU seconds (user + system) of the child and the
        descendants it reaped itself (wait4's rusage)."""
        _pid, status, ru = os.wait4(pid, 0)
        return status, ru.ru_utime + ru.ru_stime

    def reap_orphans(self):
        """Collect exited orphans (conmon, podman's pause process, ...):
        this process is a child subreaper, so they land here, not on pid 1."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.done[pid] = status

    def _err_tail(self):
        os.lseek(self.err, 0, os.SEEK_SET)
        data = os.read(self.err, 1 << 20)
        return data[-ERR_TAIL:].decode("utf-8", "replace")

    def op_time(self, req, env):
        capture = req.get("capture", False)
        os.ftruncate(self.err, 0)
        os.lseek(self.err, 0, os.SEEK_SET)
        try:
            t0 = time.perf_counter_ns()
            pid = self._spawn(req["argv"], env, self.err)
            status, cpu = self._wait_cpu(pid)
            t1 = time.perf_counter_ns()
        except OSError as e:
            return {"ns": 0, "rc": 127, "err": f"{req['argv'][0]}: {e.strerror}"}
        rc = os.waitstatus_to_exitcode(status)
        out = {"ns": t1 - t0, "rc": rc, "cpu_ns": int(cpu * 1e9)}
        if rc != 0 or capture:
            out["err"] = self._err_tail() if not capture else self._err_all()
        return out

    def _err_all(self):
        os.lseek(self.err, 0, os.SEEK_SET)
        chunks = []
        while True:
            b = os.read(self.err, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks).decode("utf-8", "replace")

    def op_burst(self, req, env):
        """Start n copies at once and wait for all: total wall clock."""
        argvs = req["argvs"]
        pids = []
        t0 = time.perf_counter_ns()
        for argv in argvs:
            pids.append(self._spawn(argv, env, self.devnull))
        rcs = [os.waitstatus_to_exitcode(self._wait(p)) for p in pids]
        t1 = time.perf_counter_ns()
        return {"ns": t1 - t0, "rcs": rcs}

    def op_spawn(self, req, env):
        pid = self._spawn(req["argv"], env, self.devnull)
        self.live[pid] = req["argv"]
        return {"pid": pid}

    def op_wait(self, req, env):
        pid = req["pid"]
        status = self._wait(pid)
        self.live.pop(pid, None)
        return {"rc": os.waitstatus_to_exitcode(status)}

    def serve(self, env):
        for line in sys.stdin:
            req = json.loads(line)
            op = req.get("op")
            if op == "exit":
                break
            try:
                reply = getattr(self, "op_" + op)(req, req.get("env") or env)
            except Exception as e:  # reported to the benchmark, which names the launcher
                reply = {"error": f"{type(e).__name__}: {e}"}
            self.reap_orphans()
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
        for pid in list(self.live):
            self._wait(pid)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            self.reap_orphans()
            try:
                os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            time.sleep(0.05)


def _mount_cgroup2_view():
    """In this process's private mount namespace (made by `unshare -m`, whose
    default propagation is private), put a cgroup2 mount over /sys/fs/cgroup.

    OCI runtimes decide the cgroup mode from statfs(/sys/fs/cgroup); crun
    refuses hybrid hosts (v1 controllers plus cgroup2 at .../unified).  The
    mount is invisible to the host and disappears with the namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(b"cgroup2", b"/sys/fs/cgroup", b"cgroup2", 0, None) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount cgroup2 on /sys/fs/cgroup: {os.strerror(e)}")


MS_BIND, MS_REC, MS_MOVE, MS_NOSUID = 4096, 16384, 8192, 2


def _dev_with_nodes(src):
    """In this process's private mount namespace, a /dev that also holds the
    device nodes of `src` (a simulated host's dev root) at their /dev paths,
    without touching the host's /dev: a tmpfs gets the host's entries
    (device nodes made again with the same numbers, owner and mode,
    directories bound with their submounts (pts, shm), links copied), then
    each node of `src` bound over an empty file of its name (never over a
    host entry), and the tmpfs is moved over /dev.  Rootless podman binds a
    CDI device node from its container path (docs/cdi.md); this gives it one
    where the GPU is simulated."""
    import stat
    import tempfile
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_void_p]

    def mount(what, where, fstype, flags, data=None):
        if libc.mount(what and what.encode(), where.encode(), fstype and fstype.encode(),
                      flags, data and data.encode()) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"mount {what} on {where}: {os.strerror(e)}")

    new = tempfile.mkdtemp(prefix="gsbx-bench-dev-")
    mount("tmpfs", new, "tmpfs", MS_NOSUID, "mode=755")
    old_mask = os.umask(0)
    try:
        for name in sorted(os.listdir("/dev")):
            p, q = "/dev/" + name, os.path.join(new, name)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(p), q)
                continue
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(q, stat.S_IMODE(st.st_mode))
                mount(p, q, None, MS_BIND | MS_REC)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                os.mknod(q, st.st_mode, st.st_rdev)
            else:
                os.close(os.open(q, os.O_WRONLY | os.O_CREAT, stat.S_IMODE(st.st_mode)))
                mount(p, q, None, MS_BIND)
            os.lchown(q, st.st_uid, st.st_gid)
        for name in sorted(os.listdir(src)):
            p, q = os.path.join(src, name), os.path.join(new, name)
            if os.path.lexists(q):
                continue
            if os.path.isdir(p):
                os.mkdir(q, 0o755)
            else:
                os.close(os.open(q, os.O_WRONLY | os.O_CREAT, 0o600))
            mount(p, q, None, MS_BIND | MS_REC)
    finally:
        os.umask(old_mask)
    mount(new, "/dev", None, MS_MOVE)
    os.rmdir(new)


def main(argv):
    uid = gid = None
    view = False
    dev_from = None
    errfile = None
    it = iter(argv)
    for a in it:
        if a == "--cgroup2-view":
            view = True
        elif a == "--dev-from":
            dev_from = next(it)
        elif a == "--uid":
            uid = int(next(it))
        elif a == "--gid":
            gid = int(next(it))
        elif a == "--errfile":
            errfile = next(it)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if view:
        _mount_cgroup2_view()
    if dev_from:
        _dev_with_nodes(dev_from)
    if gid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
    if uid is not None:
        os.setresuid(uid, uid, uid)
    env = dict(os.environ)
    runner = Runner(errfile)
    sys.stdout.write(json.dumps({"ready": os.getpid(), "uid": os.getuid()}) + "\n")
    sys.stdout.flush()
    runner.serve(env)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
