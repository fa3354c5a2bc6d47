"""Mount propagation of an OCI config: linux.rootfsPropagation and the
mounts' shared, slave, private and unbindable options with their r- forms
(mount_namespaces(7)), as (MS_* flag, recursive) pairs the init applies.

The init always starts by making its copy of the host's tree a slave of
it (rprivate for rootfsPropagation private), so nothing the container
mounts reaches the host whatever the config says; the container's root and
mounts then get the configured propagation inside the container: a shared
root lets a bind of / see later mounts (runtime-tools'
linux_rootfs_propagation), a bind mount made shared or slave keeps
receiving the host's mounts under its source (Kubernetes'
HostToContainer), and unbindable refuses binds of it.
"""
from ..linux import sys as k

_FLAGS = {"shared": k.MS_SHARED, "slave": k.MS_SLAVE, "private": k.MS_PRIVATE,
          "unbindable": k.MS_UNBINDABLE}
OPTIONS = {**{name: (flag, False) for name, flag in _FLAGS.items()},
           **{"r" + name: (flag, True) for name, flag in _FLAGS.items()}}


def of_options(opts):
    """(flag, recursive) of the last propagation option of a mount, or None."""
    out = None
    for o in opts:
        if o in OPTIONS:
            out = OPTIONS[o]
    return out

