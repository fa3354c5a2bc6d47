"""`--container-save=PATH` of the SPANK plugin (pyxis's): the container's
final state written as a squashfs file, which `--container-image=PATH` and
`gpusandbox run PATH` run later.

pyxis's rules: PATH is relative to the job's working directory (its PWD);
the node's last task to end writes it, after every task of the node has
ended, whatever their exit status; a step that spans nodes writes it from
each node (the last rename wins: keep such a PATH per node, or save from a
one-node step).  Written as the submitting user (the plugin runs this as
the user alone), by mksquashfs into a private directory beside PATH, then
renamed over it (image/sqshout.py): a reader sees the old file or the new
one, a failure leaves neither a half-written file nor a temporary.

What is saved: the named container (`--container-name`), or else the
step's own container, a copy of the image made on the node before the
tasks (`.step-JOB.STEP.NODE` beside the named ones) in which the tasks run
writable (`run --rw`), removed once saved.  A store image's bundle keeps its
Env, WorkingDir and command in the file (/.gpusandbox/config.json, as
`pull -o` writes it); a container of a FILE.sqsh keeps the file's own.

The target is checked before the tasks start (the directory exists and the
user may write it, mksquashfs is installed), so a step that could not save
fails with one line before running."""
import json
import os
import shutil

from ..errors import UsageError
from . import spankname

PREFIX = "GPUSANDBOX_SPANK_"


def target(env):
    """The absolute path --container-save names (relative: to the job's PWD)."""
    raw = env.get(PREFIX + "SAVE") or ""
    path = raw
    if not path.startswith("/"):
        cwd = env.get("PWD") or ""
        if not cwd.startswith("/"):
            raise UsageError(f"--container-save={raw}: a relative path, and the job has "
                             "no working directory (PWD)", None, "give an absolute PATH")
        path = os.path.join(cwd, path)
    return os.path.normpath(path)


def check(env):
    """Refuse, before the tasks, a target the user cannot write."""
    raw = env.get(PREFIX + "SAVE")
    path = target(env)
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        raise UsageError(f"--container-save={raw}: {path} is a directory", None,
                         "name the file to write, ending in .sqsh")
    if not os.path.isdir(parent):
        raise UsageError(f"--container-save={raw}: no directory {parent}", None,
                         "create it first, or give a PATH in an existing directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--container-save={raw}: {parent} is not writable by "
                         f"uid {os.getuid()}", None,
                         "give a PATH in a directory you can write")
    if os.path.lexists(path) and not os.path.isfile(path):
        raise UsageError(f"--container-save={raw}: {path} exists and is not a file", None,
                         "remove it, or give another PATH")
    if shutil.which("mksquashfs") is None:
        raise UsageError(f"--container-save={raw}: mksquashfs is not installed on "
                         f"{os.uname().nodename}", None,
                         "install squashfs-tools (Debian/Ubuntu: apt install squashfs-tools)")


def step_container(env):
    """The directory of the step's own container on this node (unnamed)."""
    node = os.uname().nodename
    return os.path.join(spankname.root(env), f".step-{spankname.step_id(env)}.{node}")


def create(env, materialize):
    """Before the tasks: the step's own container, a copy of the image."""
    path = step_container(env)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    spankname.remove_tree(path)         # a leftover of a killed slurmstepd
    tmp = path + ".new"
    try:
        materialize(tmp)
        os.rename(tmp, path)
    except BaseException:
        spankname.remove_tree(tmp)
        raise
    return path


def _image_config(bundle_config):
    """The image config blob that the bundle's config.json (written from one:
    image/store.py bundle_config) stands for: its Env, WorkingDir and command."""
    try:
        with open(bundle_config, "rb") as f:
            doc = json.loads(f.read(1 << 20))
        proc = doc.get("process") or {}
        conf = {"Env": list(proc.get("env") or []), "WorkingDir": proc.get("cwd") or "/"}
        if proc.get("args"):
            conf["Cmd"] = list(proc["args"])
    except (OSError, ValueError, AttributeError, TypeError) as e:
        raise UsageError(f"--container-save: cannot read {bundle_config}", str(e), None) \
            from None
    return json.dumps({"config": conf}).encode()


def write(container, path):
    """The container's directory (a bundle: config.json + rootfs/, or a root
    filesystem) as the squashfs file path, atomically."""
    from ..image.sqshout import write as squash
    try:
        fd = os.open(container, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            config = os.path.join(container, "config.json")
            if os.path.isdir(os.path.join(container, "rootfs")) and os.path.isfile(config):
                squash(fd, "rootfs", path, config=_image_config(config))
            else:
                squash(fd, ".", path)
        finally:
            os.close(fd)
    except OSError as e:
        raise UsageError(f"--container-save: cannot write {path}",
                         e.strerror or str(e), "check that the directory is still there "
                         "and writable by you, and has room") from None


def save(env):
    """After the node's last task: write the target from the named container,
    or from the step's own (then removed, saved or not)."""
    value = env.get(PREFIX + "NAME")
    if value:
        name, _flag = spankname.split(value)
        container = spankname.enter(env, name)      # still this step's: one writer
        write(container, target(env))
        return
    container = step_container(env)
    try:
        if not os.path.isdir(container):
            raise UsageError("--container-save: the step's container is gone", None,
                             "run the step again")
        write(container, target(env))
    finally:
        spankname.remove_tree(container)
