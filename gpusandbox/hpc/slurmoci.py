"""`gpusandbox slurm-oci`: gpusandbox as the runtime of Slurm 22.05's oci.conf.

    RunTimeRun="gpusandbox slurm-oci run [RUN OPTIONS] %b"
    RunTimeQuery="gpusandbox slurm-oci state %b"
    RunTimeKill="gpusandbox slurm-oci kill %b"
    RunTimeDelete="gpusandbox slurm-oci delete %b"

For `srun --container=DIR`, slurmstepd (22.05, src/slurmd/slurmstepd/container.c)
reads DIR/config.json, writes a copy into a per-step directory (%b) with root.path
set to DIR/rootfs (absolute), process.args set to the task's command and the task's
environment appended to process.env, and then runs RunTimeRun through /bin/sh -c
as the job's user -- in slurmstepd's own environment, not the task's.  So `run`
takes from %b/config.json the command and the task's environment (SLURM_*, PMIX_*,
the GPU allocation that `--gpus auto` resolves) and runs `gpusandbox run [RUN
OPTIONS] DIR -- ARGS` with it: DIR is the user's own bundle, so its config.json's
env and cwd apply exactly as for `gpusandbox run DIR`.

What slurmstepd adds per task after that copy never reaches the runtime: SLURM_PROCID,
SLURM_LOCALID, SLURM_NODEID, PMIX_RANK and the GPU variables (SLURM_STEP_GPUS,
CUDA_VISIBLE_DEVICES).  The runtime does run in the task's device cgroup, though, so
with `--gpus auto` and no GPU variable in the bundle, the GPUs are the ones that
cgroup lets this task open (ConstrainDevices=yes): exactly the task's allocation.
Without any denied device nothing tells which GPUs are the task's, and it gets none
(with a note).

A site may run RunTimeRun as root (a wrapper, a root job).  The bundle's
environment is then still the job's -- the user's own config.json and the
task's variables -- and must not steer the host side of a root launch: a
PMIX_SERVER_TMPDIR, CUDA_MPS_PIPE_DIRECTORY or GPUSANDBOX_CDI_SPEC_DIRS of
the user's choosing would otherwise bind or mount any host directory into a
root sandbox.  As real root, `run` therefore keeps the launcher's own
environment, hands the task's job variables (environ.JOB_PREFIXES) to the
command as data (`-e`, which nothing on the host side reads), and takes
`--gpus auto` from the task's device cgroup alone; PMIx directories the job
names are not bound (a note says so).  Run as the job's user, the bundle's
environment is the launcher's own and reaches the command as with
`--env-host`: every variable but PATH, HOME and environ.NEVER_PASS.

The sandbox lives exactly as long as the RunTimeRun process (a launcher never
outlives its sandbox), and slurmstepd asks for the state only after that process
ended: `state` therefore reports "stopped", `kill` has nothing to signal and
`delete` nothing to remove (slurmstepd removes %b itself; nothing may be left in it
or its rmdir fails).
"""
import json
import os
import stat
import sys

from ..errors import UsageError, printable

USAGE = ("usage: gpusandbox slurm-oci run [RUN OPTIONS] BUNDLE\n"
         "       gpusandbox slurm-oci state|kill|delete BUNDLE [ARG...]\n")
HELP = USAGE + """
The runtime of Slurm's oci.conf (srun --container): `run` starts the step's task in
the bundle slurmstepd wrote, as `gpusandbox run [RUN OPTIONS]` would (the options of
`gpusandbox run --help`; --gpus auto takes the task's GPUs); state, kill and delete
answer slurmstepd.  See docs/slurm-testbed.md.
"""
_MAX_CONFIG = 4 << 20
_MAX_ITEMS = 65536


def _bad(what, why, hint=None):
    return UsageError(what, why, hint or "pass the %b of oci.conf: the bundle slurmstepd wrote")


