"""An OCI config as the planner's typed input (OciRequest, RunSpec.oci) and
the plan fields it decides, computed once by plan.build (gpusandbox/plan.py):
the identity (namespaces, ids, id map, capabilities), the config's devices
and the seccomp program.  oci/config.py reads config.json into an
OciRequest; nothing changes a plan after plan.build returns it."""
import os
import stat

from ..linux.host import NS_FLAGS, gid_mapped, setgroups_denied


class OciRequest:
    """config.json read as data of the expected types: what the planner
    needs beyond the RunSpec's common fields."""
    __slots__ = (
        # clone flags of the new namespaces; [(type, path)] joined by `create`
        "flags", "join",
        # the process object (configprocess.Process); (uid rows, gid rows)
        # of a user namespace, else None
        "process", "idmaps",
        # linux.seccomp, parsed (None: no filter)
        "seccomp",
        # linux.resources.devices allowed: [("c", major, minor, access)]
        "dev_rules",
        # linux.devices: ([(path, host node, major, minor)] to bind,
        # [(path, S_IF type, major, minor, mode, uid, gid)] to make)
        "devices",
        # descriptors passed on (--preserve-fds, LISTEN_FDS)
        "keep_fds",
        # the only variables GPU selection reads (NVIDIA_VISIBLE_DEVICES)
        "plan_env",
        # the config's mounts as ops (oci/configmount.py), in its order
        "mounts",
        # linux.maskedPaths, linux.readonlyPaths
        "masked", "readonly",
        # [(key, value)] of linux.sysctl; the domain name, or None
        "sysctl", "domainname",
        # (MS_* flag, recursive) of linux.rootfsPropagation, or None
        "rootfs_propagation",
        # the hooks object; the OCI state createContainer/startContainer
        # hooks get (None: no such hook)
        "hooks", "hook_state",
        # what the stages do beyond a RunSpec (OciExtras: plan.oci)
        "extras")


def process(plan, pr, keep_groups=False):
    """The command's plan fields from a process object (configprocess.Process):
    the container's (`create`, through identity) and one more process in it
    (`exec`) alike.  keep_groups: the process keeps the groups it has (a
    user namespace that denies setgroups(2), crun's keep_original_groups)."""
    plan.cmd_uid, plan.cmd_gid = pr.uid, pr.gid
    # (bounding, effective, permitted, inheritable, ambient), each its own
    (plan.cap_bounding, plan.cap_effective, plan.cap_permitted, plan.cap_inheritable,
     plan.cap_ambient) = pr.caps
    plan.no_new_privs = pr.nnp
    plan.umask = pr.umask
    plan.proc_settings = pr.settings
    # As runc and crun: the process's stdio is handed to its user.
    plan.stdio_owner = True
    if keep_groups:
        plan.clear_groups = False
        plan.groups = None
    else:
        plan.groups = pr.groups


def identity(plan, req):
    """The plan's namespaces, ids, id map and capabilities, from the config
    alone (plan._identity's counterpart for an OCI launch)."""
    x = req.extras
    real_root = os.geteuid() == 0
    plan.real_root = real_root
    plan.clone_flags = req.flags
    plan.idmap = None
    plan.devpts_gid = None
    if req.idmaps is None:
        # Real root without a user namespace: the host's ids.
        plan.userns = "host"
        plan.clear_groups = True
        plan.devpts_gid = 5
    else:
        uids, gids = req.idmaps
        joined = any(t == "user" for t, _ in req.join)
        if not real_root and not joined and len(uids) == len(gids) == 1 and uids[0][1:] == \
                (os.geteuid(), 1) and gids[0][1:] == (os.getegid(), 1):
            # The caller's own ids only: maps the init writes for itself, as
            # `run` does rootless (no newuidmap round trip).
            plan.idmap = ("single", uids[0][0], uids[0][1], gids[0][0], gids[0][1])
            plan.userns = "single"
            plan.clear_groups = False
        else:
            # A joined namespace's maps (config.py read them) are written
            # already: `create` leaves them; the init switches to its root.
            plan.idmap = ("full", uids, gids)
            plan.userns = "subids"
            plan.clear_groups = True
    # crun's annotation: the caller's groups stay.  The same namespace may
    # deny setgroups(2) (user_namespaces(7)): the process keeps the groups it
    # has there, which map to nothing more.
    process(plan, req.process, x.annotations.get("run.oci.keep_original_groups") == "1"
            or setgroups_denied())
    if plan.devpts_gid is not None and not gid_mapped(plan.devpts_gid):
        # Rootless podman whose user has no subordinate gids: the runtime is
        # root of a namespace mapping one gid, where devpts refuses gid=5.
        plan.devpts_gid = None
    plan.keep_fds = req.keep_fds
    # Applied by `create` to itself before the clone: the init inherits them.
    plan.rlimits, plan.oom_score_adj = req.process.rlimits, req.process.oom_score_adj
    plan.sysctl, plan.domainname = req.sysctl, req.domainname
    plan.rootfs_propagation = req.rootfs_propagation
    plan.hooks, plan.hook_state = req.hooks, req.hook_state


