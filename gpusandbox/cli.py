"""`gpusandbox run`: argv -> RunSpec -> launch.  The only module of the run
path that prints errors and chooses exit codes.

The parser is hand-written on purpose: argparse costs ~10 ms of imports on a
launch that should take ~20 ms in total.  Options come before IMAGE_DIR;
everything after IMAGE_DIR (an optional `--` first) is the command."""
import os
import sys

from .errors import SandboxError, UsageError, EXIT_LAUNCHER, message
from .spec import RunSpec, names_squashfs

RUN_USAGE = "gpusandbox run [options] IMAGE [--] [CMD [ARG...]]"

RUN_HELP = f"""usage: {RUN_USAGE}

Run CMD inside IMAGE: a root filesystem directory, an OCI bundle (config.json
and rootfs/), or an image reference: docker://[HOST[:PORT]/]REPO[:TAG|@DIGEST],
oci:DIR[:TAG], oci-archive:FILE[:TAG], docker-archive:FILE[:NAME:TAG] (pulled
into the store first), NAME[:TAG] already in the store, or a squashfs image file
FILE.sqsh / FILE.squashfs (mounted read-only; squashfuse rootless), or / for the host's
own userland, read-only, with the homes hidden (docs/workstation.md).  Short names follow
docker's rule: ubuntu is docker.io/library/ubuntu:latest.  For an image (and a
FILE.sqsh written by `pull -o`, which carries its config), CMD is optional (its
Entrypoint + Cmd).  CMD is looked up on the image's PATH.

GPUs:
  --gpus all|none|auto|LIST   GPUs to inject: indices, GPU-<uuid>, PCI bus ids, MIG g:i, MIG-<uuid>
                              (default: the caller's NVIDIA_VISIBLE_DEVICES; unset = no GPU support);
                              a GPU named twice is refused.  Docker's forms: device=LIST (also
                              '"device=1,2"'), count=N (the first N GPUs), count=all.  A bare
                              number is an index: --gpus 2 is GPU 2, not two GPUs (a note says so)
  --gpu-caps CAPS             driver capabilities (default utility,compute; 'all')
  --gpu-memory SIZE           GPU memory ceiling per CUDA process (8G, 512M) through MPS
  --gpu-compute PCT           share of the GPU's SMs per CUDA process (30%) through MPS
                              (docs/sharing.md: what enforces them and where they end)
  --cuda-compat auto|off|force  prefer the image's forward-compat libcuda (default auto)
  --driver-root DIR           where the host driver lives (default: the driver-root setting,
                              $GPUSANDBOX_DRIVER_ROOT or oci.conf, docs/runtime.md; else /)
  --dev-root DIR              where its device nodes live (default: without --driver-root,
                              the dev-root setting; else DRIVER_ROOT/dev)
  --no-require                skip the image's CUDA requirement check (warns)
  --device HOST[:DST]         add a host character device (e.g. /dev/infiniband/uverbs0) at
                              DST under /dev (default: the same path, or /dev/NAME);
                              allowed through the device filter, checked by number
  --device VENDOR/CLASS=NAME  a CDI device (e.g. nvidia.com/gpu=0) from the specs in /etc/cdi,
                              /var/run/cdi (or $GPUSANDBOX_CDI_SPEC_DIRS); see docs/cdi.md
Fabric (docs/fabric.md):
  --fabric auto|all|none|HCA[,HCA]
                              RDMA adapters (InfiniBand/RoCE) to inject: auto (the default with
                              GPUs) gives the HCAs nearest the task's GPUs by PCI topology;
                              sets NCCL_IB_HCA and UCX_NET_DEVICES unless the caller did.
                              Also read: MELLANOX_VISIBLE_DEVICES, NVIDIA_MOFED, NVIDIA_GDRCOPY,
                              NVIDIA_GDS, NVIDIA_NVSWITCH, NVIDIA_IMEX_CHANNELS (the caller's only)
  --fabric-libs host|image    host: inject the host's libibverbs, librdmacm and their providers;
                              image: the image's own rdma-core (the default)
  --mpi host|image            host: replace the image's MPI by the host's (MPICH ABI, checked);
                              image: the image's own (the default)
Identity and namespaces:
  --root                      map the caller to uid 0 inside (rootless fakeroot)
  --userns auto|single|subids|host
                              auto: a user namespace when not root; single: one-id map;
                              subids: full range via newuidmap/newgidmap; host: none (root only)
  -u, --user UID[:GID]        run as this user (real root only), supplementary groups cleared
  --net host|none             host: share the host's network namespace; none: a private one with
                              loopback only.  Default: none when the command would be uid 0 on
                              the host (real root without --user), else host
  --hostname NAME             hostname inside (default: gpusandbox)
  --share node|none           node: share the user, pid and IPC namespaces and /dev/shm with
                              the other ranks of this Slurm step on this node (pod mode, for
                              MPI shared memory and CMA, NCCL); none: isolated.  Default: node
                              in a step with more than one task on the node, else none.
                              Outside Slurm the pod is named by GPUSANDBOX_POD (docs/pod.md)
  --shm-size SIZE             the pod's /dev/shm size (default 1g)
  --gpu-visibility task|step  task: each rank sees its own GPUs only; step: every GPU of the
                              step on this node, the rank's own first
Root filesystem:
  --writable-tmpfs            private writable overlay over the image, discarded at exit
                              (refused for /: no overlay can carry the host's submounts)
  --rw                        write through to IMAGE_DIR (missing mount points are created in it;
                              refused for /)
  -v, --bind, --volume SRC:DST[:ro|rw]
                              bind-mount a host path (repeatable; default rw)
  -v PATH                     the host's PATH at the same path inside, rw
  --mount type=bind,src=SRC,dst=DST[,ro]
                              docker's spelling of -v (source=, target=, destination=, readonly;
                              bind-propagation=rslave only: what every bind does)
  --mount type=tmpfs,dst=DST[,tmpfs-size=SIZE][,tmpfs-mode=OCTAL][,ro]
                              a fresh tmpfs at DST (default mode 1777, size: half of RAM)
                              Every -v and --mount is nosuid,nodev; they apply in the order given
Process:
  -w, --workdir DIR           working directory (default: the image's, else /)
  -e, --env KEY=VALUE|KEY     set a variable (KEY alone copies the host's value)
  --env-file FILE             KEY=VALUE lines
  --env-host                  pass the whole host environment (never LD_PRELOAD, LD_LIBRARY_PATH,
                              PYTHONPATH unless given with -e)
  -t, --tty                   allocate a pseudo-terminal when stdin is a terminal
  -i, --interactive           accepted for docker's habit (-it, -ti): stdin is always the caller's
  --name NAME                 name the sandbox (unique among yours): 'gpusandbox exec NAME',
                              'ps', 'stop', 'logs' find it (docs/live.md)
  -d, --detach                run in the background: print the name once the command started,
                              output to a log ('gpusandbox logs NAME'), status kept until 'rm'
  --rm                        with -d: remove the record when the sandbox ends (without -d a
                              sandbox never outlives its command, and leaves no record)
  --seccomp PROFILE|unconfined  seccomp profile name (default, profiling) or JSON file
cgroup:
  --cgroup-parent PATH        parent cgroup for the sandbox's leaf (default: the launcher's)
  --memory N  --memory-swap N --pids-limit N  --cpus N
  --best-effort-limits        warn instead of failing when a controller is missing
Images (see docs/images.md):
  --entrypoint CMD            replace the image's Entrypoint (and drop its Cmd); '' clears it
  --platform OS/ARCH[/VAR]    the platform to pull and run (default: this host's)
  --store DIR                 the image store (default $GPUSANDBOX_STORE, else
                              $XDG_DATA_HOME/gpusandbox/store)
Other:
  --mount-home, --no-mount-home
                              bind your home (from passwd) at its path, or not (default: the
                              mount-home setting, docs/config.md; else not)
  --profile untrusted         for code you do not trust: only the current directory writable
                              (-v $PWD:$PWD -w $PWD), --net none, no host sockets or their
                              variables; options you give win (docs/workstation.md)
  --verbose                   print what was set up (cgroup, device filter, mounts) to stderr
  -h, --help

Exit status: 125 launcher error, 126 command not executable, 127 command not
found, 128+N command killed by signal N, else the command's own status.
"""

