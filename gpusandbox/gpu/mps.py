"""MPS control daemons: one per user per GPU, started, queried and stopped.

Layout (per user; root uses a system directory):
    BASE/mps/<gpu>/{pipe,log,shm,state.json}
where BASE is the caller's base directory (gpusandbox/rundir.py: root
/run/gpusandbox; others $XDG_RUNTIME_DIR/gpusandbox, /run/user/<uid>/gpusandbox
or /tmp/gpusandbox-<uid>).
<gpu> is "gpu-" and the first 8 hex digits of the GPU's UUID: one daemon per
GPU, because a fatal fault in one client reaches every client of its server.

The daemon is started with CUDA_VISIBLE_DEVICES=<uuid> and its own
CUDA_MPS_PIPE_DIRECTORY/CUDA_MPS_LOG_DIRECTORY, in a mount namespace of its
own where <gpu>/shm is its /dev/shm (rootless: a user namespace mapping only
the caller's ids): the server's cuda.shm.* segments land there, and sandboxes
get that directory as their /dev/shm, not the host's.  It stays in the host's
pid namespace.  It outlives the launch that started it: `gpusandbox mps down`
stops it (the control client's `quit`), and only the daemon it started: the
daemon's pid and start time are recorded in state.json when it starts, and
`down` sends `quit` only while that process lives and reports it stopped
only once that process is gone.

Sandboxes get pipe/ read-only and shm/ read-write.  The host side reads
only the pid file in pipe/, by descriptor (rundir.read_owned: no link
followed, no blocking open, a regular file of the caller's).  shm/ is the
daemon's /dev/shm, which a sandbox can write: in the daemon's own mount
namespace it is mounted nosymfollow, so a link a sandbox planted there
never leads the server (root's, for root) to another file.
"""
import errno
import json
import os
import subprocess
import time

from gpusandbox.errors import GpuError, SandboxError

SUN_PATH_MAX = 107          # sun_path holds 108 bytes with the NUL
_LONGEST = "control_privileged"
_START_WAIT = 10.0
CTL = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"


def gpu_key(gpu):
    uuid = (gpu.uuid or "").removeprefix("GPU-").replace("-", "")
    return f"gpu-{uuid[:8]}" if uuid else f"gpu-index{gpu.index}"


def base_dir(environ=None, make=False):
    """The per-user directory that holds the daemons' directories: the part
    "mps" of the caller's base directory (gpusandbox/rundir.py), made and
    checked when `make`."""
    from gpusandbox import rundir
    return rundir.part("mps", environ) if make else rundir.locate("mps", environ)


def _owned_private(path, uid):
    try:
        st = os.lstat(path)
    except OSError:
        return False
    import stat
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077


