"""`gpusandbox hook prestart|createRuntime|createContainer` and `hook install`.

The OCI hook in the role of nvidia-container-runtime-hook: the runtime
hands the container's state on stdin; the bundle's config.json says which
GPUs (NVIDIA_VISIBLE_DEVICES in process.env, `run`'s selection semantics,
or CDI names: `cdi.k8s.io/*` annotations and qualified names in
NVIDIA_VISIBLE_DEVICES, resolved as the wrapper resolves them);
the same ContainerEdits `run` builds are applied to the live container:
device nodes, driver files, links and the loader cache.

The hook runs as root on the host with the container's root in reach: the
CVE-2024-0132 class.  So every host source is opened and cloned (open_tree)
before anything of the container is touched, the container's mount
namespace is entered with setns (the pid from the state), the root is held
as a directory fd and every target inside it is reached with openat2
RESOLVE_IN_ROOT or RESOLVE_BENEATH|NO_SYMLINKS (linux.mounts), and mounts
are attached to those fds: a link swapped during injection can only make
the hook fail, never mount or write outside the root.  The edits become
the plan's mount ops (edits.from_edits) and the init's own executor
(stages/mountexec.py) applies them: one code path with `run`.

Nothing of the container's environment reaches the hook (CVE-2025-23266):
`hook install` registers `python3 -I` with an explicit env, and main()
re-executes itself with a clean one before importing anything else when it
finds loader or Python variables.

A prestart/createRuntime hook cannot grant device access: the runtime has
applied the container's cgroup device rules (cgroup v1 devices, v2 BPF)
before hooks run.  The nodes are there; opening them needs the rules the
wrapper or the filter writes into config.json (docs/hook.md).
"""
import os
import sys

from gpusandbox import settings
from gpusandbox.linux.host import close_ns, join_ns, open_ns, real_root

STAGES = ("prestart", "createRuntime", "createContainer")
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_KEEP = settings.ENV_VARS + ("GPUSANDBOX_CDI_SPEC_DIRS",)
_DANGEROUS = ("LD_", "PYTHON", "GCONV_PATH", "LOCPATH", "MALLOC_", "GLIBC_TUNABLES",
              "NLSPATH", "HOSTALIASES", "RES_OPTIONS", "TMPDIR")
_REEXEC = "GPUSANDBOX_HOOK_CLEAN"
MAX_STATE = 1 << 20


def clean_env(environ):
    """The hook's environment: PATH fixed, the gpusandbox root variables
    kept, nothing else."""
    env = {"PATH": SAFE_PATH}
    env.update({k: environ[k] for k in _KEEP if k in environ})
    return env


def sanitize(argv):
    """Re-execute as `python3 -I -m gpusandbox.oci.hook` with clean_env()
    when the environment holds anything beyond it, or Python did not start
    isolated.  Called before any import that loads libraries."""
    extra = [k for k in os.environ if k not in _KEEP and k != "PATH" and k != _REEXEC]
    bad = [k for k in extra if k.startswith(_DANGEROUS)]
    if os.environ.get(_REEXEC) == "1":
        if bad:
            raise SystemExit("gpusandbox: error: hook: the clean environment still holds "
                             + ", ".join(bad))
        return
    if not extra and sys.flags.isolated:
        os.chdir("/")
        return
    env = clean_env(os.environ)
    env[_REEXEC] = "1"
    os.chdir("/")
    os.execve(sys.executable, [sys.executable, "-I", "-m", "gpusandbox.oci.hook"] + argv, env)


def _read_state():
    import json
    from gpusandbox.errors import UsageError
    data = sys.stdin.buffer.read(MAX_STATE + 1)
    try:
        state = json.loads(data)
    except ValueError as e:
        raise UsageError("hook: OCI state on stdin", f"not valid JSON: {e}") from None
    if not isinstance(state, dict) or not isinstance(state.get("bundle"), str) \
            or not state["bundle"].startswith("/"):
        raise UsageError("hook: OCI state on stdin", "no absolute bundle path")
    return state


