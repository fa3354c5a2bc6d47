"""An OCI config's mounts read as data into the plan's one mount type
(edits.MountOp), in the config's order: binds of the bundle's paths and
fresh filesystems, and a "sysfs" op where the config lists /sys among its
own (the init's /sys goes there).  The mounts the init makes itself
(SYSTEM_MOUNTS) are left out; what gpusandbox cannot honour is refused with
one line naming the entry."""
import os
import stat

from ..imageroot import container_path
from ..edits import MountOp
from .configfield import _bad, _get, _strs
from . import propagation

# Mounts the init makes itself, with the same filesystem, at these places.
SYSTEM_MOUNTS = {("/proc", "proc"), ("/sys", "sysfs"), ("/sys", "bind"), ("/dev", "tmpfs"),
                 ("/dev/pts", "devpts"), ("/sys/fs/cgroup", "cgroup"),
                 ("/sys/fs/cgroup", "cgroup2")}
FS_TYPES = ("tmpfs", "mqueue", "devpts", "proc", "sysfs")
FLAG_OPTS = {"ro", "rw", "nosuid", "suid", "nodev", "dev", "noexec", "exec", "bind", "rbind",
             *propagation.OPTIONS, "relatime", "norelatime", "strictatime",
             "nostrictatime", "noatime", "atime", "nodiratime", "diratime", "sync", "async",
             "tmpcopyup", "mand", "nomand", "silent", "loud", "defaults", "norbind", "noiversion"}
REFUSED_OPTS = {"remount", "dirsync", "idmap", "ridmap"}


def _mount(i, ent, bundle):
    where = f"mounts[{i}]"
    if not isinstance(ent, dict):
        raise _bad(where, "not an object")
    dst = _get(ent, "destination", str, where)
    if not dst or not dst.startswith("/") or "\0" in dst:
        raise _bad(where, "destination must be an absolute path")
    dst = container_path(dst)
    typ = _get(ent, "type", str, where) or ""
    opts = _strs(_get(ent, "options", list, where, []), where + ".options")
    if (dst, typ) in SYSTEM_MOUNTS or (dst == "/dev/pts" and typ == "devpts"):
        return None
    bind = typ in ("bind", "none", "") or "bind" in opts or "rbind" in opts
    for o in opts:
        if o in REFUSED_OPTS:
            raise _bad(where, f"option {o} on {dst} is not supported",
                       "drop it: gpusandbox does not remount or id-map a container's mounts")
    flags = {"ro": "ro" in opts, "nosuid": "nosuid" in opts, "nodev": "nodev" in opts,
             "noexec": "noexec" in opts, "propagation": propagation.of_options(opts)}
    if bind:
        src = _get(ent, "source", str, where)
        if not src or "\0" in src:
            raise _bad(where, "a bind mount needs a source")
        src = os.path.join(bundle, src)
        try:
            st = os.stat(src)
        except OSError as e:
            raise _bad(where, f"bind source {src}: {e.strerror}") from None
        return MountOp("bind", dst, "dir" if stat.S_ISDIR(st.st_mode) else "file", source=src,
                       recursive="rbind" in opts, reclone=True, **flags)
    if typ not in FS_TYPES:
        raise _bad(where, f"filesystem type {typ!r} at {dst} is not supported",
                   f"use a bind mount or one of {', '.join(FS_TYPES)}")
    if typ in ("proc", "sysfs"):
        raise _bad(where, f"{typ} at {dst} is not supported",
                   "the container gets its own /proc and /sys")
    src = _get(ent, "source", str, where) or typ
    return MountOp("fs", dst, fstype=typ,
                   data=(f"source={src}",) + tuple(o for o in opts if o not in FLAG_OPTS),
                   **flags)


def mounts(conf, bundle):
    """The config's mounts as ops, a "sysfs" op where it lists /sys, unless
    one of its own goes under /sys before that (then /sys is mounted first,
    with the other system mounts)."""
    ops, sys_at = [], None
    for i, e in enumerate(_get(conf, "mounts", list, "mounts", [])):
        op = _mount(i, e, bundle)
        if op is not None:
            ops.append(op)
        elif sys_at is None and isinstance(e, dict) and e.get("destination") == "/sys":
            sys_at = len(ops)
    if sys_at is not None and not any(op.path.startswith("/sys/") for op in ops[:sys_at]):
        ops.insert(sys_at, MountOp("sysfs", "/sys"))
    return ops

