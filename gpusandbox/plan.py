"""RunSpec + host facts -> LaunchPlan, pure data computed before any fork.

Everything that can fail because of user input or the host fails here, with
a clear message, before a namespace exists.  The stages read only the plan.
"""
import os
import stat

from . import environ as envmod
from .edits import OWN_FS, ContainerEdits, from_binds, from_edits, op_links, op_points
from .errors import SandboxError, UsageError
from .imageroot import container_path, image_root, is_host_root, root_identity
from .linux import sys as k
from .plandev import _devices, _gpu, fabric
from .spec import names_squashfs

STD_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# runc's masked and read-only /proc and /sys paths (facts from its defaults).
MASKED_FILES = ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug",
                "/proc/latency_stats", "/proc/timer_stats")
MASKED_DIRS = ("/proc/acpi", "/proc/scsi", "/proc/asound", "/sys/firmware",
               "/sys/devices/virtual/powercap")
READONLY_PATHS = ("/proc/sys", "/proc/irq", "/proc/bus", "/proc/fs", "/proc/sysrq-trigger")
USERNS_HINT = ("user namespaces look disabled here: enable them with "
               "'sysctl -w kernel.unprivileged_userns_clone=1' and "
               "'sysctl -w user.max_user_namespaces=15000', or on Ubuntu allow them with "
               "'sysctl -w kernel.apparmor_restrict_unprivileged_userns=0'; "
               "'gpusandbox doctor' checks this")




def mount_points(plan):
    """(path, kind) of every mount point the launch needs in the image, and
    the links GPU injection adds, for the init stage to create in the
    overlay's upper layer (rootless users cannot create them in image
    directories they do not own)."""
    points = [("/proc", "dir"), ("/sys", "dir"), ("/dev", "dir"), ("/tmp", "dir"),
              ("/run", "dir")]
    points += op_points(plan.mounts)
    points.append((plan.workdir, "dir"))
    points = [(p, k) for p, k in points if not p.startswith(OWN_FS) and p != "/"]
    links = [(p, t) for p, t in op_links(plan.mounts) if not p.startswith(OWN_FS)]
    return points, links


def sealed_dirs(plan):
    """The directories of a shared store's image to show as the image had
    them ((path, uid, gid, mode), made in the upper layer: image/storeread.py
    StoreReader.sealed).  In a user namespace the image's owners cannot be
    shown, so only what the seal took from the mode (group/other write, as
    in 1777 directories) is given back, to a directory of the caller's."""
    out = []
    for path, uid, gid, mode in plan.spec.image_dirs:
        if f"/{path}/".startswith(OWN_FS):
            continue
        if plan.userns == "host":
            out.append((path, uid, gid, mode))
        elif mode & 0o022:
            out.append((path, None, None, mode))
    return out


def _job_fds(host_env):
    """Descriptors a batch system hands the job by number: srun's PMI-2 socket
    (PMI_FD).  It stays open through to the command, as for any srun task;
    nothing else the caller left open does.  Only the caller's own PMI_FD
    counts, and only when it names a socket: an image's PMI_FD, or a number
    naming a leaked directory descriptor, would hand the command a handle on
    the host's tree (/proc/self/fd/N/.., runc's CVE-2024-21626)."""
    from . import number
    fd = number(host_env.get("PMI_FD") or "")
    if fd is None:
        return ()
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return ()
    except OSError:
        return ()
    return (fd,)


def _job_binds(host_env):
    """PMIx clients reach the server through unix sockets in its temporary
    directories; they appear at the same path inside.  Only the caller's
    variables name them: a value from the image would bind any host
    directory read-write into the sandbox."""
    from .spec import Bind
    out = []
    for key in ("PMIX_SERVER_TMPDIR", "PMIX_SYSTEM_TMPDIR"):
        path = host_env.get(key)
        if path and path.startswith("/") and "\0" not in path and os.path.isdir(path) and \
                not any(b.dst == os.path.normpath(path) for b in out):
            out.append(Bind(path, os.path.normpath(path), True, "dir"))
    return out


