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
        # process.user ids; (uid rows, gid rows) of a user namespace, else None
        "uid", "gid", "idmaps",
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
        # what the stages do beyond a RunSpec (OciExtras: plan.oci)
        "extras")


def identity(plan, req):
    """The plan's namespaces, ids, id map and capabilities, from the config
    alone (plan._identity's counterpart for an OCI launch)."""
    x = req.extras
    real_root = os.geteuid() == 0
    plan.real_root = real_root
    plan.clone_flags = req.flags
    # (bounding, effective, permitted, inheritable, ambient), each its own
    (plan.cap_bounding, plan.cap_effective, plan.cap_permitted, plan.cap_inheritable,
     plan.cap_ambient) = x.caps
    plan.no_new_privs = x.nnp
    plan.umask = x.umask
    plan.cmd_uid, plan.cmd_gid = req.uid, req.gid
    plan.idmap = None
    plan.devpts_gid = None
    if req.idmaps is None:
        # Real root without a user namespace: the host's ids.
        plan.userns = "host"
        plan.clear_groups = True
        plan.devpts_gid = 5
    else:
        uids, gids = req.idmaps
        if not real_root and len(uids) == len(gids) == 1 and uids[0][1:] == \
                (os.geteuid(), 1) and gids[0][1:] == (os.getegid(), 1):
            # The caller's own ids only: maps the init writes for itself, as
            # `run` does rootless (no newuidmap round trip).
            plan.idmap = ("single", uids[0][0], uids[0][1], gids[0][0], gids[0][1])
            plan.userns = "single"
            plan.clear_groups = False
        else:
            plan.idmap = ("full", uids, gids)
            plan.userns = "subids"
            plan.clear_groups = True
    if x.annotations.get("run.oci.keep_original_groups") == "1":
        plan.clear_groups = False
    if setgroups_denied():
        # The same namespace may deny setgroups(2) (user_namespaces(7)): the
        # process keeps the groups it has there, which map to nothing more.
        plan.clear_groups = False
        x.groups = None
    plan.groups = x.groups
    if plan.devpts_gid is not None and not gid_mapped(plan.devpts_gid):
        # Rootless podman whose user has no subordinate gids: the runtime is
        # root of a namespace mapping one gid, where devpts refuses gid=5.
        plan.devpts_gid = None
    plan.keep_fds = req.keep_fds


def devices(plan, req):
    """linux.devices and linux.resources.devices: nodes bound from the host
    or made by the init, and the device filter's rules for them; after the
    GPU edits, which decide whether /sys goes before the config's mounts."""
    from ..edits import DeviceNode
    x = req.extras
    rules = list(req.dev_rules)
    binds, x.mknod = req.devices
    for path, host, major, minor in binds:
        plan.edits.device_nodes.append(DeviceNode(path, host, major, minor))
        rules.append(("c", major, minor, "rw"))
    for path, kind, major, minor, _, _, _ in x.mknod:
        if not stat.S_ISFIFO(kind):
            rules.append(("b" if stat.S_ISBLK(kind) else "c", major, minor, "rwm"))
    if rules:
        plan.device_rules = list(plan.device_rules or []) + rules
    e = plan.edits
    if any(p.startswith("/sys/") for p in [mt.path for mt in e.mounts]
           + [n.path for n in e.device_nodes] + [t.path for t in e.tmpfs]):
        x.sys_at = None     # the GPU edits go under /sys: it is mounted before them


def paths(plan, req):
    """linux.maskedPaths (each tried as a file, then a directory) and
    linux.readonlyPaths, in place of runc's defaults."""
    x = req.extras
    plan.masked_files = plan.masked_dirs = x.masked
    plan.readonly_paths = x.readonly


def seccomp(req):
    """The config's seccomp program, or None."""
    if not req.seccomp:
        return None
    return seccomp_program(req.seccomp, req.extras.annotations)


def seccomp_program(doc, annotations):
    """An OCI config's linux.seccomp compiled (for `create` and `exec`).
    Unknown syscall names are left out (runc's and crun's rule: profiles
    name syscalls newer than a runtime knows) unless crun's annotation
    run.oci.seccomp_fail_unknown_syscall (not "0") asks for a refusal."""
    from . import fastjson as json
    from ..linux import seccomp as sc
    strict = (annotations or {}).get("run.oci.seccomp_fail_unknown_syscall") not in (None, "0")
    # The parsed document (compile_bytes would dump and parse it again,
    # through the json package), its text only to find it in the cache.
    return sc.compile_document(doc, json.dumps(doc).encode(), "linux.seccomp",
                               skip_unknown=not strict)


def premake(plan, req):
    """Real root, a container with a user namespace of its own: the config's
    device nodes, made now (linux/devnodes.premake_devices), for the init to
    attach.  Last in plan.build: the caller closes them with the plan."""
    x = req.extras
    x.premade = None
    if x.mknod and plan.clone_flags & NS_FLAGS["user"]:
        from ..errors import SandboxError
        from ..linux.devnodes import premake_devices
        try:
            x.premade = premake_devices(x.mknod, req.idmaps)
        except OSError as e:
            raise SandboxError("making the config's devices", e.strerror or str(e)) from None
