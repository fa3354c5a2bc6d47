"""Pod mode (`run --share node`): the ranks of one (job, step, node) share
one user, pid and IPC namespace and one /dev/shm tmpfs, so that MPI's
shared-memory and single-copy (CMA: kcmp + process_vm_readv) transports and
NCCL's same-host test work between them.  Each rank keeps its own mount
namespace (its /dev holds only its own GPUs), its own cgroup and its own
launcher, whose exit code reaches srun.

No daemon.  The first rank's launcher forks the pod's keeper
(keeper.py): pid 1 of the pod's pid namespace, owner of its user and IPC
namespaces, holding the /dev/shm tmpfs in a mount namespace of its own.  Ranks
meet in a per-(job, step, node) directory under a runtime directory that only
the caller owns: under its lock, a rank connects to the keeper's socket, or,
when there is none (or a dead one), binds a new socket and forks a new keeper;
so N ranks starting at once make exactly one keeper.  The keeper hands each
rank its namespaces by descriptor; the rank's launcher joins the pod's pid
namespace (rootless: its user namespace first) and clones the rank's init,
which joins the rest: the init is the launcher's own child as in an isolated
launch (same pidfd supervision, same PR_SET_PDEATHSIG).  Each launcher keeps
its connection to the keeper open for its whole life and sends it the init's
pidfd; the keeper kills whatever a rank leaves behind when its init exits (the
rank's processes then become the keeper's children: every init is a child
subreaper), and exits, taking the pod with it, once the last connection closes.

Never the dangerous mix: a shared user namespace and /dev/shm with separate
pid namespaces lets a rank's CMA (Open MPI 5's smsc/cma trusts a pid from the
shared segment) address another process of the same number; check_mix
refuses it wherever a set of shared namespaces is formed.
"""
import os

from ..errors import SandboxError, UsageError
from ..linux import host
from ..linux import sys as k
from .podwire import ns_types, recv_fds

SHARED = frozenset(("user", "pid", "ipc", "shm"))
DEFAULT_SHM = 1 << 30
PR_SET_CHILD_SUBREAPER = 36
# What a rank's init makes its own after joining the pod (Member.clone).
_OWN_NS = k.CLONE_NEWNS | k.CLONE_NEWNET | k.CLONE_NEWCGROUP | k.CLONE_NEWUTS
_LE = __import__("sys").byteorder == "little"
_HINT = "pass --share none to run every rank isolated (MPI then needs OMPI_MCA_btl=self,tcp)"


class Pod:
    """What a rank's plan records about its pod (pure data)."""
    __slots__ = ("key", "shm_size", "idmap", "dir", "shm_path")

    def __init__(self, key, shm_size, idmap):
        self.key = key
        self.shm_size = shm_size
        self.idmap = idmap          # the pod's one-id map (rootless), else None
        self.dir = None             # the rendezvous directory (set by join)
        self.shm_path = None        # where the keeper's tmpfs is, in its mount namespace


def check_mix(shared):
    """Refuse a set of shared namespaces that puts ranks in one user namespace
    and one /dev/shm but separate pid namespaces."""
    if {"user", "shm"} <= set(shared) and "pid" not in shared:
        raise UsageError("refusing to share the user namespace and /dev/shm without the pid "
                         "namespace", "CMA (process_vm_readv) would reach the wrong process "
                         "by pid", "share all of them (--share node) or none (--share none)")


def _split_counts(text):
    """'2(x3),1' (Slurm's per-node task counts) -> [2, 2, 2, 1], or None."""
    out = []
    for part in text.split(","):
        num, _, rep = part.partition("(x")
        if not num.isdigit():
            return None
        times = 1
        if rep:
            if not rep.endswith(")") or not rep[:-1].isdigit():
                return None
            times = int(rep[:-1])
        if times > 1 << 16:
            return None
        out.extend([int(num)] * times)
    return out


def tasks_on_node(env):
    """How many tasks of the caller's Slurm step run on this node, or 0
    outside a step.  Read from the caller's environment only."""
    if not env.get("SLURM_STEP_ID") or not env.get("SLURM_JOB_ID"):
        return 0
    node = env.get("SLURM_NODEID", "0")
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        counts = _split_counts(env.get(var) or "")
        if counts and node.isdigit() and int(node) < len(counts):
            return counts[int(node)]
    total = env.get("SLURM_STEP_NUM_TASKS") or ""
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    if total.isdigit() and nodes == "1":
        return int(total)
    return 1


def choose(spec, env):
    """'node' or 'none': --share, else node inside a Slurm step with more than
    one task on this node."""
    if spec.share is not None:
        return spec.share
    return "node" if tasks_on_node(env) > 1 else "none"


