"""CDI devices -> ContainerEdits, in the reference's order.

pkg/cdi (InjectDevices, ContainerEdits.Apply): for each device in the order
named, its spec's own edits (the first time that spec is met), then the
device's; env (a later key wins), device nodes and mounts (a later one at
the same container path replaces the earlier), hooks.  Mounts end sorted
by the depth of their container path, then the path, so a parent is
mounted before what goes inside it.  Host-side checks: every host path is absolute
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
    if not node["path"].startswith("/dev/"):
        # The sandbox's /dev is its own tmpfs; nodes go nowhere else.
        raise SandboxError(f"CDI device node {node['path']} ({where})",
                           "only paths under /dev are supported")
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
    if os.path.normpath(mnt["containerPath"]) == "/":
        raise SandboxError(f"CDI mount of {mnt['hostPath']} ({where})",
                           "a mount over the container's root is not supported")
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
        # A later node at the same path replaces the earlier one, as the
        # reference's RemoveDevice + AddDevice do (two names of one GPU give
        # its node once).
        res.edits.device_nodes = [n for n in res.edits.device_nodes if n.path != dn.path]
        res.edits.device_nodes.append(dn)
        if rule not in res.rules:
            res.rules.append(rule)
    for m in edits.get("mounts", ()):
        new = _mount(m, where)
        # Likewise a later mount at the same container path (RemoveMount).
        res.edits.mounts = [o for o in res.edits.mounts if o.path != new.path]
        res.edits.tmpfs = [o for o in res.edits.tmpfs if o.path != new.path]
        (res.edits.tmpfs if isinstance(new, Tmpfs) else res.edits.mounts).append(new)
    hookmod.collect(edits.get("hooks", ()), work)
    for key in ("additionalGids", "intelRdt", "netDevices"):
        if edits.get(key):
            res.warnings.append(f"warning: CDI {key} of {where} is not supported: ignored")


def _depth(path):
    return len([p for p in path.split("/") if p])


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
    for name, spec, dev in found:
        # A spec's own edits just before its first device's (InjectDevices).
        if spec not in done:
            done.append(spec)
            if "containerEdits" in spec.doc:
                _add(res, spec.doc["containerEdits"], spec.path, work)
        _add(res, dev["containerEdits"], f"{name} in {spec.path}", work)
    # Shallow paths first, so a mount inside another lands on top of it;
    # ties by path (the reference's orderedMounts).
    res.edits.mounts.sort(key=lambda m: (_depth(m.path), m.path))
    if rootfd is not None:
        hookmod.finish(work, res.edits, rootfd)
    res.warnings += work.warnings
    return res
