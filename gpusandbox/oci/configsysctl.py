"""linux.sysctl: which keys a container may set, by the namespaces it has
(runc's and crun's rule)."""
from ..errors import UsageError


def _bad(where, why, hint=None):
    return UsageError(f"OCI config {where}", why, hint)


IPC_SYSCTLS = {"kernel.msgmax", "kernel.msgmnb", "kernel.msgmni", "kernel.sem",
               "kernel.shmall", "kernel.shmmax", "kernel.shmmni", "kernel.shm_rmid_forced"}


def sysctl_namespaced(key, val, flags, join, domainname, ns_flags):
    """A sysctl is written only where it belongs to a namespace of the
    container's own (runc's and crun's rule): anything else would change the
    host for every process on it."""
    joined = {t for t, _ in join}
    where = "linux.sysctl"
    if key in IPC_SYSCTLS or key.startswith("fs.mqueue."):
        if not flags & ns_flags["ipc"] and "ipc" not in joined:
            raise _bad(where, f"{key} needs the container's own ipc namespace")
    elif key.startswith("net."):
        if not flags & ns_flags["network"] and "network" not in joined:
            raise _bad(where, f"{key} needs the container's own network namespace")
    elif key == "kernel.domainname":
        if not flags & ns_flags["uts"] and "uts" not in joined:
            raise _bad(where, f"{key} needs the container's own uts namespace")
        if domainname and domainname != val:
            raise _bad(where, f"{key} {val!r} conflicts with domainname {domainname!r}")
    elif key == "kernel.hostname":
        raise _bad(where, f"{key}: set the config's hostname instead")
    else:
        raise _bad(where, f"{key} is not in a namespace of the container's own",
                   "only ipc (kernel.msg*, kernel.sem, kernel.shm*, fs.mqueue.*), "
                   "network (net.*) and kernel.domainname sysctls can be set")