def _key(env):
    """The pod's name: (job, step, node) inside Slurm, else GPUSANDBOX_POD."""
    job, step = env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")
    if job and step:
        node = env.get("SLURMD_NODENAME") or os.uname().nodename
        key = f"{job}.{step}.{node}"
    else:
        key = env.get("GPUSANDBOX_POD") or ""
        if not key:
            raise UsageError("--share node outside a Slurm step needs a pod name",
                             "neither SLURM_JOB_ID/SLURM_STEP_ID nor GPUSANDBOX_POD is set",
                             "set GPUSANDBOX_POD=NAME for every rank of the pod")
    if not key.isascii() or len(key) > 100 or key.startswith(".") or \
            not all(c.isalnum() or c in "._-" for c in key):
        raise UsageError(f"invalid pod name {key!r}", "letters, digits, '.', '_' and '-' only "
                         "(at most 100)", None)
    return key


def plan_pod(plan, spec, env):
    """Turn an isolated launch plan into a pod rank's plan (or leave it)."""
    if choose(spec, env) != "node":
        return
    if spec.hostname is not None:
        raise UsageError("--hostname cannot be used with --share node",
                         "ranks of a pod see the host's hostname (NCCL's same-host test)",
                         "drop --hostname, or pass --share none")
    # plan.userns names the mode asked for (single, subids, host); the map
    # itself says whether it is one id (every door's planner sets it).
    if plan.idmap is not None and plan.idmap[0] == "full":
        raise UsageError("--share node works with --userns single or host",
                         "a pod's user namespace has a one-id map", _HINT)
    check_mix(SHARED)
    shm = DEFAULT_SHM
    if spec.shm_size is not None:
        from ..linux.cgfs import _size
        shm = _size("--shm-size", spec.shm_size)
        if shm == "max":
            shm = DEFAULT_SHM
    plan.pod = Pod(_key(env), shm, plan.idmap)
    plan.idmap = None
    plan.clone_flags &= ~(k.CLONE_NEWUSER | k.CLONE_NEWPID | k.CLONE_NEWIPC | k.CLONE_NEWUTS)
    plan.notes.append(f"pod: {plan.pod.key}: user, pid and IPC namespaces and /dev/shm "
                      "shared with the other ranks on this node; the host's hostname")


# --- the runtime directory ---------------------------------------------------------


def _owned_dir(path):
    """path (in the caller's "pods" part) as a directory only the caller owns
    and can enter, by rundir's one rule (made, or an older mode repaired; one
    of another user's, or open to others' writes, refused with a hint)."""
    from .. import rundir
    return rundir.subdir(os.path.dirname(path), os.path.basename(path))


def runtime_dir(env):
    """The caller's "pods" directory (gpusandbox/rundir.py)."""
    from .. import rundir
    return rundir.part("pods", env)


class Member:
    """A rank's hold on its pod: the connection (kept open for the launcher's
    life) and the namespace descriptors to join."""

    def __init__(self, conn, ns, dirfd):
        self.conn = conn
        self.ns = ns                # [(type, fd)] in NS_ORDER
        self.dirfd = dirfd

    def clone(self, flags, cgroup_fd, err_w):
        """clone_fork's contract (0 in the child, its pid in the caller): the
        child is the caller's own child, in the pod's namespaces, with new
        ones of its own for `flags`.

        No helper process: setns(CLONE_NEWPID) only sets the namespace of the
        caller's future children, so the launcher joins the pod's pid
        namespace itself and clones the init straight into it.  Root may do
        that from the host's user namespace; a rootless launcher first joins
        the pod's user namespace (its kernel uid, all the host checks it,
        stays the same; the pod's capabilities never reach the host's
        objects).  The init then joins the rest (setns needs a single-threaded
        process for the user namespace, as both are) and unshares its own
        mount, network and cgroup namespaces from the pod's."""
        ns = dict(self.ns)
        joined = {"pid"}
        try:
            try:
                host.join_ns([("pid", ns["pid"])])
            except OSError as e:
                if e.errno != 1 or "user" not in ns:
                    raise
                host.join_ns([("user", ns["user"]), ("pid", ns["pid"])])
                joined.add("user")
        except OSError as e:
            raise SandboxError("joining the pod's namespaces", e.strerror, _HINT) from None
        own = flags & _OWN_NS
        pid = k.clone_fork(flags & ~_OWN_NS, cgroup_fd)
        if pid:
            return pid
        try:
            host.join_ns([(t, fd) for t, fd in self.ns if t not in joined])
            if own:
                k.unshare(own)
        except OSError as e:
            from ..stages import channel
            channel.fail(err_w, 125, "joining the pod's namespaces", e.strerror, _HINT)
            os._exit(125)
        self.close()
        return 0

    def register(self, pidfd):
        """Hand the keeper the rank's init, so it cleans up after it."""
        import _socket
        self.conn.sendmsg([b"R"], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                                    pidfd.to_bytes(4, "little" if _LE else "big"))])

    def close(self):
        host.close_ns(self.ns)
        self.ns = []
        os.close(self.dirfd)
        self.conn.close()