class LaunchPlan:
    __slots__ = ("spec", "rootfs", "rootfd", "root_id", "clone_flags", "userns", "idmap", "real_root", "cmd_uid",
                 "cmd_gid", "clear_groups", "devpts_gid",
                 # capability sets of the command (tuples of numbers), every door
                 "cap_bounding", "cap_effective", "cap_permitted", "cap_inheritable",
                 "cap_ambient",
                 # supplementary groups set (None: cleared or kept, clear_groups),
                 # no_new_privs, umask (None: inherited)
                 "groups", "no_new_privs", "umask",
                 # per-process kernel settings (oci/configproc.ProcSettings) or
                 # None; whether stdio is handed to the command's user (OCI doors)
                 "proc_settings", "stdio_owner",
                 # /proc and /sys paths hidden (tried as files, as directories)
                 # and frozen read-only
                 "masked_files", "masked_dirs", "readonly_paths", "env", "argv", "workdir",
                 "hostname", "binds", "keep_fds", "edits", "points", "links", "dirs", "seccomp",
                 "device_rules", "notes", "warnings",
                 "own_cgroup", "squash", "squash_pid", "forced_env", "pod", "gpu",
                 # IMAGE is the host's root (hostroot.py): tmpfs to hide, sockets to cover
                 "host_root", "hide", "masks",
                 # the image is not the launch's to change (--rw, the host's
                 # root): the edits create nothing in it and the driver's
                 # files go to our own /run (gpu/inject.py PRIVATE)
                 "keep_image",
                 # the mount operations after the system mounts, in order
                 # (edits.MountOp: the edits', the binds', an OCI config's),
                 # and the options of the init's own /run (a MountOp, or None)
                 "mounts", "run_tmpfs",
                 # kernel settings of the container: [(sysctl key, value)],
                 # its NIS domain name, [(RLIMIT_*, soft, hard)], oom_score_adj
                 "sysctl", "domainname", "rlimits", "oom_score_adj",
                 # the root's propagation after the pivot, (MS_* flag,
                 # recursive) or None (oci/propagation.py)
                 "rootfs_propagation",
                 # OCI hooks (the config's hooks object) and the state the
                 # init's createContainer/startContainer hooks get, or None
                 "hooks", "hook_state",
                 # a created container's life (oci/config.py OciExtras: the
                 # fifo `start` opens), else None
                 "oci")

    def __init__(self, spec):
        self.spec = spec
        self.notes = []
        self.warnings = []
        self.edits = ContainerEdits()
        self.device_rules = None
        self.seccomp = None
        self.dirs = ()
        # Set by the launcher: the sandbox starts in a cgroup2 leaf of its own,
        # which init then shows at /sys/fs/cgroup.
        self.own_cgroup = False
        # IMAGE is a squashfs file ("kernel" or "fuse", with squashfuse's pid):
        # rootfd is its detached mount and root_id names the directory the
        # init attaches the root over (image/squash.py).
        self.squash = None
        self.squash_pid = None
        # Variables the launcher sets over every other row (gpu/share.py).
        self.forced_env = None
        self.groups = None
        self.no_new_privs = True
        self.umask = None
        self.proc_settings = None
        self.stdio_owner = False
        # runc's defaults (`run`); an OCI config's own lists replace them.
        self.masked_files, self.masked_dirs = MASKED_FILES, MASKED_DIRS
        self.readonly_paths = READONLY_PATHS
        # Pod mode: an hpc.pod.Pod; the rank joins the pod's namespaces.
        self.pod = None
        self.oci = None
        self.host_root = False
        self.keep_image = False
        self.mounts = []
        self.run_tmpfs = None
        self.sysctl = ()
        self.domainname = None
        self.rootfs_propagation = None
        self.rlimits = ()
        self.oom_score_adj = None
        self.hooks = {}
        self.hook_state = None
        self.hide = ()
        self.masks = ()
        # The GPU selection (gpu/select.Selection), None when the launch has
        # no GPU support: no driver file was injected.
        self.gpu = None

    def container_settings(self):
        """Whether stages/ocisetup.py has anything to do for this plan: hooks,
        the container's kernel settings, a root propagation, or a created
        container's life (plan.oci).  A plan with none of them (a plain
        `run`) never loads it."""
        return bool(self.oci is not None or self.hook_state or any(self.hooks.values())
                    or self.domainname or self.sysctl or self.rootfs_propagation is not None)


# --- the default network namespace (_identity calls it once the command's host uid
# is known): the host's only when that uid is one the caller chose.

