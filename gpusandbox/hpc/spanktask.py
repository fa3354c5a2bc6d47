"""The task program of the SPANK plugin (spank_gpusandbox.c): pyxis's options,
handed over in GPUSANDBOX_SPANK_* variables, become `gpusandbox run OPTIONS
IMAGE -- ARGV` in this same process.

slurmstepd execs this program as the step's task (the plugin swapped it in as
argv[0] and kept the original in GPUSANDBOX_SPANK_ARGV0), so the launcher that
`run` becomes is the pid Slurm waits for, signals and accounts, with the task's
stdio and PMI descriptors; its exit status is the step's.

The plugin has checked the grammar of every value on the login node; what is
left here is the meaning: enroot's image URI, pyxis's mount entries and
booleans, each mapped onto a `run` option (docs/slurm.md has the table)."""
import os
import sys

PREFIX = "GPUSANDBOX_SPANK_"
# Mount flags: what gpusandbox's binds always are (recursive, rslave, nosuid,
# nodev), and the two that choose. The plugin accepts exactly these.
_ALWAYS = ("rbind", "rslave", "nosuid", "nodev")
_MODES = ("ro", "rw")
# gpusandbox's references that name no registry image.
_LOCAL = ("oci:", "oci-archive:", "docker-archive:")


class Refused(Exception):
    """A value the plugin let through but gpusandbox cannot honour."""

    def __init__(self, what, hint):
        super().__init__(what)
        self.hint = hint


def image_ref(image):
    """pyxis/enroot's image argument -> gpusandbox's IMAGE.

    A path (leading / or .) is a squashfs file or a directory; gpusandbox's
    oci:, oci-archive: and docker-archive: references pass as they are;
    anything else is a registry image as for enroot: `[USER@][REGISTRY#]
    IMAGE[:TAG]` becomes docker://REGISTRY/IMAGE, a plain NAME[:TAG]
    docker://NAME[:TAG] (docker's short-name rule; the store is looked at
    first, so an image already there is not fetched again).  USER@ names
    enroot's credentials: gpusandbox reads the registry's from its auth
    files, so the user part is dropped."""
    if image.startswith(("/", ".")) or image.startswith(_LOCAL):
        return image
    if image.startswith("dockerd://") or image.startswith("podman://"):
        raise Refused(f"--container-image={image}: images of a local Docker or podman "
                      "daemon are not read", "save it (docker save -o FILE.tar) and give "
                      "docker-archive:FILE.tar, or push it to a registry")
    rest = image[len("docker://"):] if image.startswith("docker://") else image
    at = rest.find("@")
    if at >= 0 and not rest[at + 1:].startswith("sha256:") and \
            ("#" not in rest or at < rest.find("#")):
        rest = rest[at + 1:]
    if "#" in rest:
        registry, _, name = rest.partition("#")
        if not registry or not name:
            raise Refused(f"--container-image={image}: REGISTRY#IMAGE needs both parts",
                          "example: --container-image=nvcr.io#nvidia/pytorch:24.05-py3")
        return f"docker://{registry}/{name}"
    return f"docker://{rest}"


def mount_args(value, cwd):
    """--container-mounts=SRC[:DST[:FLAGS]][,...] -> run's -v / --mount options."""
    out = []
    for entry in value.split(","):
        parts = entry.split(":")
        src, dst = parts[0], parts[1] if len(parts) > 1 else None
        flags = parts[2].split("+") if len(parts) > 2 else []
        unknown = [f for f in flags if f not in _ALWAYS + _MODES]
        if unknown:
            raise Refused(f"--container-mounts={entry}: unknown flag {unknown[0]}",
                          "flags: ro, rw (binds are always rbind, rslave, nosuid, nodev)")
        modes = [f for f in flags if f in _MODES]
        ro = bool(modes) and modes[-1] == "ro"        # the last one given wins
        if src == "tmpfs":
            if not dst:
                raise Refused(f"--container-mounts={entry}: tmpfs needs a DST",
                              "example: --container-mounts=tmpfs:/scratch")
            out += ["--mount", f"type=tmpfs,dst={dst}" + (",ro" if ro else "")]
            continue
        if src == "umount":
            raise Refused(f"--container-mounts={entry}: umount is not supported",
                          "the image's own mounts are not made by gpusandbox: drop the entry")
        src = os.path.normpath(os.path.join(cwd, src))
        out += ["-v", f"{src}:{dst or src}:{'ro' if ro else 'rw'}"]
    return out