# option -> (attribute or handler name, takes a value)
_OPTS = {
    "--gpus": "gpus", "--gpu-caps": "gpu_caps", "--driver-root": "driver_root",
    "--dev-root": "dev_root", "--userns": "userns", "--user": "user", "--net": "net",
    "--hostname": "hostname", "-v": "bind", "--bind": "bind", "--volume": "bind",
    "--mount": "mount", "-u": "user",
    "-w": "workdir", "--workdir": "workdir", "-e": "env", "--env": "env",
    "--env-file": "env_file", "--seccomp": "seccomp", "--cgroup-parent": "cgroup_parent",
    "--memory": "memory", "--memory-swap": "memory_swap", "--pids-limit": "pids_limit",
    "--cpus": "cpus", "--device": "device", "--entrypoint": "entrypoint",
    "--platform": "platform", "--store": "store",
    "--gpu-memory": "gpu_memory", "--gpu-compute": "gpu_compute", "--cuda-compat": "cuda_compat",
    "--share": "share", "--shm-size": "shm_size", "--gpu-visibility": "gpu_visibility",
    "--profile": "profile", "--name": "name",
    "--fabric": "fabric", "--fabric-libs": "fabric_libs", "--mpi": "mpi",
}
_FLAGS = {
    "--root": "fakeroot", "--writable-tmpfs": "writable_tmpfs", "--rw": "rw",
    "--env-host": "env_host", "-t": "tty", "--tty": "tty", "--verbose": "verbose",
    "--no-require": "no_require", "--best-effort-limits": "best_effort",
    "--mount-home": "mount_home", "--no-mount-home": "no_mount_home",
    # docker's habits with nothing to do here: stdin is always passed on, and
    # a sandbox never outlives its command.
    "-i": None, "--interactive": None, "--rm": "auto_remove",
    "-d": "detach", "--detach": "detach",
}
# The options that take one of a few words (checked by _option; shell
# completion offers them).
CHOICES = {
    "--userns": ("auto", "single", "subids", "host"), "--cuda-compat": ("auto", "off", "force"),
    "--share": ("node", "none"), "--gpu-visibility": ("task", "step"), "--net": ("host", "none"),
    "--fabric-libs": ("host", "image"), "--mpi": ("host", "image"),
}
# Short options that take a value, for docker's clusters (-it, -itv SRC:DST,
# -w/tmp): the last letter of a cluster may take the rest, or the next word.
_SHORT_VALUE = {o for o in _OPTS if len(o) == 2}
_SHORT_FLAG = {o for o in _FLAGS if len(o) == 2}
_OPT_HINT = "run 'gpusandbox run --help' for the options"