def host_net_risk(plan, spec, real_root):
    """Why the host's network namespace is no default for this command (a
    host uid the caller did not choose as its own), or None.

    Host daemons on abstract unix sockets (D-Bus session buses, X11, the
    containerd shim) live in the network namespace, not the filesystem, so no
    mount hides them, and they trust the peer uid SO_PEERCRED reports.
    uid 0 there is root to every such daemon (containerd-shim,
    CVE-2020-15257; a user namespace of a root caller maps uid 0 inside to
    uid 0 outside).  Under root, an image's User picks the host uid too: an
    image saying `User: 1006` would be uid 1006 to that user's session
    daemons, though neither the caller nor uid 1006 chose it.  The caller's
    own uid (rootless: daemons already see the caller) and a uid the caller
    names with --user are the caller's decision, so those keep the host's."""
    if real_root and plan.cmd_uid == 0:
        return "the command is uid 0 on the host"
    if real_root and spec.user_by_image:
        return (f"the command's host uid {plan.cmd_uid} is the image's User, not a uid "
                "you chose with --user")
    return None


_NET_WARNING = "cannot reach each other over TCP"


def resolve_net(plan, spec, risk, host_env):
    """Resolve the default network namespace into spec.net: a private one
    (loopback up) when `risk` says why the host's is not safe to default to,
    else the host's.  This holds inside Slurm steps too: ranks that get a
    private one and talk TCP need --net host, which a multi-task step is
    told.  A .sqsh file's User plans the identity a second time: what the
    first pass said about the network is replaced."""
    plan.notes[:] = [n for n in plan.notes if not n.startswith("network: ")]
    plan.warnings[:] = [w for w in plan.warnings if _NET_WARNING not in w]
    if spec.net is None:
        spec.net = "none" if risk else "host"
        if risk:
            plan.notes.append(f"network: private namespace, loopback only ({risk}; "
                              "--net host shares the host's)")
            tasks = host_env.get("SLURM_STEP_NUM_TASKS") or host_env.get("SLURM_NTASKS") or ""
            if host_env.get("SLURM_STEP_ID") and tasks.isdigit() and int(tasks) > 1:
                plan.warnings.append(
                    f"note: the command runs as uid {plan.cmd_uid} in a private network "
                    f"namespace, so the {tasks} tasks of this Slurm step {_NET_WARNING}; "
                    "pass --net host if they must")
    elif spec.net == "host" and risk:
        if plan.cmd_uid == 0:
            plan.notes.append("network: the host's (--net host): the command is uid 0 to host "
                              "services on abstract unix sockets; CAP_NET_RAW and "
                              "CAP_NET_BIND_SERVICE dropped")
        else:
            plan.notes.append(f"network: the host's (--net host): the command is uid "
                              f"{plan.cmd_uid} (the image's User) to host services on "
                              "abstract unix sockets")


def _identity(plan, spec, host_env=None):
    if spec.oci is not None:
        # The config says every id, namespace and capability itself.
        from .oci import configplan
        configplan.identity(plan, spec.oci)
        return
    real_root = os.geteuid() == 0
    plan.real_root = real_root
    uid, gid = os.geteuid(), os.getegid()
    mode = spec.userns
    if mode == "auto":
        mode = "host" if real_root else "single"
    if mode == "host" and not real_root:
        raise UsageError("--userns host needs real root", None,
                         "drop the option: rootless runs always use a user namespace")
    if spec.user is not None and not (real_root and mode == "host"):
        raise UsageError("--user needs real root without a user namespace", None,
                         "rootless runs keep your uid; use --root for uid 0 inside")
    plan.userns = mode
    plan.idmap = None
    plan.clear_groups = False
    plan.devpts_gid = None
    if mode == "host":
        plan.cmd_uid, plan.cmd_gid = spec.user if spec.user else (0, 0)
        plan.clear_groups = True
        plan.devpts_gid = 5
    else:
        inside_uid = 0 if (spec.fakeroot or real_root) else uid
        inside_gid = 0 if (spec.fakeroot or real_root) else gid
        plan.cmd_uid, plan.cmd_gid = inside_uid, inside_gid
        if mode == "single":
            plan.idmap = ("single", inside_uid, uid, inside_gid, gid)
        else:
            from .linux import idmap
            import pwd
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            su = idmap.subid_range(name, uid, "/etc/subuid")
            sg = idmap.subid_range(name, uid, "/etc/subgid")
            if not su or not sg:
                raise SandboxError(f"--userns subids: no subordinate id range for {name}",
                                   None, idmap.SUBID_HINT)
            plan.idmap = ("full", idmap.ranges(inside_uid, uid, su),
                          idmap.ranges(inside_gid, gid, sg))
            plan.clear_groups = True
    resolve_net(plan, spec, host_net_risk(plan, spec, real_root),
                       os.environ if host_env is None else host_env)
    from .linux.caps import root_caps
    set_caps(plan, root_caps(spec.net == "host") if plan.cmd_uid == 0 else ())
    flags = (k.CLONE_NEWNS | k.CLONE_NEWPID | k.CLONE_NEWUTS | k.CLONE_NEWIPC
             | k.CLONE_NEWCGROUP)
    if mode != "host":
        flags |= k.CLONE_NEWUSER
    if spec.net == "none":
        flags |= k.CLONE_NEWNET
    plan.clone_flags = flags


