"""Driver library lookup: the loader cache first, then the driver's library
directories by path.

Some driver files are never in ld.so.cache: libvdpau_nvidia lives in the
libvdpau plugin directory (<libdir>/vdpau/), which no ld.so.conf names, and a
driver root may carry no cache at all or a stale one (a driver container's
tree, a root unpacked without running ldconfig).  The reference stack looks
these up by path in the directory that holds the driver's libcuda/libnvidia-ml
(or, when the cache lists none, in the distribution's standard library
directories) and its vdpau/ subdirectory; so does find().

Every file, from the cache or from a directory listing, passes the same
checks: its path is resolved inside the driver root (openat2
RESOLVE_IN_ROOT, so no symlink leads out of it), it is a regular file, and
its real name is "<driver family>.so.<driver version>".  A file found by path
also has its ELF header read, for the ABI the cache would have recorded.
"""
import os
import stat

from gpusandbox.errors import GpuError
from gpusandbox.gpu import ldcache
from gpusandbox.linux import sys as lsys

# Library directories a driver installs into, per machine: (64-bit, 32-bit).
_STD_DIRS = {
    "x86_64": (("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu", "usr/lib64", "lib64"),
               ("usr/lib/i386-linux-gnu", "lib/i386-linux-gnu", "usr/lib32", "usr/lib")),
    "aarch64": (("usr/lib/aarch64-linux-gnu", "lib/aarch64-linux-gnu", "usr/lib64", "lib64"), ()),
}
# Plugin subdirectories of a library directory: family -> subdirectory.  The
# library keeps the subdirectory inside the sandbox (libvdpau loads
# <libdir>/vdpau/libvdpau_<driver>.so.1 by path).
SUBDIRS = {"libvdpau_nvidia": "vdpau"}
# ELF e_machine and class -> the ld.so.cache flags ldconfig records for it.
_ELF_FLAGS = {(62, 2): 0x0303, (3, 1): 0x0003, (183, 2): 0x0A03}


class Library:
    """family ("libcuda"), name ("libcuda.so.550.54.15"), host_path (real
    file), flags (ld.so.cache ABI flags), bits (64, or 32 for compat32),
    soname (from the cache key; None: read the ELF when needed), subdir (""
    or the plugin directory below the library directory, e.g. "vdpau"),
    cached (whether ld.so.cache listed it)."""
    __slots__ = ("family", "name", "host_path", "flags", "bits", "soname", "subdir", "cached")

    def __init__(self, family, name, host_path, flags, bits, soname=None, subdir="",
                 cached=True):
        self.family, self.name, self.host_path = family, name, host_path
        self.flags, self.bits, self.soname = flags, bits, soname
        self.subdir, self.cached = subdir, cached

    def __repr__(self):
        return f"Library({self.host_path} {self.bits}-bit)"


def _from_cache(host, resolve, families):
    """Libraries the driver root's ld.so.cache lists; [] when it has none."""
    cpath = host.path("/etc/ld.so.cache")
    try:
        data = lsys.read_file(cpath)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise GpuError("driver libraries", f"cannot read {cpath}: {os.strerror(e.errno)}",
                       hint="run ldconfig in the driver root") from None
    try:
        base, end, table, nlibs = ldcache.entry_table(data)
    except ldcache.CacheError as e:
        raise GpuError("driver libraries", f"{cpath}: {e}",
                       hint="run ldconfig in the driver root to rebuild it") from None
    suffix = ".so." + host.version
    seen, libs = {}, []
    abi_bits = ldcache.abi_bits
    for flags, key, value, _osv, hwcap in _candidates(data, base, end, table, nlibs, families):
        bits = abi_bits(flags)
        if hwcap or bits is None:
            continue
        stop = data.find(b"\0", base + key, end)
        name = data[base + key:stop]
        dot = name.find(b".so")
        if dot < 0 or name[:dot] not in families:
            continue
        path = ldcache._cstr(data, value, base, end)
        real = resolve(os.fsdecode(path))
        if real is None or not real.endswith(suffix):
            continue
        # ldconfig keys a library by its SONAME link, and also by a
        # development link (libcuda.so) when one exists: the key that is not
        # a bare "<name>.so" is the SONAME, so no ELF file has to be read.
        soname = os.fsdecode(name) if not name.endswith(b".so") else None
        if real in seen:
            if soname and not seen[real].soname:
                seen[real].soname = soname
            continue
        fname = real.rsplit("/", 1)[1]
        family = fname[:fname.index(".so")]
        lib = seen[real] = Library(family, fname, real, flags, bits, soname,
                                   subdir=SUBDIRS.get(family, ""))
        libs.append(lib)
    return libs


