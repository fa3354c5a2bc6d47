"""GPU injection written into an OCI config.json (the wrapper and the filter).

The edits come from the one code path `run` uses (gpu.select -> gpu.inject
build_edits -> ContainerEdits), and become the plan's mount ops by the one
translation `run` uses (edits.from_edits); this module only writes those
ops in the runtime-spec's terms, which oci/configmount.py reads back into
the same ops (tests/unit/test_configedit_roundtrip.py holds the two
directions together):

  fs (a tmpfs)  -> a tmpfs mount with the op's options, "ro" when the ops
                   seal it;
  node          -> linux.devices (host node at the same path) or a bind mount
                   of the host node (a simulated or relocated dev root, also
                   noexec), plus a linux.resources.devices allow rule for
                   each, so the runtime's own cgroup device filter grants
                   exactly them;
  bind          -> a bind mount with the op's ro, nosuid, nodev, noexec;
  symlink       -> a bind mount of the file the link leads to (a config.json
                   cannot create links, and no hook has to run in the image);
  file (/etc/ld.so.cache) -> a file generated on the host (in the bundle, or
                   a state directory) bound read-only over the image's;
and the edits' env -> process.env.

What lives under /proc (the /proc/driver mask and the per-GPU proc entries)
has no config.json form that runc accepts (it refuses mounts under /proc);
the GPU works without them: NVML and CUDA read /dev and sysfs.

Nothing from config.json decides a host path: what the container asks for
is its GpuRequest (gpu/request.py: process.env's NVIDIA_VISIBLE_DEVICES,
NVIDIA_DRIVER_CAPABILITIES and MIG variables, cdi.k8s.io/* annotations; the
one parser `gpusandbox-oci create` uses too), and the driver and dev roots
come from the settings (the caller's environment or the settings files:
gpusandbox.settings).
The rootfs is only read, through read_in_root (openat2 RESOLVE_IN_ROOT).
"""
import os

from gpusandbox.errors import GpuError, UsageError
from gpusandbox.gpu.request import CDI_ANNOTATION, from_config
from gpusandbox.gpu.request import config_env as container_env

# The toolkit's legacy prestart hook (nvidia-container-runtime adds it): it
# would inject a second time, with the toolkit's own guards.
LEGACY_HOOKS = ("nvidia-container-runtime-hook", "nvidia-container-toolkit")
# What the text of a config.json that `edit` acts on holds at least one of:
# the variable that asks for GPUs, the CDI annotations' prefix and the
# legacy hooks.  bin/gpusandbox-runtime greps for exactly these words
# (tests/unit/test_sh_tables.py holds the two together).
REQUEST_WORDS = ("NVIDIA_VISIBLE_DEVICES", CDI_ANNOTATION) + LEGACY_HOOKS
MAX_CONFIG = 16 << 20
_RO = ["bind", "ro", "nosuid", "nodev"]


def host_roots(environ):
    """(driver_root, dev_root) of the settings (gpusandbox.settings): the
    caller's GPUSANDBOX_DRIVER_ROOT / GPUSANDBOX_DEV_ROOT, else the settings
    files' driver-root / dev-root, else / and None (the driver root's /dev)."""
    from gpusandbox.settings import driver_roots
    return driver_roots(environ)


def resolve_cdi(names, rootfd=None, environ=None):
    """(ContainerEdits, extra device rules [(type, major, minor, access)]) for
    CDI names, from the specs in /etc/cdi and /var/run/cdi
    ($GPUSANDBOX_CDI_SPEC_DIRS of the caller): gpusandbox.oci.cdi, the CDI
    consumer `run --device VENDOR/CLASS=NAME` uses."""
    try:
        from gpusandbox.oci.cdi import resolve
    except ImportError:
        raise GpuError(f"CDI devices {', '.join(names)}",
                       "this gpusandbox has no CDI support (gpusandbox.oci.cdi)",
                       hint="ask with NVIDIA_VISIBLE_DEVICES=0,1 instead") from None
    res = resolve(names, rootfd=rootfd, environ=environ)
    if not hasattr(res, "edits"):
        return res, []
    import sys
    for line in getattr(res, "warnings", ()):
        sys.stderr.write(f"gpusandbox: {line}\n")
    return res.edits, list(getattr(res, "rules", ()))


def selection(req, host):
    """The Selection a config's GpuRequest asks for, or None."""
    from gpusandbox.gpu import select
    return select.for_request(req, host)


def discover_host(environ):
    from gpusandbox.gpu.discover import discover
    drv, dev = host_roots(environ)
    return discover(drv, dev, environ={})