def set_caps(plan, keep, sets=None):
    """The command's capability sets: `keep` bounding, effective and
    permitted, none inheritable or ambient (docker's rule for `run`), or
    `sets`, (bounding, effective, permitted, inheritable, ambient) as given
    (an OCI process.capabilities)."""
    sets = sets or (keep, keep, keep, (), ())
    (plan.cap_bounding, plan.cap_effective, plan.cap_permitted, plan.cap_inheritable,
     plan.cap_ambient) = sets


def _check_binds(spec):
    for b in spec.binds:
        if b.src is None:
            continue    # a tmpfs (--mount type=tmpfs): nothing of the host
        try:
            b.kind = "dir" if stat.S_ISDIR(os.stat(b.src).st_mode) else "file"
        except FileNotFoundError:
            raise UsageError(f"bind source not found: {b.src}", None,
                             "create it first or fix the path given to -v/--bind") from None
        except OSError as e:
            raise UsageError(f"cannot access bind source {b.src}", e.strerror, None) from None


def build(spec, host_env=None):
    host_env = os.environ if host_env is None else host_env
    plan = LaunchPlan(spec)
    plan.oci = spec.oci.extras if spec.oci is not None else None
    if spec.profile:
        from . import profile
        profile.apply(spec, plan.warnings)
    squash = names_squashfs(spec.image)
    if not squash:
        plan.rootfs, plan.rootfd, config = image_root(spec.image, spec.image_fd)
        plan.root_id = root_identity(plan.rootfd, plan.rootfs)
        if is_host_root(plan.rootfd):
            from . import hostroot       # only for IMAGE `/`: off a plain launch's path
            hostroot.check(plan, spec)
    # The caller's --net (None: the plan's default), for an identity chosen again.
    asked_net = spec.net
    _identity(plan, spec, host_env)
    if squash:
        config = _squash_root(plan, spec.image)
        if plan.squash:
            # The image config a `pull -o` file carries (image/sqshconfig.py);
            # its User, once resolved, is the identity chosen again, and
            # with it the default network (resolve_net).
            from .image import sqshconfig
            if sqshconfig.apply(plan, spec.image):
                spec.net = asked_net
                _identity(plan, spec, host_env)
        elif not spec.argv:
            raise UsageError("missing command", None, "a directory image needs one: "
                             "gpusandbox run [options] IMAGE_DIR [--] CMD [ARG...]")
    # After every identity choice (a .sqsh file's User chooses again): the
    # pod takes the user, pid and IPC namespaces the identity set up.
    if spec.share == "node" or (spec.share is None and host_env.get("SLURM_STEP_ID")):
        from .hpc import pod
        pod.plan_pod(plan, spec, host_env)
    rootfd = plan.rootfd
    _check_binds(spec)
    if spec.image_env is not None:
        image_env, image_cwd = spec.image_env   # a store image (image/storeread.py)
    else:
        image_env, image_cwd = envmod.image_env(plan.rootfs, config, rootfd)
    user_env = envmod.user_rows(spec, host_env)
    # An OCI config's root.path is the container's own root (podman's
    # --rootfs, its overlay): written to as runc and the hook do, the driver
    # in the image's own paths.
    plan.keep_image = plan.host_root or (spec.rootfs_mode == "rw" and spec.oci is None)
    gpu_env = _gpu(plan, spec, rootfd, dict(image_env + user_env), host_env)
    gpu_env.update(fabric(plan, spec, user_env, host_env))
    _devices(plan, spec)
    if spec.oci is not None:
        from .oci import configplan
        configplan.devices(plan, spec.oci)
        configplan.paths(plan, spec.oci)
        # As runc: the config's variables only; HOME, when the config has
        # none, from the container's passwd as the command finds it
        # (stages/command.py), after the config's mounts.
        home = None
        plan.env = envmod.build(spec, host_env, image_env, gpu_env, None, None, user_env,
                                defaults=False)
    else:
        passwd = k.read_in_root(rootfd, "/etc/passwd", 4 << 20)
        home = envmod.passwd_home(passwd.decode("utf-8", "replace") if passwd else "",
                                  plan.cmd_uid)
        term = host_env.get("TERM", "xterm") if spec.tty else None
        plan.env = envmod.build(spec, host_env, image_env, gpu_env, home, term, user_env)
    if plan.forced_env:
        from .gpu.share import final_env
        final_env(plan.env, plan.forced_env)
    elif spec.gpu_memory is not None or spec.gpu_compute is not None:
        raise UsageError("--gpu-memory/--gpu-compute need a GPU", "this launch selects none",
                         "select one, e.g. --gpus 0")
    plan.argv = spec.argv
    # Container paths are normalised lexically here, so no `..` reaches the
    # init (where a `..` walk would start from the image on the host).
    plan.workdir = container_path(spec.workdir or image_cwd or "/")
    # No hostname in an OCI config: the new UTS namespace keeps the host's
    # name, as runc leaves it.
    plan.hostname = spec.hostname or ("gpusandbox" if spec.oci is None else os.uname().nodename)
    # Host-side choices (kept fds, binds) read the caller's environment only,
    # never plan.env, which holds the image's rows.  (An OCI config's
    # descriptors: configplan.identity.)
    if spec.oci is None:
        plan.keep_fds = _job_fds(host_env)
    plan.binds = _job_binds(host_env) + spec.binds
    _normalise_paths(plan)
    if plan.host_root:
        from . import hostroot
        hostroot.finish(plan, spec, home, host_env)
    # One ordered list of mount operations: the edits' (GPU, CDI, devices),
    # the binds', an OCI config's (and its made devices: configplan.premake).
    plan.mounts = from_edits(plan.edits, plan.keep_image) + from_binds(plan.binds)
    if spec.oci is not None:
        from .oci import configplan
        plan.mounts += configplan.mounts(plan, spec.oci)
    plan.points, plan.links = mount_points(plan)
    plan.dirs = sealed_dirs(plan)
    if spec.oci is not None:
        from .oci import configplan
        plan.seccomp = configplan.seccomp(spec.oci.seccomp, spec.oci.extras.annotations)
        configplan.premake(plan, spec.oci)
    elif spec.seccomp != "unconfined":
        from .linux import seccomp
        plan.seccomp = seccomp.compile_profile(spec.seccomp)
    return plan