def _bad(what, why, hint):
    raise UsageError(what, why, hint)


def parse_device(value):
    host, _, dst = value.partition(":")
    if not dst:
        dst = host if host.startswith("/dev/") else "/dev/" + os.path.basename(host)
    if not host.startswith("/") or not dst.startswith("/dev/") or ".." in dst.split("/") \
            or "\0" in value:
        _bad(f"invalid --device {value!r}", "expected HOST[:DST] with DST under /dev",
             "example: --device /dev/infiniband/uverbs0")
    return (host, os.path.normpath(dst))


def is_cdi_name(value):
    """VENDOR/CLASS=NAME (a CDI device) rather than HOST[:DST]: a host path
    is absolute, a CDI kind never is.  The name is checked when resolved."""
    kind, eq, _ = value.partition("=")
    return bool(eq) and not value.startswith("/") and "/" in kind


def parse_env_item(value):
    key = value.partition("=")[0]
    if not key or "\0" in value or not (key[0].isalpha() or key[0] == "_") or \
            not all(c.isalnum() or c == "_" for c in key):
        _bad(f"invalid --env {value!r}", "expected KEY=VALUE or KEY with KEY made of "
             "letters, digits and _", "example: -e OMP_NUM_THREADS=8")
    return value


def parse_user(value):
    uid, _, gid = value.partition(":")
    try:
        u = int(uid)
        g = int(gid) if gid else u
        if u < 0 or g < 0:
            raise ValueError
    except ValueError:
        _bad(f"invalid --user {value!r}", "expected numeric UID[:GID]", "example: --user 1000:1000")
    return (u, g)


_TRANSPORTS = ("docker://", "oci:", "oci-archive:", "docker-archive:")


def is_image_ref(text):
    """IMAGE names an image (not a directory) by its form: a transport
    prefix, or a NAME[:TAG|@DIGEST] that is not an existing directory.  Only
    string checks and one stat: `run DIR` imports no image module."""
    if text.startswith(_TRANSPORTS):
        return True
    if not text or text.startswith(("/", ".")) or os.path.isdir(text):
        return False
    if names_squashfs(text) and os.path.lexists(text):
        return False  # a squashfs image file (image/squash.py), named relatively
    return text.isascii() and all(c.isalnum() or c in "._-/:@" for c in text)


