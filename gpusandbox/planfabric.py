"""The plan's fabric: RDMA adapters, GPUDirect, NVSwitch and IMEX nodes
(gpusandbox/fabric), after the GPUs are chosen, so that `auto` can give the
task the HCAs nearest its own GPUs.  Part of the planner: pure data, no
syscalls beyond the stat and read calls discovery makes.

A launch with no GPU, no --fabric and none of the caller's fabric variables
imports nothing of gpusandbox.fabric but its package (CALLER_VARS); one
whose host has no fabric adapter and whose caller asks for no fabric device
imports no more (has_adapters)."""
import os

from .fabric import CALLER_VARS, NIC_CLASSES
from .plandev import driver_roots


def has_adapters(driver_root, dev_root=None):
    """Whether the host (or the simulated host a driver root holds) lists
    any fabric adapter (an RDMA HCA, a Slingshot NIC) in the sysfs classes
    of NIC_CLASSES, in the sysfs fabric.discover.roots reads: a listdir
    each, before anything of gpusandbox.fabric but its package is imported."""
    from .gpu.discover import proc_root
    proc = proc_root(driver_root)
    sys_root = "/sys" if proc == "/" else os.path.join(proc, "sys")
    for cls in NIC_CLASSES:
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
    asked = spec.fabric is not None or any(v in host_env for v in CALLER_VARS) or \
        any(k in CALLER_VARS for k, _ in user_rows)
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