def _squash_root(plan, image):
    """IMAGE named FILE.sqsh: mounted (detached) before anything reads it.
    Returns the bundle config of a directory that merely has such a name."""
    from .image import squash
    if not squash.is_squashfs_arg(image):
        plan.rootfs, plan.rootfd, config = image_root(image)
        plan.root_id = root_identity(plan.rootfd, plan.rootfs)
        return config
    plan.rootfs, plan.rootfd = squash.mount_image(image, plan)
    # The init attaches the root over the file's directory in its private
    # namespace, found again by inode as an IMAGE_DIR is (nothing is mounted
    # there on the host; the old root goes at the pivot).
    try:
        pfd = os.open(os.path.dirname(plan.rootfs), k.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            plan.root_id = root_identity(pfd, plan.rootfs)
        finally:
            os.close(pfd)
    except BaseException:
        os.close(plan.rootfd)
        raise
    return None


def _normalise_paths(plan):
    for b in plan.binds:
        b.dst = container_path(b.dst)
    e = plan.edits
    for item in e.device_nodes + e.mounts + e.symlinks + e.files + e.tmpfs:
        item.path = container_path(item.path)
    if plan.keep_image and e.mounts:
        # --rw, the host's root: GPU binaries live on our own /run tmpfs (see gpu/inject.py).
        from .gpu.inject import PRIVATE_BIN
        if any(m.path.startswith(PRIVATE_BIN + "/") for m in e.mounts):
            path = plan.env.get("PATH") or ""
            plan.env["PATH"] = PRIVATE_BIN + (":" + path if path else "")