class Daemon:
    """Where one GPU's daemon lives, and whether it runs."""

    def __init__(self, host, gpu, environ=None):
        self.host, self.gpu, self.environ = host, gpu, environ
        self._at(base_dir(environ))

    def _at(self, base):
        self.dir = os.path.join(base, gpu_key(self.gpu))
        self.pipe = os.path.join(self.dir, "pipe")
        self.log = os.path.join(self.dir, "log")
        self.shm = os.path.join(self.dir, "shm")
        self.state = os.path.join(self.dir, "state.json")

    def check_paths(self):
        longest = os.path.join(self.pipe, _LONGEST)
        if len(longest.encode()) > SUN_PATH_MAX:
            raise GpuError(f"MPS pipe directory {self.pipe}",
                           f"{longest} is {len(longest.encode())} bytes, over the "
                           f"{SUN_PATH_MAX} a unix socket path holds (the daemon would die "
                           "silently)", hint="set XDG_RUNTIME_DIR to a shorter directory")

    def binary(self):
        path = self.host.bins.get(CTL)
        if not path or "nvidia-cuda-mps-server" not in self.host.bins:
            raise GpuError("MPS is not available", f"the driver root "
                           f"({self.host.driver_root}) has no {CTL} or nvidia-cuda-mps-server",
                           hint="install the driver's MPS binaries (Debian: nvidia-cuda-mps)")
        return path

    def _pid_file(self):
        """The pid the daemon's pid file names, or None without one.  The
        file lies in a directory every sandbox of this daemon sees, and a
        FIFO or a link there would stall or mislead every later status and
        launch: read by descriptor, never following a link, never blocking,
        only a regular file of the caller's.  GpuError for anything else."""
        from gpusandbox import rundir
        try:
            fd = rundir.trusted_dir(self.pipe)
        except OSError:
            return None
        except rundir.Taken as e:
            raise self._bad_pid_file(e.path, e.why) from None
        try:
            data = rundir.read_owned(fd, PID_FILE, 32)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise self._bad_pid_file(os.path.join(self.pipe, PID_FILE),
                                     "a symlink" if e.errno == errno.ELOOP else e.strerror
                                     ) from None
        except rundir.Taken as e:
            raise self._bad_pid_file(os.path.join(self.pipe, PID_FILE), e.why) from None
        finally:
            os.close(fd)
        try:
            pid = int(data.strip() or 0)
        except ValueError:
            return None
        return pid if pid > 0 else None

    def _bad_pid_file(self, path, why):
        return GpuError(f"MPS daemon for GPU {self.gpu.index}", f"{path}: {why}",
                        hint=f"'gpusandbox mps down --gpus {self.gpu.index}' stops the daemon "
                             "it started and removes its directory")

    def pid(self):
        """The daemon's pid when it runs and is ours; None when none runs.
        Raises GpuError when the pid file names another user's process, or
        is not a regular file of the caller's."""
        pid = self._pid_file()
        if pid is None:
            return None
        try:
            st = os.stat(f"/proc/{pid}")
        except OSError:
            return None
        if not _alive(pid, _starttime(pid)):
            return None     # a zombie: the daemon is gone, its reaper late
        if st.st_uid != os.geteuid():
            raise GpuError(f"MPS daemon for GPU {self.gpu.index}",
                           f"pid {pid} serving {self.pipe} belongs to uid {st.st_uid}",
                           hint="one daemon serves one user: use that user's sandboxes, "
                                "or stop it ('gpusandbox mps down' as that user)")
        return pid

    def running(self):
        return self.pid() is not None and os.path.exists(os.path.join(self.pipe, "control"))

    def env(self):
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "CUDA_VISIBLE_DEVICES":
                self.gpu.uuid or str(self.gpu.index), "CUDA_MPS_PIPE_DIRECTORY": self.pipe,
                "CUDA_MPS_LOG_DIRECTORY": self.log}

    def start(self):
        """Start the daemon unless it runs; returns True when it started it."""
        from gpusandbox import rundir
        self._at(base_dir(self.environ, make=True))
        self.check_paths()
        exe = self.binary()
        rundir.subdir(os.path.dirname(self.dir), os.path.basename(self.dir))
        import fcntl
        lock = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.running():
                return False
            for d in (self.pipe, self.log, self.shm):
                os.makedirs(d, mode=0o700, exist_ok=True)
            # Clients of every sandbox reach the control socket and the
            # server's segments: searchable, not listable by others.
            os.chmod(self.pipe, 0o711 if os.geteuid() else 0o755)
            os.chmod(self.shm, 0o1777)
            _spawn(exe, self.env(), self.shm)
            deadline = time.monotonic() + _START_WAIT
            while not self.running():
                if time.monotonic() > deadline:
                    raise GpuError(f"MPS daemon for GPU {self.gpu.index} did not start",
                                   f"no control socket in {self.pipe} after {_START_WAIT:g} s",
                                   hint=f"see {self.log}/control.log")
                time.sleep(0.02)
            # Who `down` may stop: this process, while it lives.
            pid = self.pid()
            self.write_state(daemon={"pid": pid, "start": _starttime(pid)})
            return True
        finally:
            os.close(lock)

    def read_state(self):
        try:
            with open(self.state) as f:
                st = json.load(f)
            return st if isinstance(st, dict) else {}
        except (OSError, ValueError):
            return {}

    def write_state(self, **changes):
        st = dict(self.read_state(), **changes)
        with open(self.state + ".tmp", "w") as f:
            json.dump(st, f)
        os.rename(self.state + ".tmp", self.state)

    def lease(self, mib, total):
        """Note this launch's memory ceiling for as long as the launcher
        lives.  With a strict daemon (`mps up --strict`), refuse it when the
        ceilings of the running launches and this one sum over the GPU's
        memory (total() in MiB, asked only then)."""
        import fcntl
        leases = os.path.join(self.dir, "leases")
        os.makedirs(leases, mode=0o700, exist_ok=True)
        lock = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            held = _live_leases(leases)
            if self.read_state().get("strict"):
                cap = total()
                if cap is None:
                    raise GpuError(f"--gpu-memory on GPU {self.gpu.index}", "the daemon is "
                                   "strict and nvidia-smi did not report the GPU's memory",
                                   hint="'gpusandbox mps up' without --strict")
                if sum(held) + mib > cap:
                    raise GpuError(f"--gpu-memory {mib}M on GPU {self.gpu.index}",
                                   f"the daemon is strict and {len(held)} running sandbox(es) "
                                   f"hold {sum(held)} MiB of its {cap} MiB",
                                   hint="lower the limit or wait for them; ceilings are per "
                                        "CUDA process, so the sum is a floor of what they can use")
            name = f"{os.getpid()}-{_starttime(os.getpid())}"
            with open(os.path.join(leases, name), "w") as f:
                f.write(f"{mib}\n")
        finally:
            os.close(lock)

    def command(self, line, timeout=10):
        """Send one control command; returns its output (stripped)."""
        res = subprocess.run([self.binary()], input=line + "\n", capture_output=True, text=True,
                             env=self.env(), timeout=timeout, cwd="/")
        if res.returncode != 0:
            raise GpuError(f"MPS control command {line.split()[0]!r} failed",
                           ((res.stderr or res.stdout).strip().splitlines() or
                            [f"exit status {res.returncode}"])[-1])
        return res.stdout.strip()

    def started(self):
        """(pid, start time) of the daemon start() recorded, or None (none
        recorded: one started by an older version, or none at all)."""
        rec = self.read_state().get("daemon")
        if isinstance(rec, dict) and isinstance(rec.get("pid"), int) and rec["pid"] > 0 \
                and isinstance(rec.get("start"), int):
            return rec["pid"], rec["start"]
        return None

    def stop(self):
        """Send `quit` to the daemon start() started, and wait until that
        process is gone.  False when it no longer runs (nothing is sent: the
        pid file or the socket may name another process by now); GpuError
        when it still runs after `quit` (the control socket did not reach
        it)."""
        ident = self.started()
        if ident is None:
            # Started by an older version: only its pid file names it.
            try:
                pid = self.pid()
            except GpuError as e:
                raise GpuError(e.what, e.why, hint="an older gpusandbox started this daemon "
                               "and recorded nothing else of it: stop it with 'echo quit | "
                               f"CUDA_MPS_PIPE_DIRECTORY={self.pipe} {CTL}', then remove "
                               f"{self.dir}") from None
            if pid is None:
                return False
            ident = (pid, _starttime(pid))
        pid, start = ident
        if not _alive(pid, start):
            return False
        self.command("quit")
        deadline = time.monotonic() + _START_WAIT
        while _alive(pid, start) and time.monotonic() < deadline:
            time.sleep(0.02)
        if _alive(pid, start):
            raise GpuError(f"MPS daemon for GPU {self.gpu.index} (pid {pid}) still runs after "
                           "'quit'", f"the control socket in {self.pipe} did not reach it",
                           hint=f"stop it with 'kill {pid}' (it is yours), then run "
                                f"'gpusandbox mps down --gpus {self.gpu.index}' again")
        return True

    def _started_alive(self):
        ident = self.started()
        return ident is not None and _alive(*ident)

    def remove(self):
        """Remove the daemon's directory once it has stopped (pipe, shm,
        leases, state and log): nothing of a stopped daemon is kept.  A pid
        file that is not a plain file of the caller's is removed with it
        when the recorded daemon is gone."""
        import shutil
        try:
            if self.pid() is not None:
                return
        except GpuError:
            if self._started_alive():
                return
        if _owned_private(self.dir, os.geteuid()):
            shutil.rmtree(self.dir, ignore_errors=True)

    def status(self):
        out = {"gpu": self.gpu.index, "uuid": self.gpu.uuid, "dir": self.dir,
               "pipe": self.pipe, "log": self.log, "shm": self.shm}
        try:
            out["pid"] = self.pid()
        except GpuError as e:
            out["pid"], out["error"] = None, e.line()
        out["running"] = out["pid"] is not None
        try:
            with open(self.state) as f:
                out.update(json.load(f))
        except (OSError, ValueError):
            pass
        return out