def run_argv(env, argv0, args, cwd, nodename, tty=False, container=None):
    """The `gpusandbox run` argv for this task (without the leading 'run');
    `container`: the directory of the named container it runs in."""
    def get(name):
        return env.get(PREFIX + name)
    image = get("IMAGE")
    if not image and not container:
        raise Refused("no --container-image reached the task",
                      "this program is started by the gpusandbox SPANK plugin only")
    ref = container or image_ref(image)
    out = ["--rw"] if container else []
    if get("MOUNTS"):
        out += mount_args(get("MOUNTS"), cwd)
    if get("MOUNT_HOME") == "1":
        home = env.get("HOME")
        if not home or not home.startswith("/"):
            raise Refused("--container-mount-home: the job has no absolute HOME",
                          "set HOME, or bind it with --container-mounts")
        out += ["-v", f"{home}:{home}:rw"]
    if get("WORKDIR"):
        out += ["-w", get("WORKDIR")]
    for name in (get("ENV") or "").split(","):
        if name:
            out += ["-e", name]
    unshare = set((get("UNSHARE") or "").split(","))
    # pyxis shares the node's network unless net is unshared; gpusandbox's
    # own default gives a command that is uid 0 on the host a private one.
    out += ["--net", "none" if "net" in unshare else "host"]
    # UTS and IPC are always private in gpusandbox (IPC pod-wide in a step
    # with several tasks on the node); the hostname is the node's, as under
    # pyxis whether or not uts is unshared: a pod (several tasks on the node)
    # keeps it already, a lone task is told.
    from .pod import tasks_on_node
    if tasks_on_node(env) <= 1:
        out += ["--hostname", nodename]
    if get("REMAP_ROOT") == "1":
        out += ["--root"]
    if get("WRITABLE") == "1" and not container:
        out += ["--writable-tmpfs"]
    if get("BATCH") == "1" and argv0.startswith("/"):
        out += ["-v", f"{argv0}:{argv0}:ro"]        # the spooled batch script
    if tty:
        out += ["-t"]               # srun --pty: the task's stdin is slurmstepd's terminal
    path = os.path.join(cwd, ref) if ref.startswith(".") else ref
    if get("ENTRYPOINT") != "1" and not container and not os.path.isdir(path):
        out += ["--entrypoint", ""]
    return out + [ref, "--", argv0, *args]


def resolve(image):
    """IMAGE resolved as `run` would, pulled on a miss: its RunSpec."""
    from ..cli import parse_run_args
    from ..errors import UsageError
    spec = parse_run_args([image_ref(image), "true"])
    if spec.image_ref:
        from ..image.storeread import prepare as cached
        if not cached(spec):
            from ..image.runimage import prepare as pull
            pull(spec)
    elif not os.path.exists(spec.image):
        raise UsageError(f"--container-image={image}: no such file or directory",
                         hint="give an existing FILE.sqsh, a root filesystem directory or "
                              "an image reference")
    return spec


def materialize(image, tmp):
    """Fill the new directory tmp with a copy of IMAGE: the store's bundle
    (config.json: its env and cwd, + rootfs/), a root filesystem directory,
    or a FILE.sqsh unpacked."""
    from . import spankname
    spec = resolve(image)
    if spec.image_ref:
        spankname.copy_tree(os.path.dirname(spec.image), tmp)
    elif os.path.isdir(spec.image):
        spankname.copy_tree(spec.image, tmp)
    else:
        spankname.unsquash(spec.image, tmp)


def prepare(env):
    """The plugin's user_init (GPUSANDBOX_SPANK_PREPARE=1; once per node and
    step, before any task): resolve the image as `run` would, pulling it on
    a miss, so that a missing image fails the step with one line before its
    tasks start and the tasks find it in the store; with --container-name,
    take the named container (created from the image on first use); with
    --container-save, check its target and, unnamed, make the step's own
    container that the tasks write and the save reads (spanksave)."""
    from ..errors import UsageError
    image, value = env.get(PREFIX + "IMAGE"), env.get(PREFIX + "NAME")
    save = env.get(PREFIX + "SAVE")
    if not image and not value:
        raise UsageError(f"--container-save={save}: nothing to save", None,
                         "give --container-image=IMAGE or --container-name=NAME with it")
    if save:
        from . import spanksave
        spanksave.check(env)
    if not value:
        if save:
            spanksave.create(env, lambda tmp: materialize(image, tmp))
        else:
            resolve(image)
        return
    from . import spankname
    name, flag = spankname.split(value)
    step = spankname.holder(env, name) if flag in ("auto", "exec") else None
    if step is not None:
        if save:
            raise UsageError(f"--container-save: the container {name} runs in step "
                             f"{env.get('SLURM_JOB_ID')}.{step}, which this step would join",
                             None, "save it from that step, or once it has ended")
        join_target(env, step)       # found now: a failure is one line before the tasks
        return

    def make(tmp):
        if not image:
            raise UsageError(f"--container-name={name}: no such container", None,
                             f"create it: --container-image=IMAGE --container-name={name}")
        materialize(image, tmp)
    spankname.take(env, name, make, flag)


