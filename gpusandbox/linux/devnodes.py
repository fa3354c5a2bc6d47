"""Device nodes made outside a user namespace for a container inside one:
where nothing in the container holds CAP_MKNOD (an OCI config's
linux.devices, a user namespace of its own, `create` as real root)."""
import os

from . import mounts as m
from .host import map_id
from . import sys as k


def premake_devices(nodes, idmaps):
    """For a container with a user namespace of its own, where nothing holds
    CAP_MKNOD: `create` (real root in the host's namespace) makes each node
    in a private detached tmpfs (no nodev), owned by the host ids its
    container ids map to, and hands the init a detached clone of each to
    attach at its path.  Returns [(path, mount fd)]."""
    def host_id(rows, cid, what, path):
        out = map_id(cid, rows)
        if out is None:
            raise OSError(22, f"linux.devices {path}: {what} {cid} is not mapped in the user namespace")
        return out
    stage = m.new_fs("tmpfs", ("mode=0700",), k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NOEXEC)
    out = []
    try:
        for i, (path, kind, major, minor, mode, uid, gid) in enumerate(nodes):
            name = f"n{i}"
            os.mknod(name, kind | 0o600, os.makedev(major, minor), dir_fd=stage)
            os.chown(name, host_id(idmaps[0], uid, "uid", path),
                     host_id(idmaps[1], gid, "gid", path), dir_fd=stage, follow_symlinks=False)
            os.chmod(name, mode, dir_fd=stage)
            out.append((path, m.clone_tree(name, recursive=False, dirfd=stage)))
    except BaseException:
        for _, fd in out:
            os.close(fd)
        raise
    finally:
        os.close(stage)
    return out
