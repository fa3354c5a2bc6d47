"""Host libraries given to a sandbox by SONAME: the host's rdma-core
(--fabric-libs host) and the host's MPI (--mpi host, mpi.py).

Each library is the host's real file, bound read-only into a directory on
the sandbox's own /run tmpfs (the image is never changed), named by the
SONAME the image's programs ask for, and listed in the sandbox's
regenerated ld.so.cache ahead of the image's own entry for that name: the
same loader-cache mechanism as the GPU driver's libraries (gpu/inject.py),
merged with its cache when a launch has both.

The dependency closure is resolved here, as the loader will: a DT_NEEDED
name the image's cache has is the image's (its own libc, libstdc++ ...);
one it lacks is the host's copy, injected the same way and followed in
turn; one neither has refuses the launch.  glibc itself always stays the
image's, and must define every GLIBC_x.y version the injected files
require (checked from the ELF files: the one-line refusal names both)."""
import os

from gpusandbox.edits import File, Mount, Symlink
from gpusandbox.errors import SandboxError
from gpusandbox.gpu import ldcache
from gpusandbox.linux import sys as lsys

from . import elf

PRIVATE_LIB = "/run/gpusandbox/fabric/lib"
RO = ("ro", "nosuid", "nodev")
HOST_CACHE = "/etc/ld.so.cache"
# The C library's own objects: the image's, always (a host libc under an
# image's loader breaks every process).
GLIBC = ("libc.so.", "libm.so.", "libpthread.so.", "libdl.so.", "librt.so.", "ld-linux",
         "libresolv.so.", "libutil.so.", "libanl.so.", "libmvec.so.")


class LibError(SandboxError):
    """A host library cannot be given to this image."""


def native(entries):
    out = {}
    for e in entries:
        if e.flags == ldcache.NATIVE_FLAGS and not e.hwcaps:
            out.setdefault(os.fsdecode(e.name), os.fsdecode(e.path))
    return out


def host_cache(path=HOST_CACHE):
    """SONAME -> host path of the host's native libraries."""
    try:
        with open(path, "rb") as f:
            return native(ldcache.parse(f.read(ldcache.MAX_FILE)))
    except (OSError, ldcache.CacheError, ValueError):
        return {}


    try:
        return ldcache.parse(data)
    except (ldcache.CacheError, ValueError):
        return []


def real_name_in_root(rootfd, path):
    """The real file name (symlinks resolved inside the image) of an image
    path, or None."""
    tfd, owned = lsys.tree_fd(rootfd)
    try:
        fd = lsys.openat2(tfd, path.lstrip("/"), lsys.O_PATH)
    except OSError:
        return None
    finally:
        if owned:
            os.close(tfd)
    try:
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
    finally:
        os.close(fd)


def _glibc(name):
    return name.startswith(GLIBC)


class Injection:
    """What to give: libs [(name in the sandbox, host path)], in order;
    notes [str]."""
    __slots__ = ("libs", "notes", "_names")

    def __init__(self):
        self.libs, self.notes, self._names = [], [], set()

    def add(self, name, host_path):
        if name not in self._names:
            self._names.add(name)
            self.libs.append((name, host_path))


def close_over(inj, host, image_names, what, more=()):
    """Add to `inj` the host copies of the dependencies the image lacks,
    following each (from inj.libs and the host files `more` bound by path);
    raise LibError for one neither side has."""
    seen = set()
    todo = [hp for _, hp in inj.libs] + list(more)
    # Plugins find their siblings through their RUNPATH ($ORIGIN): UCX's
    # libuct_rdmacm needs libuct_ib beside it, not in any cache.
    beside = {os.path.basename(p) for p in more}
    beside |= {n for n in (getattr(elf.read(p), "soname", None) for p in more) if n}
    while todo:
        path = todo.pop(0)
        if path in seen:
            continue
        seen.add(path)
        d = elf.read(path)
        if d is None:
            raise LibError(f"{what}: {path}", "not a readable 64-bit ELF shared object")
        for dep in d.needed:
            if _glibc(dep) or dep in inj._names or dep in image_names or dep in beside:
                continue
            hp = host.get(dep)
            if hp is None:
                raise LibError(f"{what}: {os.path.basename(path)} needs {dep}",
                               "neither the image nor the host's loader cache has it",
                               "install it in the image, or on the host and run ldconfig")
            inj.add(dep, hp)
            inj.notes.append(f"{what}: {dep} is the host's ({hp}): the image has none")
            todo.append(hp)


def check_glibc(inj, rootfd, image, what):
    """Refuse when the image's libc lacks a GLIBC_ version the injected files need."""
    need = {}
    for _, hp in inj.libs:
        d = elf.read(hp)
        for lib, versions in (d.requires if d else {}).items():
            for v in versions:
                if v.startswith("GLIBC_") and elf.version_key(v):
                    need.setdefault(v, os.path.basename(hp))
    if not need:
        return
    libc = image.get("libc.so.6")
    data = lsys.read_in_root(rootfd, libc, limit=64 << 20) if libc else None
    d = elf.read_bytes(data) if data else None
    if d is None:
        inj.notes.append(f"{what}: the image's libc.so.6 could not be read: glibc not checked")
        return
    have = max((elf.version_key(v) for v in d.defines if v.startswith("GLIBC_")), default=())
    top = max(need, key=elf.version_key)
    if elf.version_key(top) > have:
        raise LibError(f"{what}: the host's {need[top]} needs {top}",
                       f"the image's glibc is {'.'.join(map(str, have)) or 'unknown'}",
                       "use an image with a newer glibc, or leave the image's own libraries")


def apply(plan, rootfd, inj, image_list):
    """Bind the libraries into PRIVATE_LIB, link their names, and merge
    their entries into the sandbox's loader cache (the GPU injection's when
    it wrote one, else the image's)."""
    e = plan.edits
    entries, bound = [], {}
    for name, hp in inj.libs:
        real = os.path.realpath(hp)
        base = os.path.basename(real)
        if base not in bound:
            e.mounts.append(Mount(real, f"{PRIVATE_LIB}/{base}", RO))
            bound[base] = real
        if name != base:
            e.symlinks.append(Symlink(f"{PRIVATE_LIB}/{name}", base))
        entries.append(ldcache.Entry(os.fsencode(name), os.fsencode(f"{PRIVATE_LIB}/{name}")))
    cur = next((f for f in e.files if f.path == "/etc/ld.so.cache"), None)
    base_entries = ldcache.parse(cur.content) if cur is not None else image_list
    ours = {(x.name, x.flags) for x in entries}
    merged = [x for x in base_entries if (x.name, x.flags) not in ours] + entries
    new = File("/etc/ld.so.cache", ldcache.build(merged), 0o444)
    if cur is not None:
        e.files[e.files.index(cur)] = new
    else:
        e.files.append(new)
    plan.notes.extend(inj.notes)
