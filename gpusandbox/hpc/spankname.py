"""Named containers of the SPANK plugin (`--container-name=NAME`, pyxis's):
the container's root filesystem kept after the step, written by the steps
that name it, until `gpusandbox slurm containers rm NAME`.

    $GPUSANDBOX_CONTAINERS (default $XDG_DATA_HOME/gpusandbox/containers)/
        NAME/            a copy of the image: its OCI bundle (config.json, so
                         the image's environment and working directory still
                         apply, and rootfs/), or a root filesystem directory
        NAME.lock        flock: exclusive while a step takes the container,
                         shared while its tasks run
        NAME.owner       the job.step that took it last

One writer: a step takes the container (its check, before the tasks) with
an exclusive lock that fails at once while another step's tasks hold their
shared ones; every task then takes a shared lock and checks that the owner
is still its own step, so two steps never write one container together: the
later one, or the tasks of an earlier one that lost it, stop with one line.
The container is per user (the directory is the user's) and per directory:
keep GPUSANDBOX_CONTAINERS node-local for a step that spans nodes.

pyxis's `NAME:FLAG` forms: auto (the default) joins the container while
another step of the job runs in it, else takes it, created on first use;
create refuses a NAME that exists; exec joins a running one and refuses
one that is not; no_exec never joins (a running step's container is then
refused, one writer).  Joining (holder() here, spanktask.join_step) enters
the sandbox of the step that holds the container as `gpusandbox exec
--job` does; the joining step takes no lock: its processes live in the
holder's sandbox, and end with it."""
import fcntl
import os
import shutil
import subprocess

from ..errors import UsageError

_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
FLAGS = ("auto", "create", "exec", "no_exec")


def root(env):
    top = env.get("GPUSANDBOX_CONTAINERS")
    if top:
        return top
    data = env.get("XDG_DATA_HOME") or os.path.join(env.get("HOME") or "/", ".local", "share")
    return os.path.join(data, "gpusandbox", "containers")


def check_name(name):
    if not name or len(name) > 64 or name.startswith(".") or not set(name) <= _OK:
        raise UsageError(f"invalid container name {name[:80]!r}",
                         "letters, digits, '.', '_' and '-' only, at most 64, not starting "
                         "with '.'", None)
    return name


def split(value):
    """--container-name's NAME[:FLAG] -> (NAME, FLAG), FLAG auto by default."""
    name, colon, flag = value.partition(":")
    if colon and flag and flag not in FLAGS:   # pyxis: an empty FLAG is auto
        raise UsageError(f"--container-name={value[:80]}: unknown flag {flag[:20]!r}",
                         None, "NAME:FLAG takes auto, create, exec or no_exec")
    return check_name(name), flag or "auto"


def step_id(env):
    return f"{env.get('SLURM_JOB_ID', '')}.{env.get('SLURM_STEP_ID', 'batch')}"


