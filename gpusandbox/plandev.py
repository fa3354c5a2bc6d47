"""The plan's devices: GPU discovery, selection and injection and CDI
devices (only when a launch's GpuRequest asks), plain --device nodes, and
the fabric (RDMA adapters, GPUDirect, NVSwitch and IMEX nodes:
gpusandbox/fabric), after the GPUs are chosen, so that `auto` can give the
task the HCAs nearest its own GPUs.  Part of the planner (plan.py): pure
data, no syscalls beyond the stat and read calls discovery makes.

A launch with no --fabric and none of the caller's fabric variables, on a
host that lists no fabric adapter (has_adapters), imports nothing of
gpusandbox.fabric: the variables and the adapters' sysfs classes it reads
are gpusandbox.gpu's (FABRIC_CALLER_VARS, FABRIC_NIC_CLASSES), which every
GPU launch loads anyway."""
import os
import stat

from .errors import UsageError


def _gpu(plan, spec, rootfd, req_env, host_env):
    """GPU discovery, selection and injection, and CDI devices, only when
    this launch asks: its GpuRequest (gpu/request.py) is the door's own
    (spec.gpu_request: a config.json's, for `gpusandbox-oci create`), else
    parsed here from the options and the caller's environment (host_env).

    Selection, discovery and injection read only the request and the
    caller's environment.  req_env (the image's rows overridden by
    --env-file and -e, as the environment table has them) feeds only the
    requirement check, which can restrict or skip the image's own check but
    never chooses a host path."""
    req = spec.gpu_request
    if req is None:
        if spec.gpus is None and not spec.cdi_devices \
                and not host_env.get("NVIDIA_VISIBLE_DEVICES") and not host_env.get("SLURM_JOB_ID"):
            return {}  # the plain launch: no GPU module is even imported
        from .gpu.request import from_caller
        req = from_caller(spec.gpus, spec.gpu_caps, spec.cdi_devices, host_env)
    env = _inject(plan, spec, rootfd, req, req_env, host_env) if req.devices is not None else {}
    return {**env, **_cdi(plan, req.cdi, rootfd, host_env)}


def _inject(plan, spec, rootfd, req, req_env, host_env):
    from .gpu import discover, inject, select
    roots = driver_roots(spec, host_env)
    host = discover.discover(*roots, environ=host_env)
    sel = select.for_request(req, host, host_env)
    if sel is None:
        return {}
    plan.gpu = sel
    if spec.gpu_visibility == "step":
        from .hpc import gpuvis
        sel = gpuvis.widen(sel, host, host_env, plan.notes)
    from .gpu import disabled, requirements
    # The host's own driver in the host's own root is used as the host's
    # loader finds it: no cache is written, so no compat choice either.
    decision = None if plan.host_root and _same_root(roots[0]) else \
        _compat(spec.cuda_compat, rootfd, host, sel, plan.notes)
    # The requirement check (gpu/require.py) only when the image asks for
    # something or the check is turned off (its warning says so).
    skip = spec.no_require or disabled(req_env) or disabled(host_env)
    reqs = None if skip else requirements(req_env, rootfd)
    if skip or reqs:
        from .gpu import require
        warn = require.check(req_env, rootfd, host, None, host_env, gpus=sel.node_gpus(),
                             no_require=spec.no_require, compat=decision, reqs=reqs)
        if warn:
            plan.warnings.append(warn)
    edits = inject.build_edits(host, sel, rootfd, host_env,
                               private=plan.keep_image,
                               notes=plan.notes, compat=decision,
                               in_place=plan.host_root and _same_root(roots[0]))
    if spec.gpu_memory is not None or spec.gpu_compute is not None:
        from .gpu import share
        share.apply(plan, spec, host, sel, edits, host_env)
    missing = inject.warning(inject.plan(host, sel))
    if missing:
        plan.warnings.append(missing)
    order = gpuvis.cuda_order(sel) if spec.gpu_visibility == "step" else None
    if order:
        edits.env["CUDA_VISIBLE_DEVICES"] = order
    plan.edits.extend(edits)
    plan.device_rules = inject.device_rules(host, sel)
    return edits.env


def _compat(mode, rootfd, host, sel, notes):
    """gpu.compat.for_launch, which is loaded only for an image that has a
    forward-compatibility directory (or --cuda-compat off/force)."""
    from .gpu import compat_absent, compat_noted
    from .gpu.discover import effective_caps
    if "compute" in effective_caps(sel.caps):
        absent = compat_absent(mode, rootfd)
        if absent is not None:
            return compat_noted(absent, notes)
    from .gpu import compat
    return compat.for_launch(mode, rootfd, host, sel, notes)


def _same_root(driver_root):
    try:
        return os.path.samefile(driver_root or "/", "/")
    except OSError:
        return False


def driver_roots(spec, host_env):
    """(driver root, dev root): the options, else the settings every entry
    reads (gpusandbox/settings.py: GPUSANDBOX_DRIVER_ROOT/GPUSANDBOX_DEV_ROOT,
    then the settings files).  --driver-root wins over both: a dev root
    from the settings belongs with their driver root, not with another one
    given on the command line.  Nothing configured (settingswhere): the
    default root, without loading the settings."""
    if spec.driver_root:            # the options win (settings.driver_roots' first rule)
        return spec.driver_root, spec.dev_root
    from . import settingswhere
    if not settingswhere.configured(None if host_env is os.environ else host_env):
        return settingswhere.DRIVER_ROOT, spec.dev_root
    from . import settings
    return settings.driver_roots(host_env, None, spec.dev_root)