def devices(plan, req):
    """linux.devices and linux.resources.devices: nodes bound from the host
    (GPU-style edits) or made for the container, and the device filter's
    rules for them."""
    from ..edits import DeviceNode
    rules = list(req.dev_rules)
    binds, made = req.devices
    for path, host, major, minor in binds:
        plan.edits.device_nodes.append(DeviceNode(path, host, major, minor))
        rules.append(("c", major, minor, "rw"))
    for path, kind, major, minor, _, _, _ in made:
        if not stat.S_ISFIFO(kind):
            rules.append(("b" if stat.S_ISBLK(kind) else "c", major, minor, "rwm"))
    if rules:
        plan.device_rules = list(plan.device_rules or []) + rules


def paths(plan, req):
    """linux.maskedPaths (each tried as a file, then a directory) and
    linux.readonlyPaths, in place of runc's defaults."""
    plan.masked_files = plan.masked_dirs = req.masked
    plan.readonly_paths = req.readonly


def mounts(plan, req):
    """The config's mount ops, after the edits' and binds' (plan.mounts so
    far): its /sys where it lists it, unless something of the plan's goes
    under /sys (then /sys is mounted first, with the system mounts); its
    writable /run tmpfs as the options of the init's own /run
    (plan.run_tmpfs: mounted over ours, it would hide what GPU injection put
    under /run)."""
    from ..edits import run_tmpfs
    ops = list(req.mounts)
    if any(op.path.startswith("/sys/") for op in plan.mounts):
        ops = [op for op in ops if op.op != "sysfs"]
    plan.run_tmpfs = run_tmpfs(ops)
    return [op for op in ops if op is not plan.run_tmpfs]


def seccomp(doc, annotations=None):
    """The program of a config's linux.seccomp document (the container's, for
    `create` and `exec` alike), or None.  Unknown syscall names are left out
    (runc's and crun's rule: profiles name syscalls newer than a runtime
    knows) unless crun's annotation run.oci.seccomp_fail_unknown_syscall
    (not "0") asks for a refusal."""
    if not doc:
        return None
    from . import fastjson as json
    from ..linux import seccomp as sc
    strict = (annotations or {}).get("run.oci.seccomp_fail_unknown_syscall") not in (None, "0")
    # The parsed document (compile_bytes would dump and parse it again,
    # through the json package), its text only to find it in the cache.
    return sc.compile_document(doc, json.dumps(doc).encode(), "linux.seccomp",
                               skip_unknown=not strict)


def premake(plan, req):
    """linux.devices made for the container, after its mounts (a tmpfs there
    does not hide them): real root, a container with a user namespace of its
    own, made now (linux/devnodes.premake_devices) for the init to attach;
    else by the init's mknod.  Last in plan.build: the caller closes the
    premade nodes' descriptors with the plan (mountexec.held_fds)."""
    from ..edits import devices as device_ops
    made = req.devices[1]
    premade = None
    if made and (plan.clone_flags & NS_FLAGS["user"] or any(t == "user" for t, _ in req.join)):
        from ..errors import SandboxError
        from ..linux.devnodes import premake_devices
        try:
            premade = premake_devices(made, req.idmaps)
        except OSError as e:
            raise SandboxError("making the config's devices", e.strerror or str(e)) from None
    plan.mounts += device_ops(made, premade)
