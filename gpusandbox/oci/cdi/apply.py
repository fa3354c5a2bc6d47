"""CDI devices -> ContainerEdits, in the reference's order.

pkg/cdi (InjectDevices, ContainerEdits.Apply): the edits of every spec
involved come first (once per spec), then each device's own, in the order
the devices were named; within them env, device nodes, mounts (sorted by
the depth of their container path, stably, so a parent is mounted before
what goes inside it), hooks.  Host-side checks: every host path is absolute
without `..` (spec.py); every device node is a character device whose
numbers match what the spec says (stat'ed here, and checked again by its
opened inode in the init, as for --device); nothing the image holds is read
to choose a host path.
"""
import os
import stat

from gpusandbox.edits import ContainerEdits, DeviceNode, Mount, Tmpfs
from gpusandbox.errors import SandboxError
from gpusandbox.oci.cdi import hooks as hookmod

_KEEP = ("ro", "rw", "nosuid", "nodev", "noexec")
# Mount options with no meaning for a bind mount gpusandbox makes itself
# (it always binds, non-recursively, with private propagation).
_IGNORE = ("bind", "rbind", "private", "rprivate", "slave", "rslave", "z", "Z",
           "relatime", "norelatime", "strictatime")


class Result:
    """edits: ContainerEdits; rules: [(type, major, minor, access)] for the
    device filter; warnings: lines for stderr (without 'gpusandbox: ')."""
    __slots__ = ("edits", "rules", "warnings", "devices")

    def __init__(self):
        self.edits = ContainerEdits()
        self.rules = []
        self.warnings = []
        self.devices = []


def _node(node, where):
    host = node.get("hostPath") or node["path"]
    try:
        st = os.stat(host)
    except OSError as e:
        raise SandboxError(f"CDI device node {host} ({where})", e.strerror,
                           hint="the spec may be stale: 'gpusandbox cdi check' compares it "
                                "with the host") from None
    if not stat.S_ISCHR(st.st_mode):
        raise SandboxError(f"CDI device node {host} ({where})", "not a character device",
                           hint="only character devices are bound in (block devices never are)")
    major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    if node.get("type", "c") != "c" or node.get("major", major) != major or \
            node.get("minor", minor) != minor:
        raise SandboxError(f"CDI device node {host} ({where})",
                           f"the host node is c {major}:{minor}, the spec says "
                           f"{node.get('type', 'c')} {node.get('major', major)}:"
                           f"{node.get('minor', minor)}",
                           hint="the spec is stale: regenerate it ('gpusandbox cdi check')")
    perms = node.get("permissions") or "rwm"
    return DeviceNode(node["path"], host, major, minor, perms), ("c", major, minor, perms)


def _mount(mnt, where):
    kind = mnt.get("type", "bind")
    opts = list(mnt.get("options", ()))
    if kind == "tmpfs":
        return Tmpfs(mnt["containerPath"], ro="ro" in opts)
    if kind != "bind" and "bind" not in opts and "rbind" not in opts:
        raise SandboxError(f"CDI mount of {mnt['hostPath']} ({where})",
                           f"type {kind!r} is not supported (bind and tmpfs are)")
    if not os.path.exists(mnt["hostPath"]):
        raise SandboxError(f"CDI mount of {mnt['hostPath']} ({where})", "no such file",
                           hint="the spec may be stale: 'gpusandbox cdi check' compares it "
                                "with the host")
    unknown = [o for o in opts if o not in _KEEP + _IGNORE]
    if unknown:
        raise SandboxError(f"CDI mount of {mnt['hostPath']} ({where})",
                           f"unsupported options {', '.join(unknown)}",
                           hint="bind mounts take ro, rw, nosuid, nodev, noexec")
    keep = [o for o in opts if o in _KEEP]
    if "ro" not in keep and "rw" not in keep:
        keep.append("rw")       # an OCI bind mount is writable unless it says ro
    return Mount(mnt["hostPath"], mnt["containerPath"], keep)


def _add(res, edits, where, work):
    for item in edits.get("env", ()):
        key, _, value = item.partition("=")
        res.edits.env[key] = value
    for node in edits.get("deviceNodes", ()):
        dn, rule = _node(node, where)
        # Two names of one GPU (0 and GPU-...) give the same node once.
        if any((n.path, n.major, n.minor) == (dn.path, dn.major, dn.minor)
               for n in res.edits.device_nodes):
            continue
        res.edits.device_nodes.append(dn)
        res.rules.append(rule)
    mounts = [_mount(m, where) for m in edits.get("mounts", ())]
    mounts = [m for m in mounts if not any(
        type(o) is type(m) and o.path == m.path and getattr(o, "host_path", None) ==
        getattr(m, "host_path", None) for o in res.edits.mounts + res.edits.tmpfs)]
    res.edits.tmpfs += [m for m in mounts if isinstance(m, Tmpfs)]
    res.edits.mounts += [m for m in mounts if isinstance(m, Mount)]
    hookmod.collect(edits.get("hooks", ()), work)
    for key in ("additionalGids", "intelRdt", "netDevices"):
        if edits.get(key):
            res.warnings.append(f"warning: CDI {key} of {where} is not supported: ignored")


def resolve(names, spec_dirs=None, rootfd=None, environ=None):
    """Qualified device names -> Result.  spec_dirs: lowest priority first
    (default registry.spec_dirs(environ)); rootfd: the image root (fd or
    path), read only for update-ldcache's cache merge and compat check."""
    from gpusandbox.oci.cdi.registry import Registry, parse_name, spec_dirs as dirs_of
    reg = Registry(spec_dirs if spec_dirs is not None else dirs_of(environ))
    found = [(n,) + reg.lookup(parse_name(n)) for n in dict.fromkeys(names)]
    res = Result()
    res.devices = [n for n, _, _ in found]
    work = hookmod.Work()
    done = []
    for _, spec, _ in found:
        if spec not in done:
            done.append(spec)
            if "containerEdits" in spec.doc:
                _add(res, spec.doc["containerEdits"], spec.path, work)
    for name, spec, dev in found:
        _add(res, dev["containerEdits"], f"{name} in {spec.path}", work)
    # Shallow paths first: a mount inside another lands on top of it.
    res.edits.mounts.sort(key=lambda m: len([p for p in m.path.split("/") if p]))
    if rootfd is not None:
        hookmod.finish(work, res.edits, rootfd)
    res.warnings += work.warnings
    return res
