"""An OCI runtime bundle's config.json -> RunSpec with its OciRequest
(spec.oci: namespaces, ids, capabilities, devices, the seccomp document and
OciExtras), which plan.build turns into the LaunchPlan the stages of
`gpusandbox run` read (oci/configplan.py).

config.json comes from the runtime's caller (podman, containerd), who runs
the runtime with its own privileges: it is read as data of the expected
types, and what gpusandbox cannot honour is refused with one line rather
than ignored.  GPUs come from the config's GpuRequest (gpu/request.py:
process.env's NVIDIA_* selection variables and cdi.k8s.io annotations, as the
wrapper, filter and hook read them); which driver root serves them is the
caller's choice (its environment or the settings files: gpusandbox.settings),
never the config's.
"""
import os
import stat

# The json package's results without its import of re and enum (`create`).
from . import fastjson as json
from ..errors import UsageError
from ..spec import RunSpec
from ..linux import host
from ..linux.host import NS_FLAGS, initial_userns
from . import configmount
from .confighost import _devices
from .configfield import _bad, _get, _strs
from .configplan import OciRequest
from .configprocess import CAPS, RLIMITS, cap_sets  # noqa: F401 - the callers' names
from .configprocess import parse as parse_process
from .configsysctl import sysctl_namespaced as _sysctl_namespaced
from . import propagation

MAX_CONFIG = 4 << 20

class OciExtras:
    """What a created container's life adds to a plan (plan.oci): the exec
    fifo `start` opens, the namespaces `create` joined, the annotations,
    linux.resources as linux/cgroupres.Limits (`create` applies them) and
    linux.cgroupsPath (its v1 leaves' place)."""
    __slots__ = ("fifo", "annotations", "ns_join", "limits", "cgroups_path")