def _load_config(bundle_fd):
    from gpusandbox.oci import configedit
    fd = os.open("config.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=bundle_fd)
    with os.fdopen(fd, "rb") as f:
        return configedit.load(f.read(configedit.MAX_CONFIG + 1))


def _root_path(cfg, bundle):
    from gpusandbox.errors import UsageError
    root = cfg.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise UsageError("hook: config.json", "no root.path")
    return os.path.normpath(os.path.join(bundle, path))


def _enter(pid):
    """setns into the container's mount namespace (and its user namespace
    first when it has its own)."""
    fds = open_ns(pid, ("user", "mount"))
    try:
        join_ns(fds)
    finally:
        close_ns(fds)


def run(stage):
    from gpusandbox.edits import ContainerEdits
    from gpusandbox.errors import GpuError
    from gpusandbox.gpu import inject
    from gpusandbox.oci import configedit
    from gpusandbox.edits import from_edits
    from gpusandbox.stages import mountexec
    state = _read_state()
    bundle = state["bundle"]
    bfd = os.open(bundle, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        cfg = _load_config(bfd)
    finally:
        os.close(bfd)
    req = configedit.from_config(cfg)
    if req.empty():
        return 0
    sel = None
    if req.devices is not None:
        host = configedit.discover_host(os.environ)
        sel = configedit.selection(req, host)
    if sel is None and not req.cdi:
        return 0
    root = _root_path(cfg, bundle)
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        # CDI names (cdi.k8s.io/* annotations, qualified names in
        # NVIDIA_VISIBLE_DEVICES) through the consumer the wrapper uses; the
        # device rules it returns are the runtime's to apply, too late here.
        edits = ContainerEdits()
        if req.cdi:
            edits.extend(configedit.resolve_cdi(list(req.cdi), rootfd, os.environ)[0])
        if sel is not None:
            edits.extend(inject.build_edits(host, sel, rootfd))
    finally:
        os.close(rootfd)
    # The container's root is its own: the edits' mount points are made in it
    # (as runc makes its mounts'), the driver at the image's own paths.
    ops = from_edits(edits)
    if stage == "createContainer":
        # Run by the runtime inside the container's namespaces already.
        fds = mountexec.open_sources(ops)
    else:
        pid = state.get("pid")
        if not isinstance(pid, int) or pid <= 0:
            raise GpuError("hook: OCI state", f"no container pid for the {stage} stage")
        if real_root():
            fds = mountexec.open_sources(ops)
            _enter(pid)
        else:
            # Rootless runc: cloning a mount needs privilege over the mount
            # namespace, which the caller has only in the container's (its
            # own user namespace).  Before the runtime's pivot_root that
            # namespace still shows the host's tree outside the root, and
            # only the runtime has run in it.
            _enter(pid)
            fds = mountexec.open_sources(ops)
    # In the container's namespace the root is the same path (runtimes bind
    # it onto itself before pivot_root, and hooks run before the pivot); it
    # is opened again there, and held.
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        mountexec.apply(ops, rootfd, fds)
    finally:
        os.close(rootfd)
    return 0


# hook install's options and their defaults.
INSTALL_OPTIONS = {"--dir": "/etc/containers/oci/hooks.d", "--stage": "createRuntime",
                   "--driver-root": None, "--dev-root": None}


def install(argv):
    """`hook install [--dir DIR] [--stage createRuntime|prestart|precreate]
    [--driver-root DIR] [--dev-root DIR]`: an oci-hooks 1.0.0 JSON for
    podman's hooks.d.  --stage precreate registers the config filter
    (`oci-filter`) instead of the hook."""
    import json
    from gpusandbox.errors import UsageError
    from gpusandbox.oci.options import parse_options
    opts = dict(INSTALL_OPTIONS)
    if parse_options(argv, opts, "hook install", "options: " + ", ".join(opts),
                     usage=HELP) is None:
        return 0
    stage = opts["--stage"]
    if stage not in STAGES + ("precreate",):
        raise UsageError(f"hook install --stage {stage}", "unknown stage",
                         hint="use createRuntime, prestart, createContainer or precreate")
    env = {"PATH": SAFE_PATH}
    for key in ("driver-root", "dev-root"):
        if opts["--" + key]:
            env[settings.KEYS[key].env] = os.path.abspath(opts["--" + key])
    py = sys.executable
    if stage == "precreate":
        from gpusandbox.oci.filter import entry_args
        args = entry_args(py)
    else:
        args = [py, "-I", "-m", "gpusandbox.oci.hook", stage]
    doc = {"version": "1.0.0",
           "hook": {"path": py, "args": args, "env": [f"{k}={v}" for k, v in env.items()],
                    "timeout": 30},
           "when": {"always": True},
           "stages": [stage]}
    name = "gpusandbox-filter.json" if stage == "precreate" else "gpusandbox-hook.json"
    os.makedirs(opts["--dir"], mode=0o755, exist_ok=True)
    path = os.path.join(opts["--dir"], name)
    tmp = path + f".tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.rename(tmp, path)
    sys.stderr.write(f"gpusandbox: wrote {path}\n")
    return 0


USAGE = """usage: gpusandbox hook prestart|createRuntime|createContainer  (OCI state on stdin)
       gpusandbox hook install [--dir DIR] [--stage STAGE] [--driver-root DIR] [--dev-root DIR]
"""
HELP = USAGE + """
The OCI hook: at STAGE, with the container's state on stdin, inject the GPUs its
NVIDIA_VISIBLE_DEVICES names into a runc, crun or podman container.  `hook install`
writes podman's hooks.d entry for it (--stage precreate: the oci-filter entry instead).
See docs/hook.md.

  --dir DIR          where to write the entry (default /etc/containers/oci/hooks.d)
  --stage STAGE      createRuntime (default), prestart, createContainer or precreate
  --driver-root DIR  the driver root the hook uses (default: the driver-root setting)
  --dev-root DIR     where its device nodes live
"""


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(HELP if argv else USAGE)
        return 0 if argv else 125
    if argv[0] == "install":
        return install(argv[1:])
    if argv[0] not in STAGES:
        from gpusandbox.errors import UsageError
        raise UsageError(f"hook {argv[0]}", "unknown stage",
                         hint="use prestart, createRuntime, createContainer or install")
    sanitize(argv)
    from gpusandbox.errors import SandboxError
    try:
        return run(argv[0])
    except OSError as e:
        raise SandboxError(f"hook {argv[0]}", str(e)) from None


if __name__ == "__main__":
    from gpusandbox.errors import exit_main
    exit_main(main, sys.argv[1:], "hook")