def read_step_config(bundle):
    """(image, args, env) from the step bundle slurmstepd wrote; every field is
    checked as data of the expected type."""
    path = os.path.join(bundle, "config.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise _bad(f"cannot read {printable(path)}", e.strerror) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _bad(f"cannot read {printable(path)}", "not a regular file")
        if st.st_size > _MAX_CONFIG:
            raise _bad(f"cannot read {printable(path)}", f"larger than {_MAX_CONFIG} bytes")
        data = os.read(fd, _MAX_CONFIG + 1)
    finally:
        os.close(fd)
    what = f"invalid step bundle {printable(bundle)}"
    try:
        conf = json.loads(data)
    except (ValueError, RecursionError):
        raise _bad(what, "config.json is not valid JSON") from None
    proc = conf.get("process") if isinstance(conf, dict) else None
    root = conf.get("root") if isinstance(conf, dict) else None
    if not isinstance(proc, dict) or not isinstance(root, dict):
        raise _bad(what, "config.json has no process and root objects")
    args, env, rootfs = proc.get("args"), proc.get("env", []), root.get("path")

    def strings(v, name):
        if not isinstance(v, list) or len(v) > _MAX_ITEMS or \
                not all(isinstance(x, str) and "\0" not in x for x in v):
            raise _bad(what, f"process.{name} is not a list of strings")
        return v
    args = strings(args, "args")
    if not args:
        raise _bad(what, "process.args is empty")
    env = strings(env, "env")
    if not isinstance(rootfs, str) or not rootfs.startswith("/") or "\0" in rootfs:
        raise _bad(what, "root.path is not an absolute path")
    # slurmstepd sets root.path to DIR/rootfs: hand gpusandbox DIR, the user's bundle,
    # when it is one; any other root is run as a plain root filesystem.
    rootfs = os.path.normpath(rootfs)
    parent = os.path.dirname(rootfs)
    image = parent if os.path.basename(rootfs) == "rootfs" and \
        os.path.isfile(os.path.join(parent, "config.json")) else rootfs
    return image, args, env


def _environment(items):
    """process.env as a dict, later entries winning (Slurm appends the task's)."""
    out = {}
    for item in items:
        key, eq, val = item.partition("=")
        if eq and key:
            out[key] = val
    return out


def _opt(opts, name):
    """The value of run option `name` in opts (`--name V` or `--name=V`), else None."""
    val = None
    for i, o in enumerate(opts):
        if o == name and i + 1 < len(opts):
            val = opts[i + 1]
        elif o.startswith(name + "="):
            val = o.split("=", 1)[1]
    return val


def _gpus_from_cgroup(opts, environ, trust_env=True):
    """opts with `--gpus auto` replaced by the GPUs this task's device cgroup allows,
    when the bundle brought no GPU variable (or, with trust_env False, whatever
    it brought); opts unchanged otherwise."""
    from .. import slurm
    if _opt(opts, "--gpus") != "auto" or \
            (trust_env and (slurm.in_gpu_step(environ) or "SLURM_STEP_ID" not in environ)):
        return opts
    from ..gpu import discover
    from .. import settings
    host = discover.discover(*settings.driver_roots(environ, _opt(opts, "--driver-root"),
                                                    _opt(opts, "--dev-root")))
    verdict = {g.index: slurm.probe_node(slurm._node_path(host, g)) for g in host.gpus}
    if False not in verdict.values():
        if verdict:
            sys.stderr.write("gpusandbox: note: slurm-oci: Slurm 22.05 gives an oci.conf runtime "
                             "no GPU variables and no device cgroup limits this task, so it "
                             "gets no GPU (set ConstrainDevices=yes in cgroup.conf)\n")
        sel = "none"
    else:
        sel = ",".join(str(i) for i, ok in sorted(verdict.items()) if ok) or "none"
    out = list(opts)
    for i, o in enumerate(out):
        if o == "--gpus" and i + 1 < len(out):
            out[i + 1] = sel
        elif o.startswith("--gpus="):
            out[i] = "--gpus=" + sel
    return out


def _as_root(opts, task):
    """Run options for a root launcher: the task's job variables as `-e`
    data, the GPUs from the device cgroup; the launcher's environment stays
    its own (see the module's docstring)."""
    from ..environ import JOB_PREFIXES
    opts = _gpus_from_cgroup(opts, task, trust_env=False)
    named = [k for k in ("PMIX_SERVER_TMPDIR", "PMIX_SYSTEM_TMPDIR") if task.get(k)]
    if named:
        sys.stderr.write(f"gpusandbox: note: slurm-oci as root: {', '.join(named)} of the "
                         "job's environment not bound (a root launch binds no directory a "
                         "job names)\n")
    data = [a for k, v in task.items() if k.startswith(JOB_PREFIXES) and "\0" not in k + v
            for a in ("-e", f"{k}={v}")]
    return [*opts, *data]


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(HELP if argv else USAGE)
        return 0 if argv else 125
    op, rest = argv[0], argv[1:]
    if op == "run":
        if not rest:
            raise UsageError("slurm-oci run: no BUNDLE", None, USAGE.splitlines()[0])
        opts, bundle = rest[:-1], rest[-1]
        image, args, env = read_step_config(bundle)
        task = _environment(env)
        from ..linux.host import real_root
        if real_root():
            opts = _as_root(opts, task)
        else:
            node = os.environ.get("SLURMD_NODENAME")
            os.environ.clear()
            os.environ.update(task)
            if node:
                # slurmstepd's own variable, the one per-task fact its environment has.
                os.environ["SLURMD_NODENAME"] = node
            # The bundle's process.env is the workload's environment (as a
            # runtime runs a bundle's process): passed to the command as
            # --env-host passes the caller's own, PATH and HOME as `run` sets
            # them and never what environ.NEVER_PASS names.
            opts = ["--env-host", *_gpus_from_cgroup(opts, os.environ)]
        from .. import sitehooks
        sitehooks.DOOR.append("slurm-oci")     # the door the site hooks are told
        from ..cli import main_run
        code = main_run([*opts, image, "--", *args])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if op in ("state", "kill", "delete"):
        if not rest:
            raise UsageError(f"slurm-oci {op}: no BUNDLE", None, USAGE.splitlines()[1])
        if op == "state":
            bundle = os.path.abspath(rest[0])
            json.dump({"ociVersion": "1.0.2", "id": os.path.basename(bundle.rstrip("/")),
                       "status": "stopped", "bundle": bundle}, sys.stdout)
            sys.stdout.write("\n")
        return 0
    raise UsageError(f"slurm-oci: unknown operation {printable(op)}", None,
                     "one of run, state, kill, delete")