def _spawn(exe, env, shm):
    """Run `exe -d` in a mount namespace whose /dev/shm is `shm` (rootless: in
    a user namespace mapping only our own ids).  The daemon forks itself
    away; the helper child exits with its status."""
    from gpusandbox.linux import sys as k
    uid, gid = os.geteuid(), os.getegid()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            flags = k.CLONE_NEWNS | (0 if uid == 0 else k.CLONE_NEWUSER)
            k.unshare(flags)
            if uid:
                from gpusandbox.linux import idmap
                idmap.write_single("self", uid, uid, gid, gid, False)
            k.mount(None, "/", None, _MS_REC | _MS_SLAVE)
            _bind_shm(k, shm)
            os.chdir("/")
            # The daemon outlives the launch: it must not hold the caller's
            # stdio (a `$(gpusandbox run ...)` would wait for it).
            null = os.open(os.devnull, os.O_RDWR)
            for n in (0, 1, 2):
                os.dup2(null, n)
            os.execve(exe, [exe, "-d"], env)
        except BaseException as e:
            try:
                os.write(w, (e.line() if isinstance(e, SandboxError) else str(e)).encode()[:400])
            finally:
                os._exit(127)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if err or os.waitstatus_to_exitcode(status) != 0:
        raise GpuError("cannot start the MPS control daemon",
                       err or f"{exe} -d exited with status {os.waitstatus_to_exitcode(status)}",
                       hint="'gpusandbox doctor' checks namespaces and the driver's MPS binaries")


