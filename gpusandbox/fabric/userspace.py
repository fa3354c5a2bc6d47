"""The host's user space in a sandbox: `--fabric-libs host` (rdma-core,
verbs.py) and `--mpi host` (mpi.py) as one set of libraries, one dependency
closure and one loader cache (hostlibs.py).

Some of those libraries load plugins by path, which the closure cannot see:
UCX opens its transports (libuct_ib, libuct_rdmacm, libuct_cma) from the
`ucx` directory beside libucs, libfabric its DSO providers from the
directory compiled into it, libibverbs its providers likewise.  When the
host's copy of one of them is injected, its plugin directory comes with it
(UCX's next to the injected libucs, the others at the host's path), and
their own dependencies join the closure: an MPI over UCX reaches the HCAs
with the host's transports.  A host libibverbs pulled in that way brings
its providers and driver list, as --fabric-libs host would."""
import os

from gpusandbox.edits import Mount
from gpusandbox.gpu.inject import image_cache

from . import elf, hostlibs, mpi, verbs
from .hostlibs import PRIVATE_LIB, RO


def _plugins(plan, inj, done):
    """Mount the plugin directories of the injected libraries not yet
    handled; return their plugin files' host paths."""
    more = []
    names = dict(inj.libs)
    if "libucs.so.0" in names and "ucx" not in done:
        done.add("ucx")
        d = os.path.join(os.path.dirname(os.path.realpath(names["libucs.so.0"])), "ucx")
        if os.path.isdir(d):
            plan.edits.mounts.append(Mount(d, f"{PRIVATE_LIB}/ucx", RO))
            more += [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".so.0")]
    if "libfabric.so.1" in names and "libfabric" not in done:
        done.add("libfabric")
        d = os.path.join(os.path.dirname(os.path.realpath(names["libfabric.so.1"])), "libfabric")
        if os.path.isdir(d):
            plan.edits.mounts.append(Mount(d, d, RO))
            more += [os.path.join(d, n) for n in sorted(os.listdir(d)) if n.endswith(".so")]
    return [p for p in more if elf.read(p) is not None]


def plan_userspace(plan, rootfd, want_verbs, want_mpi, caller_env):
    host = hostlibs.host_cache()
    image_list = image_cache(rootfd)
    image = hostlibs.native(image_list)
    inj = hostlibs.Injection()
    more, done = [], set()
    what = "--mpi host" if want_mpi else "--fabric-libs host"
    if want_mpi:
        mpi.add_mpi(plan, rootfd, inj, host, image, caller_env)
    if want_verbs:
        more += verbs.add_verbs(plan, inj, host)
        done.add("verbs")
    # Plugins can pull in libraries with plugins of their own (UCX's IB
    # transport needs libibverbs, whose providers are plugins): to a fixpoint.
    while True:
        hostlibs.close_over(inj, host, set(image), what, more=more)
        new = _plugins(plan, inj, done)
        if "libibverbs.so.1" in dict(inj.libs) and "verbs" not in done:
            done.add("verbs")
            new += verbs.add_verbs(plan, inj, host)
        if not new:
            break
        more += new
    hostlibs.check_glibc(inj, rootfd, image, what)
    hostlibs.apply(plan, rootfd, inj, image_list)