# Options that choose how a container's sandbox is made: a step that joins
# a running one takes it as it is (pyxis: "ignoring --container-mounts").
# The entrypoint and --container-writable never apply to a named container.
_MADE = (("IMAGE", "--container-image"), ("MOUNTS", "--container-mounts"),
         ("MOUNT_HOME", "--container-mount-home"), ("REMAP_ROOT", "--container-remap-root"),
         ("UNSHARE", "--container-unshare"))


def join_target(env, step):
    """The live record of step `step` of this job on this node whose
    sandbox holds the named container (its lowest rank here), found as
    `gpusandbox exec --job` finds it: the caller's own."""
    from ..live.execcli import slurm_record
    return slurm_record(env.get("SLURM_JOB_ID"), step, None, lowest=True)


def join_step(env, name, step, argv0, args):
    """Run this task's command in the running sandbox of step `step` that
    holds the named container: live's join (live/join.py), from the
    settings that sandbox's launcher recorded, so never with more than its
    command has.  This process stays the task (Slurm's pid, its stdio);
    it forwards HUP INT QUIT USR1 USR2 TERM and returns the command's
    status.  --container-workdir and --container-env apply; so do the
    job's variables of this step (SLURM_*, PMI*, ...: environ's rule)."""
    from ..environ import JOB_PREFIXES, NEVER_PASS
    ignored = [opt for var, opt in _MADE if env.get(PREFIX + var) not in (None, "", "0")]
    if ignored:
        sys.stderr.write(f"gpusandbox: warning: joining the running container {name} "
                         f"(step {env.get('SLURM_JOB_ID')}.{step}): ignoring "
                         f"{', '.join(ignored)}\n")
    rec = join_target(env, step)
    wanted = [k for k in env if k.startswith(JOB_PREFIXES) and k not in NEVER_PASS]
    wanted += [n for n in (env.get(PREFIX + "ENV") or "").split(",") if n]
    workdir = env.get(PREFIX + "WORKDIR") or None
    host_env = {k: v for k, v in env.items() if not k.startswith(PREFIX)}
    from ..live import join
    tty = os.isatty(0)
    plan = join.make_plan(rec, [argv0, *args], wanted, workdir, tty, host_env)
    return join.run(rec, plan, tty)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    env = os.environ
    mode = env.get(PREFIX + "PREPARE")
    if mode in ("1", "save"):
        from ..errors import SandboxError, message
        try:
            if mode == "1":
                prepare(env)
            else:
                from .spanksave import save
                save(env)
        except Refused as e:
            from ..errors import UsageError
            e = UsageError(str(e), None, e.hint)
            sys.stderr.write(message(e))
            return e.code
        except SandboxError as e:
            sys.stderr.write(message(e))
            return e.code
        return 0
    from ..errors import SandboxError
    argv0 = env.get(PREFIX + "ARGV0", "")
    try:
        if not argv0:
            raise Refused("GPUSANDBOX_SPANK_ARGV0 is not set",
                          "this program is started by the gpusandbox SPANK plugin only")
        container = None
        if env.get(PREFIX + "NAME"):
            from .spankname import enter, holder, split
            name, flag = split(env[PREFIX + "NAME"])
            step = holder(env, name) if flag in ("auto", "exec") else None
            if step is not None:
                return join_step(env, name, step, argv0, argv)
            if flag == "exec":
                raise Refused(f"--container-name={name}:exec: the container is not running",
                              "start a step in it first, or name it without :exec")
            container = enter(env, name)            # held while we live
        elif env.get(PREFIX + "SAVE"):
            from .spanksave import step_container
            container = step_container(env)         # the step's own, made before the tasks
        run = run_argv(env, argv0, argv, os.getcwd(), os.uname().nodename, os.isatty(0),
                       container)
    except Refused as e:
        from ..errors import UsageError, message
        sys.stderr.write(message(UsageError(str(e), None, e.hint)))
        return 125
    except SandboxError as e:
        from ..errors import message
        sys.stderr.write(message(e))
        return e.code
    for k in [k for k in env if k.startswith(PREFIX)]:
        del env[k]
    from ..__main__ import main as gpusandbox
    return gpusandbox(["run", *run])


if __name__ == "__main__":
    sys.exit(main())