def open_rootfs(cfg, bundle_fd=None):
    """Held O_PATH fd of the config's root.path (relative to the bundle), or
    None when it is not there yet (podman's precreate stage)."""
    root = cfg.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        return None
    flags = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
    if not path.startswith("/") and bundle_fd is None:
        return None   # the filter sees no bundle: a relative root is not ours to guess
    try:
        if path.startswith("/"):
            return os.open(path, flags)
        return os.open(path, flags, dir_fd=bundle_fd)
    except OSError:
        return None


def gpu_edits(host, sel, rootfd):
    """ContainerEdits for `sel` placed in the image at rootfd (read only)."""
    from gpusandbox.gpu import inject
    from gpusandbox.linux.sys import kind_in_root
    empty = None
    if rootfd is None:
        import tempfile
        empty = tempfile.mkdtemp(prefix="gpusandbox-empty-")
        rootfd = os.open(empty, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        edits = inject.build_edits(host, sel, rootfd)
        has_cache = kind_in_root(rootfd, "/etc/ld.so.cache") == "file"
    finally:
        if empty is not None:
            os.close(rootfd)
            os.rmdir(empty)
    if not has_cache:
        # Without the image's own cache, ours would hide every library the
        # image has outside ld.so's default directories; the driver's are in
        # those directories, which ld.so searches without a cache.
        edits.files = [f for f in edits.files if f.path != "/etc/ld.so.cache"]
    return edits


def _section(obj, key, kind):
    v = obj.get(key)
    if v is None:
        v = obj[key] = kind()
    if not isinstance(v, kind):
        raise UsageError("config.json", f"{key} is not a JSON {kind.__name__}")
    return v


def _links_to_files(ops):
    """{container path: host path} for each symlink op whose target is a
    file the ops bind (followed through links), so a bind mount replaces it."""
    files = {op.path: op.source for op in ops if op.op == "bind"}
    links = {op.path: op.target for op in ops if op.op == "symlink"}
    out = {}
    for path in links:
        cur = path
        for _ in range(8):
            target = links[cur]
            nxt = target if target.startswith("/") else \
                os.path.normpath(os.path.join(os.path.dirname(cur), target))
            if nxt in files:
                out[path] = files[nxt]
                break
            if nxt not in links:
                break
            cur = nxt
    return out


def write_state_file(statedir, content, mode=0o444):
    """A content-addressed file in statedir (atomic); returns its path.
    _blake2 and a random name of its own rather than hashlib and tempfile:
    their imports cost more than a cached create's whole edit."""
    from _blake2 import blake2b
    name = "ld.so.cache-" + blake2b(content, digest_size=16).hexdigest()
    path = os.path.join(statedir, name)
    if os.path.exists(path):
        return path
    tmp = os.path.join(statedir, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.close(fd)
        fd = None
        os.rename(tmp, path)
    except BaseException:
        if fd is not None:
            os.close(fd)
        os.unlink(tmp)
        raise
    return path


def drop_legacy_hooks(cfg):
    """Remove the toolkit's legacy hook from every stage; True when one was."""
    hooks = cfg.get("hooks")
    dropped = False
    if isinstance(hooks, dict):
        for stage, lst in list(hooks.items()):
            if not isinstance(lst, list):
                continue
            keep = [h for h in lst if not (isinstance(h, dict) and isinstance(h.get("path"), str)
                                           and os.path.basename(h["path"]) in LEGACY_HOOKS)]
            if len(keep) != len(lst):
                dropped = True
                hooks[stage] = keep
    return dropped


def bind_options(op):
    """A bind op's flags as config.json options (configmount reads them back)."""
    return (["bind", "ro" if op.ro else "rw"] + (["nosuid"] if op.nosuid else [])
            + (["nodev"] if op.nodev else []) + (["noexec"] if op.noexec else []))


def tmpfs_options(op, sealed):
    return ((["nosuid"] if op.nosuid else []) + (["nodev"] if op.nodev else [])
            + (["noexec"] if op.noexec else []) + list(op.data)
            + (["ro"] if op.ro or op.path in sealed else []))


def apply(cfg, edits, statedir, extra_rules=()):
    """Write `edits` into the config dict (in place), as the plan's mount
    ops (edits.from_edits) in their order.  Unknown keys are left as they
    are; a destination the config already mounts is not mounted twice.
    What lives under /proc has no config.json form (above): left out."""
    from gpusandbox.edits import from_edits
    ops = [op for op in from_edits(edits) if not op.path.startswith("/proc/")]
    linux = _section(cfg, "linux", dict)
    devices = _section(linux, "devices", list)
    resources = _section(linux, "resources", dict)
    rules = _section(resources, "devices", list)
    mounts = _section(cfg, "mounts", list)
    proc = _section(cfg, "process", dict)
    env = _section(proc, "env", list)
    taken = {m.get("destination") for m in mounts if isinstance(m, dict)}
    have_dev = {d.get("path") for d in devices if isinstance(d, dict)}

    def bind(src, dst, opts):
        if dst not in taken:
            taken.add(dst)
            mounts.append({"destination": dst, "type": "bind", "source": src,
                           "options": list(opts)})

    sealed = {op.path for op in ops if op.op == "seal"}
    links = _links_to_files(ops)
    for op in ops:
        if op.op == "fs":
            # What a CDI spec mounts as tmpfs.
            if op.path not in taken:
                taken.add(op.path)
                mounts.append({"destination": op.path, "type": op.fstype, "source": op.fstype,
                               "options": tmpfs_options(op, sealed)})
        elif op.op == "node":
            if op.source == op.path:
                if op.path not in have_dev:
                    devices.append({"path": op.path, "type": "c", "major": op.major,
                                    "minor": op.minor, "fileMode": 0o666, "uid": 0, "gid": 0})
                    have_dev.add(op.path)
            else:
                # Not at its own path on the host: runtimes only create or
                # bind a linux.devices node from the same path, so it is bound.
                bind(op.source, op.path, ["bind", "rw"] + (["nosuid"] if op.nosuid else [])
                     + ["noexec"])
            rule = {"allow": True, "type": "c", "major": op.major, "minor": op.minor,
                    "access": "rwm"}
            if rule not in rules:
                rules.append(rule)
        elif op.op == "bind":
            bind(op.source, op.path, bind_options(op))
        elif op.op == "symlink" and op.path in links:
            bind(links[op.path], op.path, _RO)
        elif op.op == "file" and op.path == "/etc/ld.so.cache":
            bind(write_state_file(statedir, op.content, op.mode), op.path, _RO)
    for typ, major, minor, access in extra_rules:
        rule = {"allow": True, "type": typ, "major": major, "minor": minor, "access": access}
        if rule not in rules:
            rules.append(rule)
    keys = {e.partition("=")[0]: i for i, e in enumerate(env) if isinstance(e, str)}
    for k, v in edits.env.items():
        item = f"{k}={v}"
        if k in keys:
            env[keys[k]] = item
        else:
            env.append(item)
    return cfg


def memo_gpu_edits(cfg, req, environ, rootfd):
    """gpu_edits for the container's request (None: it selects none), from
    the memo when an entry for exactly these inputs still holds (memo.py),
    else computed and stored."""
    from gpusandbox.oci import memo
    roots = host_roots(environ)
    env = container_env(cfg)
    d = memo.directory()
    k = memo.key(roots, env, rootfd) if d and memo.cacheable(env) else None
    if k is not None:
        hit = memo.lookup(d, k)
        if hit is not memo.MISS:
            return hit
    host = discover_host(environ)
    sel = selection(req, host)
    edits = None if sel is None else gpu_edits(host, sel, rootfd)
    # The image read again: an entry is stored only for the inputs it was
    # computed from.
    if k is not None and memo.key(roots, env, rootfd) == k:
        try:
            memo.store(d, k, host, edits)
        except OSError:
            pass
    return edits


def edit(cfg, environ, statedir, bundle_fd=None):
    """The whole edit for one config: None when the container asks for no
    GPU (the caller then leaves the file as it is), else the edited dict."""
    if not isinstance(cfg, dict):
        raise UsageError("config.json", "not a JSON object")
    dropped = drop_legacy_hooks(cfg)
    req = from_config(cfg)
    if req.empty():
        return cfg if dropped else None
    rootfd = open_rootfs(cfg, bundle_fd)
    try:
        if req.cdi:
            edits, rules = resolve_cdi(list(req.cdi), rootfd, environ)
            apply(cfg, edits, statedir, rules)
        if req.devices is not None:
            edits = memo_gpu_edits(cfg, req, environ, rootfd)
            if edits is not None:
                apply(cfg, edits, statedir)
    finally:
        if rootfd is not None:
            os.close(rootfd)
    return cfg


def load(data):
    from gpusandbox.oci import fastjson
    if len(data) > MAX_CONFIG:
        raise UsageError("config.json", f"larger than {MAX_CONFIG >> 20} MiB")
    try:
        return fastjson.loads(data)
    except ValueError as e:
        raise UsageError("config.json", f"not valid JSON: {e}") from None


def dump(cfg):
    """json.dumps(cfg)'s bytes and a newline (fastjson: no json import)."""
    from gpusandbox.oci import fastjson
    return fastjson.dumps(cfg).encode() + b"\n"