def _candidates(data, base, end, table, nlibs, families):
    """The rows whose key may name a driver library: its string starts with
    the first five bytes of a family.  A host's cache lists a few thousand
    libraries and the driver a few dozen; the string table is searched for
    those prefixes (bytes.find, a handful of scans) instead of each row's key
    being read, and only the rows with one of those keys are unpacked
    (ldcache.rows_keyed).  Tail-merged strings (a key stored as the end of a
    path, as ldconfig may share them) are found too: any occurrence is
    checked against the rows' key offsets."""
    starts = set()
    for prefix in {f[:5] for f in families}:
        at = data.find(prefix, base)
        while 0 <= at < end:
            starts.add(at - base)
            at = data.find(prefix, at + 1)
    return ldcache.rows_keyed(data, table, nlibs, starts)


def _elf_flags(path):
    """The cache flags of the ELF object at `path`, or None (not ELF, another
    machine, unreadable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        head = os.pread(fd, 20, 0)
    finally:
        os.close(fd)
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[5] not in (1, 2):
        return None
    machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    return _ELF_FLAGS.get((machine, head[4]))


def _dirs(host, found):
    """Library directories to search, relative to the driver root: those the
    cache's driver libraries live in or, when the cache names none (no
    cache, a stale one), the distribution's standard ones.  Listing every
    standard directory on each launch would cost more than the lookup saves."""
    root = host.driver_root.rstrip("/")
    out = []
    for lib in found:
        rel = os.path.dirname(lib.host_path)[len(root):].strip("/")
        if rel and rel not in out:
            out.append(rel)
    if out:
        return out
    std64, std32 = _STD_DIRS.get(os.uname().machine, _STD_DIRS["x86_64"])
    return list(std64 + std32)


def _by_path(host, resolve, families, found):
    """Driver files the cache does not list, by their name in the library
    directories: <family>.so.<version> of each family, looked up by name
    (a distribution's library directory holds a few thousand files, which
    are not listed), in the order of their file names."""
    suffix = ".so." + host.version
    seen = {lib.host_path for lib in found}
    root = host.driver_root.rstrip("/")
    names = sorted((f.decode() for f in families), key=lambda f: f + suffix)  # file order
    out = []
    for d in _dirs(host, found):
        for sub in ("",) + tuple(sorted(set(SUBDIRS.values()))):
            rel_dir = f"{d}/{sub}" if sub else d
            if resolve(rel_dir, stat.S_ISDIR) is None:
                continue
            for family in names:
                if SUBDIRS.get(family, "") != sub:
                    continue
                fname = family + suffix
                if root + "/" + f"{rel_dir}/{fname}" in seen:
                    continue
                real = resolve(f"{rel_dir}/{fname}")
                if real is None or real in seen or not real.endswith(suffix) \
                        or not os.path.basename(real).startswith(family + ".so."):
                    continue
                flags = _elf_flags(real)
                bits = ldcache.abi_bits(flags) if flags is not None else None
                if bits is None:
                    continue
                seen.add(real)
                # No cache key to take the SONAME from: read it now (a few files).
                out.append(Library(family, os.path.basename(real), real, flags, bits,
                                   ldcache.elf_soname(real), subdir=sub, cached=False))
    return out


def find(host, resolve, families):
    """Every driver library of host.version under the driver root: the
    cache's entries, then files by path that the cache does not list.
    Raises GpuError only when there is none at all."""
    libs = _from_cache(host, resolve, families)
    libs += _by_path(host, resolve, families, libs)
    if not libs:
        suffix = ".so." + host.version
        raise GpuError("driver libraries",
                       f"no library ending in {suffix} in {host.path('/etc/ld.so.cache')} "
                       "or the driver's library directories",
                       hint="the user-space driver does not match the loaded kernel module "
                            f"{host.version}: reinstall the driver or reboot into it")
    return libs