def read(bundle, path=None):
    """The bundle's config.json (or `path`) as a dict (size-bounded, a
    regular file)."""
    path = path or os.path.join(bundle, "config.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise UsageError(f"OCI bundle {bundle}", f"cannot open config.json: {e.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _bad(path, "not a regular file")
        data = os.read(fd, MAX_CONFIG + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG:
        raise _bad(path, f"larger than {MAX_CONFIG} bytes")
    try:
        conf = json.loads(data)
    except (ValueError, RecursionError):
        raise _bad(path, "not valid JSON") from None
    if not isinstance(conf, dict):
        raise _bad(path, "not a JSON object")
    return conf


def _namespaces(linux, real_root):
    """(clone flags, [(type, path)] to join, user namespace requested)."""
    flags, join, seen = 0, [], set()
    for i, ns in enumerate(_get(linux, "namespaces", list, "linux", [])):
        where = f"linux.namespaces[{i}]"
        t = _get(ns, "type", str, where)
        if t not in NS_FLAGS:
            raise _bad(where, f"namespace type {t!r} is not supported")
        if t in seen:
            raise _bad(where, f"namespace {t} listed twice")
        seen.add(t)
        path = _get(ns, "path", str, where)
        if path:
            # runc's rule: a path is joined, never made (create.py, setns(2)).
            if t == "user" and _own_userns(path, where):
                # The caller's own (rootless podman's): nothing to join, and
                # no namespace of the container's: its ids are the caller's.
                seen.add("own-user")
                continue
            join.append((t, path))
        else:
            flags |= NS_FLAGS[t]
    # The init builds the root in a mount namespace of its own: always new.
    # Without a pid or uts namespace the container shares the host's, as
    # runc's does (the workload is then no pid 1; only root can mount a
    # procfs of the host's pid namespace, so a user namespace needs one).
    if "mount" not in seen:
        raise _bad("linux.namespaces", "no mount namespace: sharing the host's is not supported")
    if "own-user" in seen:
        seen.discard("user")
        seen.discard("own-user")
        real_root = True     # no namespace to make for a user: the caller's is the one
    if "pid" not in seen and "user" in seen:
        raise _bad("linux.namespaces", "a user namespace needs a pid namespace as well",
                   "a procfs of the host's pid namespace cannot be mounted in it")
    if not real_root and "user" not in seen:
        # Nothing a user runs can be real root: the container gets a user
        # namespace of its own (crun's rule; _idmaps maps the process's ids).
        seen.add("user")
        flags |= NS_FLAGS["user"]
        if "pid" not in seen:
            raise _bad("linux.namespaces", "a rootless container needs a pid namespace",
                       "a procfs of the host's pid namespace cannot be mounted in it")
    if not any(t == "cgroup" for t, _ in join):
        flags |= NS_FLAGS["cgroup"]
    return flags, join, "user" in seen


def _own_userns(path, where):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise _bad(where, f"cannot open the user namespace {path}: {e.strerror}") from None
    try:
        return host.same_ns(fd, "user")
    finally:
        os.close(fd)


def _joined_maps(path):
    """The maps of the user namespace at `path`: the container's.  The
    config's uidMappings/gidMappings are not used (nothing is written to a
    namespace that exists; podman's `--userns ns:PATH` sends a placeholder
    0 0 1), as with runc."""
    try:
        maps = host.userns_maps(path)
    except host.NamespaceError as e:
        raise _bad("linux.namespaces", f"cannot join the user namespace {path}: {e.strerror}",
                   "the path must name a user namespace this caller may enter") from None
    for key, rows in zip(("uidMappings", "gidMappings"), maps):
        if not rows:
            raise _bad("linux.namespaces", f"the user namespace {path} has no {key[:3]} map yet",
                       "write its uid_map and gid_map before create")
    return list(maps)


def _idmaps(linux, uid, gid):
    """(uid rows, gid rows); a config without them maps the process's own
    uid and gid to the caller's (crun's default)."""
    if not linux.get("uidMappings") and not linux.get("gidMappings"):
        return [[(uid, os.geteuid(), 1)], [(gid, os.getegid(), 1)]]
    out = []
    for key in ("uidMappings", "gidMappings"):
        rows = []
        for i, r in enumerate(_get(linux, key, list, "linux", [])):
            vals = [_get(r, f, int, f"linux.{key}[{i}]") for f in ("containerID", "hostID", "size")]
            if any(v is None or v < 0 for v in vals):
                raise _bad(f"linux.{key}[{i}]", "containerID, hostID and size are required")
            rows.append(tuple(vals))
        if not rows:
            raise _bad("linux", f"a user namespace needs {key}")
        out.append(rows)
    return out


def _refuse_unknown(conf, linux, proc):
    for key in ("intelRdt", "timeOffsets"):
        if linux.get(key):
            raise _bad("linux", f"{key} is not supported")
    if linux.get("mountLabel"):
        raise _bad("linux", "mountLabel: no LSM support in gpusandbox")
    if proc.get("apparmorProfile") or proc.get("selinuxLabel"):
        raise _bad("process", "apparmorProfile/selinuxLabel: no LSM support in gpusandbox")


def _resources(spec, linux):
    res = _get(linux, "resources", dict, "linux", {})
    mem = _get(res, "memory", dict, "linux.resources", {})
    if mem.get("limit") is not None and _get(mem, "limit", int, "memory") > 0:
        spec.memory = str(mem["limit"])
        swap = _get(mem, "swap", int, "memory")
        if swap is not None:
            spec.memory_swap = "max" if swap < 0 else str(swap)
    pids = _get(res, "pids", dict, "linux.resources", {})
    if pids.get("limit") is not None and _get(pids, "limit", int, "pids") > 0:
        spec.pids_limit = str(pids["limit"])
    cpu = _get(res, "cpu", dict, "linux.resources", {})
    quota, period = _get(cpu, "quota", int, "cpu"), _get(cpu, "period", int, "cpu")
    if quota and quota > 0:
        spec.cpus = str(quota / (period or 100000))
    rules = []
    for i, d in enumerate(_get(res, "devices", list, "linux.resources", [])):
        where = f"linux.resources.devices[{i}]"
        if not _get(d, "allow", bool, where, False):
            continue      # gpusandbox's filter denies by default
        t, acc = _get(d, "type", str, where, "a"), _get(d, "access", str, where, "rwm")
        major, minor = _get(d, "major", int, where), _get(d, "minor", int, where)
        if t == "c" and major is not None and minor is not None and "m" != acc:
            rules.append(("c", major, minor, "".join(c for c in acc if c in "rw")))
    return rules


def load(bundle, host_env, fifo=None, preserve_fds=0, config_path=None, cid=None):
    """The RunSpec of `bundle`, its OciRequest in spec.oci: plan.build's
    input.  Raises UsageError naming the field."""
    bundle = os.path.abspath(bundle)
    conf = read(bundle, config_path)
    ver = _get(conf, "ociVersion", str, "ociVersion", "")
    if not ver.startswith("1."):
        raise _bad("ociVersion", f"{ver!r} is not a 1.x version")
    proc = _get(conf, "process", dict, "process")
    if proc is None:
        raise _bad("process", "missing (nothing to run)")
    linux = _get(conf, "linux", dict, "linux", {})
    _refuse_unknown(conf, linux, proc)
    real_root = os.geteuid() == 0
    spec = RunSpec()
    root = _get(conf, "root", dict, "root", {})
    rpath = _get(root, "path", str, "root", "rootfs")
    spec.image = os.path.join(bundle, rpath)
    spec.rootfs_mode = "ro" if _get(root, "readonly", bool, "root", False) else "rw"
    pr = parse_process(proc, linux)
    spec.argv, env, cwd = pr.args, pr.env, pr.cwd
    listen = host_env.get("LISTEN_FDS", "")
    if listen.isdigit() and 0 < int(listen) < 1024:
        # systemd socket activation through the runtime (runc's and crun's
        # rule): the caller's LISTEN_FDS descriptors are passed on, and the
        # workload, pid 1, is the one they are for.
        env += [("LISTEN_FDS", listen), ("LISTEN_PID", "1")]
        preserve_fds += int(listen)
    spec.image_env = (env, cwd)
    spec.tty = pr.terminal
    spec.hostname = _get(conf, "hostname", str, "hostname") or None
    spec.seccomp = "unconfined"     # the config's own profile is set on the plan
    uid, gid = pr.uid, pr.gid
    flags, join, userns = _namespaces(linux, real_root)
    spec.userns = "host" if real_root and not userns else "single"
    if spec.userns == "host":
        spec.user = (uid, gid)
    spec.net = "none" if flags & NS_FLAGS["network"] else "host"
    dev_rules = _resources(spec, linux)
    # The GPU request is the config's (gpu/request.py, as the wrapper, filter
    # and hook read it); where the driver and the CDI specs are is the
    # caller's choice: no other variable of the caller's reaches the plan.
    plan_env = {}
    from ..gpu.request import from_config
    gpu_request = from_config(conf)
    if not gpu_request.empty():
        spec.gpu_request = gpu_request
        from ..settings import driver_roots
        spec.driver_root, spec.dev_root = driver_roots(host_env)
        if gpu_request.cdi:
            from .cdi.registry import ENV_DIRS
            if host_env.get(ENV_DIRS):
                plan_env[ENV_DIRS] = host_env[ENV_DIRS]
    x = OciExtras()
    x.fifo = fifo
    x.annotations = _get(conf, "annotations", dict, "annotations", {})
    x.ns_join = join
    from ..linux.cgroupres import from_oci
    x.limits = from_oci(_get(linux, "resources", dict, "linux", {}))
    x.cgroups_path = _get(linux, "cgroupsPath", str, "linux")
    if x.cgroups_path and ".." in x.cgroups_path.split("/"):
        raise _bad("linux.cgroupsPath", f"{x.cgroups_path!r}: '..' is not allowed",
                   "give a path inside the cgroup hierarchy")
    sysctl = []
    for key, val in _get(linux, "sysctl", dict, "linux", {}).items():
        if not all(w and w.replace("_", "").replace("-", "").isalnum() for w in key.split(".")) \
                or not isinstance(val, str):
            raise _bad("linux.sysctl", f"invalid key {key!r}")
        _sysctl_namespaced(key, val, flags, join, conf.get("domainname"), NS_FLAGS)
        sysctl.append((key, val))
    domainname = _get(conf, "domainname", str, "domainname") or None
    rprop = _get(linux, "rootfsPropagation", str, "linux")
    if rprop and rprop not in propagation.OPTIONS:
        raise _bad("linux.rootfsPropagation", f"{rprop!r} is not a mount propagation",
                   f"use one of {', '.join(sorted(propagation.OPTIONS))}")
    own_uts = flags & NS_FLAGS["uts"] or any(t == "uts" for t, _ in join)
    if domainname and not own_uts:
        raise _bad("domainname", "needs a uts namespace of the container's")
    if spec.hostname and not own_uts:
        raise _bad("hostname", "needs a uts namespace of the container's")
    seccomp = _get(linux, "seccomp", dict, "linux")
    if seccomp and (seccomp.get("listenerPath") or seccomp.get("flags")):
        raise _bad("linux.seccomp", "listenerPath and flags are not supported",
                   "gpusandbox's filter has no user-space notifier and no filter flags")
    hooks = _get(conf, "hooks", dict, "hooks", {})
    hook_state = None
    if hooks.get("createContainer") or hooks.get("startContainer"):
        # The OCI state the init's createContainer/startContainer hooks get
        # (the init adds its own pid).
        hook_state = {"ociVersion": "1.0.2", "id": cid, "status": "created",
                      "bundle": bundle, "annotations": x.annotations}
    req = OciRequest()
    req.flags, req.join, req.process = flags, join, pr
    user_path = dict(join).get("user")
    req.idmaps = (_joined_maps(user_path) if user_path else
                  _idmaps(linux, uid, gid) if userns else None)
    req.seccomp = seccomp
    req.dev_rules = dev_rules
    req.devices = _devices(linux, make=real_root and initial_userns())
    req.keep_fds = _open_fds(preserve_fds)
    req.plan_env = plan_env
    req.mounts = configmount.mounts(conf, bundle)
    req.masked = tuple(_strs(_get(linux, "maskedPaths", list, "linux", []),
                             "linux.maskedPaths"))
    req.readonly = tuple(_strs(_get(linux, "readonlyPaths", list, "linux", []),
                               "linux.readonlyPaths"))
    req.sysctl, req.domainname, req.hooks, req.hook_state = sysctl, domainname, hooks, hook_state
    req.rootfs_propagation = propagation.OPTIONS.get(rprop)
    req.extras = x
    spec.oci = req
    return spec


def _open_fds(n):
    """The descriptors 3 .. 3+n-1 (--preserve-fds N) the caller really passed:
    a hole in that range is not passed on (it may hold one of this runtime's
    own descriptors by the time the workload starts)."""
    out = []
    for fd in range(3, 3 + n):
        try:
            os.get_inheritable(fd)
        except OSError:
            continue
        out.append(fd)
    return tuple(out)
