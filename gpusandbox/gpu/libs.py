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
import errno
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


class Resolver:
    """Real host path of a path inside the driver root, symlinks resolved as
    if the root were "/" (openat2 RESOLVE_IN_ROOT), so an absolute link in a
    containerised driver tree never escapes to the host's own files.

    A file is looked up by name in its directory, which is resolved once
    (in the root) and kept: a link whose target is a plain name of the same
    directory is followed there, lstat and readlink only; a target with a
    slash, "." or "..", or any other error, takes the full openat2 walk.
    Both give the same answer (a driver's directory holds a few dozen links
    of the form libcuda.so.1 -> libcuda.so.550.54.15)."""

    def __init__(self, root):
        self.root = root
        self.fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._dirs = {}      # relative directory -> (its fd, its real path) or None

    def close(self):
        for held in self._dirs.values():
            if held:
                os.close(held[0])
        os.close(self.fd)

    def __call__(self, rel, want=stat.S_ISREG):
        d, _, name = rel.strip("/").rpartition("/")
        if want is stat.S_ISREG and name not in ("", ".", ".."):
            real = self._in_dir(d, name)
            if real is not False:
                return real
        return self._walk(rel, want)

    def _in_dir(self, d, name):
        """The real path of regular file `name` in directory `d`, None when
        there is none, False when only the full walk can tell."""
        if d not in self._dirs:
            try:
                fd = lsys.openat2(self.fd, d or ".", lsys.O_PATH | os.O_DIRECTORY)
            except OSError:
                self._dirs[d] = None
            else:
                self._dirs[d] = (fd, os.readlink(f"/proc/self/fd/{fd}").rstrip("/"))
        held = self._dirs[d]
        if held is None:
            return False
        fd, real = held
        for _ in range(40):                           # the kernel's MAXSYMLINKS
            try:
                mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                if not stat.S_ISLNK(mode):
                    return f"{real}/{name}" if stat.S_ISREG(mode) else None
                name = os.readlink(name, dir_fd=fd)
            except FileNotFoundError:
                return None
            except OSError:
                return False
            if "/" in name or name in (".", ".."):
                return False
        return None                                  # a loop: ELOOP in the walk

    def _walk(self, rel, want):
        try:
            fd = lsys.openat2(self.fd, rel.lstrip("/") or ".", lsys.O_PATH)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES, errno.EXDEV):
                return None
            raise
        try:
            if not want(os.fstat(fd).st_mode):
                return None
            return os.readlink(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)


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

