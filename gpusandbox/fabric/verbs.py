"""`--fabric-libs host`: the host's rdma-core user space in the sandbox.

libibverbs loads its providers by path from the directory compiled into it
(<libdir>/libibverbs/lib<name>-rdmav<PABI>.so, as listed by
/etc/libibverbs.d/*.driver), and a provider works only with the
libibverbs it was built with (rdma-core Documentation/versioning.md): so
libibverbs, librdmacm, every provider and the driver list are the host's
together, never mixed with the image's.  The libraries go through the
loader cache (hostlibs.py); the providers and /etc/libibverbs.d are bound
at the host's own paths, which the host's libibverbs looks in."""
import os

from . import elf
from .hostlibs import RO, LibError

SONAMES = ("libibverbs.so.1", "librdmacm.so.1")
DRIVERS = "/etc/libibverbs.d"


def add_verbs(plan, inj, host):
    """Add the host's libibverbs, librdmacm and providers to `inj`, the
    providers' and driver list's mounts to plan.edits; return the providers'
    host files (for the dependency closure)."""
    from gpusandbox.edits import Mount
    if "libibverbs.so.1" not in host:
        raise LibError("--fabric-libs host", "the host's loader cache has no libibverbs.so.1",
                       "install rdma-core (libibverbs1, librdmacm1, ibverbs-providers) "
                       "on the host, or leave the image's own (--fabric-libs image)")
    for name in SONAMES:
        if name in host:
            inj.add(name, host[name])
    provdir = os.path.join(os.path.dirname(os.path.realpath(host["libibverbs.so.1"])),
                           "libibverbs")
    providers = []
    try:
        names = sorted(n for n in os.listdir(provdir) if n.endswith(".so"))
    except OSError:
        names = []
    for n in names:
        real = os.path.realpath(os.path.join(provdir, n))
        if os.path.isfile(real):
            plan.edits.mounts.append(Mount(real, f"{provdir}/{n}", RO))
            providers.append(real)
            # Programs that link a provider directly (UCX's mlx5 transport:
            # libmlx5.so.1) get this same file through the cache.
            d = elf.read(real)
            if d is not None and d.soname:
                inj.add(d.soname, real)
    if os.path.isdir(DRIVERS):
        plan.edits.mounts.append(Mount(DRIVERS, DRIVERS, RO))
    inj.notes.append(f"fabric-libs: the host's libibverbs, librdmacm and {len(providers)} "
                     f"provider(s) from {provdir}")
    return providers