_MS_REC, _MS_SLAVE = 16384, 1 << 19


def _bind_shm(k, shm):
    """shm/ at /dev/shm in the daemon's mount namespace, nosymfollow (and
    nosuid, nodev): sandboxes write there, and the server (root's, for
    root's daemon) must never follow a link one of them planted to a file
    of the host's; fs.protected_symlinks does not stop root following a
    link root's sandbox made."""
    clone = k.open_tree(k.AT_FDCWD, shm, k.OPEN_TREE_CLONE | k.OPEN_TREE_CLOEXEC)
    try:
        k.mount_setattr(clone, k.MOUNT_ATTR_NOSYMFOLLOW | k.MOUNT_ATTR_NOSUID
                        | k.MOUNT_ATTR_NODEV, recursive=False)
        target = os.open("/dev/shm", k.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            k.move_mount(clone, target, "binding the daemon's shm/ at /dev/shm")
        finally:
            os.close(target)
    finally:
        os.close(clone)


def _starttime(pid):
    """The process's start time in clock ticks (pid reuse tells apart), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid, start):
    """Whether process `pid` with start time `start` still runs (a zombie
    waiting for its reaper does not)."""
    if start is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return fields[0] not in ("Z", "X") and int(fields[19]) == start
    except (OSError, ValueError, IndexError):
        return False


def _live_leases(leases):
    """MiB of every lease whose launcher still runs; the others are removed."""
    out = []
    for name in os.listdir(leases):
        pid, _, start = name.partition("-")
        path = os.path.join(leases, name)
        if pid.isdigit() and start == str(_starttime(int(pid))):
            try:
                with open(path) as f:
                    out.append(int(f.read(32).strip()))
                continue
            except (OSError, ValueError):
                pass
        try:
            os.unlink(path)
        except OSError:
            pass
    return out