def _open_lock(env, name):
    top = root(env)
    try:
        os.makedirs(top, mode=0o700, exist_ok=True)
        return os.open(os.path.join(top, name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
                       | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise UsageError(f"--container-name={name}: cannot open the container's lock in {top}",
                         e.strerror, "named containers are per user: give a directory of "
                         "yours in GPUSANDBOX_CONTAINERS") from None


def _lock(env, name, how):
    fd = _open_lock(env, name)
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise UsageError(f"--container-name={name}: the container is in use by another step",
                         None, "wait for that step to end, or give another name") from None
    return fd


def _owner(env, name):
    try:
        with open(os.path.join(root(env), name + ".owner")) as f:
            return f.read().strip()
    except OSError:
        return ""


def holder(env, name):
    """The step id (digits) of another step of this job whose tasks run in
    NAME on this node, or None: NAME's owner is JOB.STEP of this job, not
    this step, and its lock is held (probed exclusively only then, so the
    tasks of the step that owns it never meet the probe).  A container held
    by a step of another job is never joined (its sandbox is in that job's
    cgroup)."""
    check_name(name)
    job, dot, step = _owner(env, name).partition(".")
    if not (dot and job == env.get("SLURM_JOB_ID") and step.isdigit()
            and f"{job}.{step}" != step_id(env)):
        return None
    if not os.path.exists(os.path.join(root(env), name + ".lock")):
        return None
    fd = _open_lock(env, name)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None                     # nobody runs in it (closing the fd releases it)
    except BlockingIOError:
        return step
    finally:
        os.close(fd)


def take(env, name, materialize, flag="auto"):
    """The step's check: lock NAME exclusively, create it from the image on
    first use (materialize(tmpdir) fills tmpdir), record this step as its
    owner.  Returns its directory.  flag: --container-name's FLAG."""
    check_name(name)
    top = root(env)
    path = os.path.join(top, name)
    if flag == "create" and os.path.isdir(path):
        raise UsageError(f"--container-name={name}:create: the container already exists",
                         None, f"remove it first (gpusandbox slurm containers rm {name}), "
                               "or leave out :create to reuse it")
    try:
        fd = _lock(env, name, fcntl.LOCK_EX)
    except UsageError:
        if flag == "exec":
            raise UsageError(f"--container-name={name}:exec: the container runs in step "
                             f"{_owner(env, name) or '(unknown)'}, not a step of this job",
                             None, "join it from its own job (srun --overlap --jobid "
                             "JOB), or wait for that step to end") from None
        raise
    if flag == "exec":
        os.close(fd)
        if not os.path.isdir(path):
            _unlink(os.path.join(top, name + ".lock"))
        raise UsageError(f"--container-name={name}:exec: the container is not running",
                         None, "start a step in it first, or name it without :exec")
    try:
        if not os.path.isdir(path):
            tmp = os.path.join(top, f".{name}.new.{os.getpid()}")
            try:
                materialize(tmp)
                os.rename(tmp, path)
            except BaseException:
                remove_tree(tmp)
                _unlink(os.path.join(top, name + ".lock"))     # nothing left of NAME
                raise
        owner = os.path.join(top, name + ".owner")
        with open(owner + ".tmp", "w") as f:
            f.write(step_id(env) + "\n")
        os.rename(owner + ".tmp", owner)
        return path
    finally:
        os.close(fd)


def enter(env, name):
    """A task: hold NAME shared for this process's life (the launcher's; the
    descriptor is close-on-exec) and check the step still owns it.  Returns
    the container's run argument."""
    check_name(name)
    fd = _lock(env, name, fcntl.LOCK_SH)
    top = root(env)
    owner = _owner(env, name)
    if owner != step_id(env):
        os.close(fd)
        raise UsageError(f"--container-name={name}: the container was taken by step "
                         f"{owner or '(none)'}", None, "give another name, or run the steps "
                         "one after the other")
    return os.path.join(top, name)


def copy_tree(src, dst):
    r = subprocess.run(["cp", "-a", "--reflink=auto", src, dst], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        raise UsageError(f"cannot copy {src} into a named container",
                         (r.stdout.strip().splitlines() or ["cp failed"])[-1], None)


def unsquash(sqsh, dst):
    r = subprocess.run(["unsquashfs", "-no-xattrs", "-d", dst, sqsh], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        raise UsageError(f"cannot unpack {sqsh} into a named container",
                         (r.stdout.strip().splitlines() or ["unsquashfs failed"])[-1],
                         "install squashfs-tools")


def remove_tree(path):
    """rmtree that also removes read-only directories (an image's 0555 ones)."""
    def retry(func, p, _exc):
        parent = os.path.dirname(p)
        try:
            os.chmod(parent, 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass
    if os.path.lexists(path):
        shutil.rmtree(path, onerror=retry)


def names(env):
    top = root(env)
    try:
        return sorted(n for n in os.listdir(top) if not n.startswith(".")
                      and os.path.isdir(os.path.join(top, n)))
    except FileNotFoundError:
        return []


def remove(env, name):
    check_name(name)
    path = os.path.join(root(env), name)
    if not os.path.isdir(path):
        raise UsageError(f"no container named {name}", None,
                         "list them: gpusandbox slurm containers")
    fd = _lock(env, name, fcntl.LOCK_EX)
    try:
        remove_tree(path)
        _unlink(path + ".owner")
        _unlink(path + ".lock")
    finally:
        os.close(fd)


def _unlink(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