def _cdi(plan, names, rootfd, host_env):
    """The request's CDI devices (--device VENDOR/CLASS=NAME, a config's
    cdi.k8s.io annotations, CDI names in NVIDIA_VISIBLE_DEVICES): CDI specs'
    edits (oci/cdi), imported only when one is named.  Nodes come through the
    device filter by number, as --device's do; a node GPU injection already
    gave is not added twice."""
    if not names:
        return {}
    from .oci.cdi.apply import resolve
    res = resolve(list(names), rootfd=rootfd, environ=host_env)
    have = {(n.path, n.major, n.minor) for n in plan.edits.device_nodes}
    res.edits.device_nodes = [n for n in res.edits.device_nodes
                              if (n.path, n.major, n.minor) not in have]
    plan.edits.extend(res.edits)
    plan.device_rules = list(plan.device_rules or []) + res.rules
    plan.warnings += res.warnings
    return res.edits.env


def _devices(plan, spec):
    """--device: host character devices added as edits, by number.

    The node is checked here and again, by its opened inode, in the init (a
    node swapped in between is refused).  Block devices are not offered: a
    GPU job has no use for raw disks, and the filter denies them all."""
    from .edits import DeviceNode
    if not spec.devices:
        return
    rules = list(plan.device_rules or [])
    for host, dst in spec.devices:
        try:
            st = os.stat(host)
        except OSError as e:
            raise UsageError(f"--device {host}", e.strerror,
                             "name an existing character device such as /dev/infiniband/uverbs0") from None
        if not stat.S_ISCHR(st.st_mode):
            raise UsageError(f"--device {host}", "not a character device",
                             "only character devices can be added (block devices never are)")
        major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
        plan.edits.device_nodes.append(DeviceNode(dst, host, major, minor))
        rules.append(("c", major, minor, "rw"))
    plan.device_rules = rules


# --- the fabric ------------------------------------------------------------


def has_adapters(driver_root, dev_root=None):
    """Whether the host (or the simulated host a driver root holds) lists
    any fabric adapter (an RDMA HCA, a Slingshot NIC) in the sysfs classes
    of FABRIC_NIC_CLASSES, in the sysfs fabric.discover.roots reads: a listdir
    each, before anything of gpusandbox.fabric is imported."""
    from .gpu import FABRIC_NIC_CLASSES
    from .gpu.discover import proc_root
    proc = proc_root(driver_root)
    sys_root = "/sys" if proc == "/" else os.path.join(proc, "sys")
    for cls in FABRIC_NIC_CLASSES:
        try:
            if os.listdir(os.path.join(sys_root, cls)):
                return True
        except OSError:
            continue
    return False


def caller_env(host_env, user_rows):
    """The caller's word: its environment, overridden by its -e and
    --env-file rows.  The image's rows are not in it: an image cannot widen
    what the caller allowed."""
    env = dict(host_env)
    env.update(user_rows)
    return env


def fabric(plan, spec, user_rows, host_env):
    """Add the fabric's nodes, rules and variables to the plan; return the
    variables (NCCL_IB_HCA, UCX_NET_DEVICES) for the environment table's GPU
    row, which the caller's -e rows still override.

    An OCI config's process.env is its caller's word (the engine wrote it,
    as the toolkit reads it), so for that door it counts as the caller's."""
    if spec.oci is not None and spec.image_env is not None:
        user_rows = list(spec.image_env[0]) + list(user_rows)
    gpus = plan.gpu.node_gpus() if plan.gpu is not None else []
    libs = spec.fabric_libs == "host"
    mpi = spec.mpi == "host"
    if libs or mpi:
        env = caller_env(host_env, user_rows)
        if plan.host_root:
            plan.notes.append("fabric: the host's own root already has the host's libraries: "
                              "--fabric-libs/--mpi host add nothing")
        elif spec.rootfs_mode == "rw":
            # The loader cache and the providers' paths would be created in
            # the image itself: --rw never gets host libraries written into it.
            from .errors import UsageError
            raise UsageError("--fabric-libs/--mpi host with --rw",
                             "the host's libraries go over the image's loader cache and "
                             "library directories, which --rw would change on disk",
                             "drop --rw (the default overlay leaves the image untouched)")
        else:
            from .fabric import userspace
            userspace.plan_userspace(plan, plan.rootfd, libs, mpi, env)
    from .gpu import FABRIC_CALLER_VARS as asking
    asked = spec.fabric is not None or any(v in host_env for v in asking) or \
        any(k in asking for k, _ in user_rows)
    if not asked and (plan.gpu is None or not has_adapters(*driver_roots(spec, host_env))):
        # The default request (`auto` for the GPUs, nothing else) on a host
        # without a fabric adapter gives nothing: no node, rule, /sys view,
        # note or variable.
        return {}
    from .fabric import discover, inject, select
    env = caller_env(host_env, user_rows)
    req = select.from_caller(spec.fabric, env, bool(gpus))
    if not req and not gpus:
        return {}       # (with GPUs, `none` still hides the host's HCAs from /sys)
    host = discover.discover(*driver_roots(spec, host_env))
    res = inject.build(req, host, gpus, env)
    plan.edits.extend(res.edits)
    plan.device_rules = list(plan.device_rules or []) + res.rules
    plan.warnings += res.warnings
    plan.notes += res.notes
    return res.edits.env