def _words(argv, i):
    """The options the word argv[i] gives, as [(option, value or None)], and
    the index of the next word.  Besides --opt VALUE and --opt=VALUE, docker's
    clusters of short options: -it, -ti, -itv SRC:DST, -w/tmp."""
    a = argv[i]
    name, eq, val = a.partition("=")
    if name in _FLAGS:
        if eq:
            _bad(f"option {name} takes no value", None, f"write {name} alone")
        return [(name, None)], i + 1
    if name in _OPTS:
        if eq:
            return [(name, val)], i + 1
        if i + 1 >= len(argv):
            _bad(f"option {name} needs a value", None, _OPT_HINT)
        return [(name, argv[i + 1])], i + 2
    if not a.startswith("--") and len(a) > 2:
        items = []
        for j in range(1, len(a)):
            opt = "-" + a[j]
            if opt in _SHORT_FLAG:
                items.append((opt, None))
            elif opt in _SHORT_VALUE:
                rest = a[j + 1:]
                if rest:
                    return items + [(opt, rest[1:] if rest[0] == "=" else rest)], i + 1
                if i + 1 >= len(argv):
                    _bad(f"option {opt} needs a value", None, _OPT_HINT)
                return items + [(opt, argv[i + 1])], i + 2
            else:
                break
        else:
            return items, i + 1
    from .suggest import unknown_option
    raise unknown_option(a, name, list(_OPTS) + list(_FLAGS), _OPT_HINT)


def _flag(spec, attr):
    if attr == "writable_tmpfs":
        spec.rootfs_mode = "tmpfs-overlay"
    elif attr == "rw":
        spec.rootfs_mode = "rw"
    elif attr == "no_mount_home":
        spec.mount_home = False
    elif attr is not None:
        setattr(spec, attr, True)


def _option(spec, name, val):
    attr = _OPTS[name]
    if attr == "bind":
        from .mountopt import parse_bind      # only with -v: off a plain launch's path
        spec.binds.append(parse_bind(val))
    elif attr == "mount":
        from .mountopt import parse_mount
        spec.binds.append(parse_mount(val))
    elif attr == "gpus":
        from .gpu.request import normalise
        spec.gpus, note = normalise(val)
        if note:
            spec.notes.append(note)
    elif attr == "env":
        spec.env_set.append(parse_env_item(val))
    elif attr == "device":
        if is_cdi_name(val):
            spec.cdi_devices.append(val)
        else:
            spec.devices.append(parse_device(val))
    elif attr == "env_file":
        spec.env_files.append(val)
    elif attr == "user":
        spec.user = parse_user(val)
    elif name in CHOICES:
        allowed = CHOICES[name]
        if val not in allowed:
            _bad(f"invalid {name} {val!r}", None,
                 f"use {', '.join(allowed[:-1])} or {allowed[-1]}")
        setattr(spec, attr, val)
    elif attr == "profile":
        from .profile import parse
        spec.profile = parse(val)
    elif attr == "name":
        from .live.record import check_name
        spec.name = check_name(val)
    else:
        setattr(spec, attr, val)