def join(plan, env):
    """Meet the pod of plan.pod (starting its keeper if this rank is first);
    returns a Member."""
    pod = plan.pod
    base = runtime_dir(env)
    # An ending keeper removes the pod's directory under its lock: a rank that
    # was waiting for that lock finds it unlinked (or the directory gone) and
    # starts over with a new directory.
    for _ in range(50):
        got = _join_once(plan, pod, base)
        if got is not None:
            return got
    raise SandboxError(f"joining the pod {pod.key}", "its directory kept disappearing", _HINT)


def _join_once(plan, pod, base):
    import fcntl
    pod.dir = _owned_dir(base + "/" + pod.key)
    try:
        dirfd = os.open(pod.dir, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        pod.shm_path = pod.dir + "/shm"
        try:
            lock = os.open(f"/proc/self/fd/{dirfd}/lock",
                           os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            os.close(dirfd)
            return None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if os.fstat(lock).st_nlink == 0:
                os.close(dirfd)
                return None
            # Under the lock: an ending keeper removes shm/ before it unlinks
            # the lock, so what is made here stays.
            try:
                _owned_dir(pod.shm_path)
            except FileNotFoundError:
                os.close(dirfd)
                return None
            sock = f"/proc/self/fd/{dirfd}/sock"
            got = _hello(sock, pod)
            if got is None:
                from . import keeper
                _sweep_stale(base, pod.key)
                keeper.start(plan, sock, dirfd)
                got = _hello(sock, pod)
                if got is None:
                    raise SandboxError(f"starting the pod's keeper in {pod.dir}",
                                       "it did not answer", _HINT)
        finally:
            os.close(lock)
    except BaseException:
        os.close(dirfd)
        raise
    conn, ns = got
    return Member(conn, ns, dirfd)


def _sweep_stale(base, own):
    """Remove the directories of pods whose keeper was killed (SIGKILL from
    scancel, the OOM killer): no live socket, lock free.  Same order as an
    ending keeper (under the lock, shm/ before the lock file), so a rank
    joining one of them starts over."""
    import fcntl
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        if name == own:
            continue
        path = f"{base}/{name}"
        try:
            lock = os.open(f"{path}/lock", os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(lock).st_nlink == 0 or _hello_alive(f"{path}/sock"):
                continue
            for rel, rm in (("sock", os.unlink), ("shm", os.rmdir), ("lock", os.unlink)):
                try:
                    rm(f"{path}/{rel}")
                except FileNotFoundError:
                    pass
            os.rmdir(path)
        except OSError:
            pass
        finally:
            os.close(lock)


def _hello_alive(path):
    """Whether a keeper listens on `path` (connect alone, nothing sent)."""
    import _socket
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        s.connect(path)
        return True
    except FileNotFoundError:
        return False
    except ConnectionRefusedError:
        return False
    except OSError:
        return True          # unsure: leave it
    finally:
        s.close()


def _hello(path, pod):
    """(connection, namespace fds) from the pod's keeper, or None when there
    is no live keeper.  The keeper's answer: b"P" + its id map, with the
    namespace fds; or b"E" + why it could not set the pod up."""
    import _socket
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        conn.connect(path)
        msg, fds = recv_fds(conn, 4096, 8)
    except OSError:
        conn.close()
        return None
    if not msg:
        conn.close()
        for fd in fds:
            os.close(fd)
        return None
    if msg[:1] == b"E":
        conn.close()
        raise SandboxError(f"setting up the pod in {pod.dir}", msg[1:].decode("utf-8", "replace"),
                           _HINT)
    want = ns_types(pod.idmap)
    if msg[1:].decode() != repr(pod.idmap) or len(fds) != len(want):
        conn.close()
        for fd in fds:
            os.close(fd)
        raise SandboxError(f"joining the pod {pod.key}", "its first rank was started with other "
                           "identity options (--root, --userns)",
                           "start every rank of a step with the same options")
    return conn, list(zip(want, fds))