def parse_run_args(argv):
    spec = RunSpec()
    i, n = 0, len(argv)
    while i < n:
        a = argv[i]
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        if a in ("-h", "--help"):
            return None
        items, i = _words(argv, i)
        for name, val in items:
            if val is None:
                _flag(spec, _FLAGS[name])
            else:
                _option(spec, name, val)
    if i >= n:
        _bad("missing IMAGE", None, f"usage: {RUN_USAGE} ('gpusandbox run --help': the options)")
    spec.image = argv[i]
    spec.image_ref = is_image_ref(spec.image)
    rest = argv[i + 1:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    # A squashfs file may carry its image config (the command among it).
    if not rest and not spec.image_ref and not names_squashfs(spec.image):
        _bad("missing command", None,
             "a directory image needs one: gpusandbox run [options] IMAGE_DIR [--] CMD [ARG...]")
    spec.argv = rest
    if spec.workdir is not None and not spec.workdir.startswith("/"):
        _bad(f"invalid --workdir {spec.workdir!r}", "it must be an absolute path in the image",
             "example: -w /work")
    if spec.hostname is not None and (not spec.hostname or len(spec.hostname) > 64
                                      or "/" in spec.hostname or "\0" in spec.hostname):
        _bad(f"invalid --hostname {spec.hostname!r}", "1 to 64 characters without '/'", None)
    return spec


def report(err, out=None):
    out = out or sys.stderr
    out.write(message(err))
    out.flush()


def run_and_exit(argv):
    """The whole `gpusandbox run` command: the entry script calls it directly
    (the dispatcher in __main__ is one module the hot path does not need),
    `python -m gpusandbox run` through __main__.  Leaves through os._exit:
    everything the launcher owns is already released, so interpreter
    finalisation (a few ms of module teardown on every launch) is skipped.
    The cyclic garbage collector is off until the sandbox is cloned
    (stages/parent.launch turns it back on): the imports and the plan
    allocate in bulk and leave no cycles worth the nine or so collections
    they would trigger (about 1 ms of a launch)."""
    import gc
    gc.disable()
    from .errors import catch_signals
    catch_signals()
    code = main_run(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _site(spec):
    """The site's and user's configuration (docs/config.md), its warnings
    printed; a registry or store image checked against the site's policy.
    Nothing to read when nothing is configured (settingswhere.configured):
    every key keeps its default and there is no site hook."""
    from . import settingswhere
    if not settingswhere.configured():
        return
    from . import siterun, sitehooks
    warnings = siterun.apply(spec)
    sitehooks.hooks(warnings.append)
    for w in warnings:
        sys.stderr.write(f"gpusandbox: warning: {w}\n")
    if spec.image_ref and not looks_local(spec.image) and siterun.has_image_policy():
        from .image import parse_ref
        siterun.check_image(parse_ref(spec.image).canonical())


def looks_local(image):
    return image.startswith(("oci:", "oci-archive:", "docker-archive:"))


def _slurm_record(spec):
    """A Slurm task's sandbox is recorded (slurm-JOB.STEP.RANK) for `exec
    --job`; where no record can be kept the launch goes on without one."""
    from .live.launch import Live
    from .live.record import slurm_task
    task = slurm_task(os.environ)
    if task is None:
        return
    try:
        spec.live = Live(spec, task)
    except SandboxError:
        spec.live = None


def _live_launch(spec):
    """run --name/--detach: the record claimed first, then (-d) the detach."""
    from .live.launch import Live, detach
    from .live.record import slurm_task
    from .stages.parent import launch
    if spec.detach and spec.tty:
        _bad("-t and -d together", "a detached sandbox has no terminal",
             "drop -t, and use 'gpusandbox exec -t NAME sh' for a shell in it")
    if spec.live is None:
        spec.live = Live(spec, slurm_task(os.environ))
    if spec.detach:
        detach(spec.live)
    status = launch(spec)
    spec.live.ended(status)
    return status


def main_run(argv):
    spec = None
    try:
        spec = parse_run_args(argv)
        if spec is None:
            sys.stdout.write(RUN_HELP)
            return 0
        if os.environ.get("GPUSANDBOX_TEST_PAUSE"):
            from .testhook import pause_hook_enabled
            if pause_hook_enabled():
                spec.pause_at = os.environ["GPUSANDBOX_TEST_PAUSE"]
        _site(spec)
        if spec.image_ref:
            from .image.storeread import prepare
            if not prepare(spec):       # not in the store: the pull on a miss
                from .image.runimage import prepare
                prepare(spec)
        elif (spec.entrypoint is not None or spec.platform is not None) and \
                not names_squashfs(spec.image):
            _bad("--entrypoint and --platform apply to image references", None,
                 "IMAGE_DIR is a directory: give the command after it")
        if spec.name or spec.detach:
            return _live_launch(spec)
        if os.environ.get("SLURM_STEP_ID") is not None:
            _slurm_record(spec)
            if spec.live is not None:
                return _live_launch(spec)
        from .stages.parent import launch
        return launch(spec)
    except SandboxError as e:
        if spec is not None and spec.live is not None:
            spec.live.failed(e)
        report(e)
        return e.code
    except KeyboardInterrupt as e:
        # SIGINT/SIGTERM before the launch forwards them (while an image is
        # pulled, say): the clean-ups ran as the exception unwound.
        from .errors import RESUME_HINT, interrupted, quiet_signals
        quiet_signals()
        err = interrupted(e, "run", RESUME_HINT if spec is not None and spec.image_ref
                          else None)
        if spec is not None and spec.live is not None:
            spec.live.failed(err)
        report(err)
        return err.code
    except OSError as e:
        # Last resort: an OSError that escaped a stage still gets one line.
        from .errors import os_error
        err = os_error("run", e)
        err.code = EXIT_LAUNCHER
        if spec is not None and spec.live is not None:
            spec.live.failed(err)
        report(err)
        return EXIT_LAUNCHER
