"""Seccomp: compile OCI/Docker-format JSON profiles to classic BPF and install them.

The launcher compiles once, before the first fork; the command process installs
the bytes as its last step before execve (after no_new_privs).

The compiler itself (profile semantics, program layout) is in seccompbpf,
loaded only when a program is compiled: this module finds profiles, keeps
compiled programs (shipped beside the profiles, and a per-user cache) and
installs them, so a launch whose program is shipped or cached loads neither
the compiler nor a checksum module.  Every name of seccompbpf is importable
from here as well (loaded on first use).
"""
import os
import _struct as struct   # what `struct` re-exports: one import less

from gpusandbox.errors import SeccompError
from gpusandbox.linux import sys as lsys
from gpusandbox.linux.sys import BPF_LD_W_ABS, BPF_MAXINSNS, SECCOMP_DATA_ARCH, read_file
from gpusandbox.linux.sys import SOCK_FILTER as _INSN

# The version of what seccompbpf writes, stamped on every program kept here
# (shipped and cached): bump it when the compiler's output changes.
COMPILER_VERSION = 1


def __getattr__(name):
    """seccompbpf's names (parse, assemble, the opcodes), loaded on first use."""
    if name.startswith("__"):
        raise AttributeError(name)
    from gpusandbox.linux import seccompbpf
    try:
        return getattr(seccompbpf, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def _sum(data):
    """A check of kept bytes against their source (not a defence: the files
    are trusted or the caller's own): the bytes as one little-endian number
    modulo the prime 2**61 - 1, a polynomial hash that int arithmetic
    computes in one pass without loading a checksum module."""
    return int.from_bytes(data, "little") % 0x1FFFFFFFFFFFFFFF


SHIPPED = ("default", "profiling")
_HERE = os.path.dirname(os.path.abspath(__file__))
_PROFILE_DIRS = (os.path.join(_HERE, "..", "profiles"),
                 os.path.join(_HERE, "..", "..", "seccomp"))


def host_arch():
    m = os.uname().machine
    return "aarch64" if m == "arm64" else m


def profile_path(name_or_path):
    """A shipped profile's file (looked up in the installed package, then the
    source tree) or the given path when it names a file."""
    s = os.fspath(name_or_path)
    if "/" in s or s.endswith(".json"):
        return s
    for d in _PROFILE_DIRS:
        p = os.path.normpath(os.path.join(d, s + ".json"))
        if os.path.isfile(p):
            return p
    raise SeccompError(f"unknown seccomp profile '{s}'", None,
                       f"use one of {', '.join(SHIPPED)} or the path of a JSON profile")


def _read(path):
    try:
        return read_file(path)
    except OSError as e:
        raise SeccompError(f"cannot read seccomp profile {path}", e.strerror,
                           "check the path given to --seccomp") from None


def compile_profile(name_or_path, arch=None, cache=True):
    """Compile a profile to the bytes of a struct sock_filter[] for `arch`
    (default: this machine).

    Parsing needs json, whose import (with re and enum) costs several times
    the compile itself, so the result is cached per user; an entry is used
    only when it holds exactly these profile bytes for this architecture,
    compiler version and kernel release."""
    arch = arch or host_arch()
    path = profile_path(name_or_path)
    data = _read(path)
    prog = _shipped(path, data, arch) if cache else None
    if prog is not None:
        return prog
    entry = _cache_entry(path, arch) if cache else None
    prog = _cache_load(entry, data, arch) if entry else None
    if prog is None:
        prog = compile_bytes(data, arch, path)
        if entry:
            _cache_store(entry, data, arch, prog)
    return prog


def compile_document(doc, data, where, arch=None, skip_unknown=False):
    """Compile a profile already parsed (an OCI config's linux.seccomp, as
    `create` gets it once per container), `data` its JSON text: through the
    same per-user cache, one entry per `where` and skip_unknown (parse),
    compared byte for byte with `data`; the parse and its syscall table are
    only paid on a miss."""
    arch = arch or host_arch()
    entry = _cache_entry(f"/{where}", arch, "doc-skip-" if skip_unknown else "doc-")
    prog = _cache_load(entry, data, arch) if entry else None
    if prog is None:
        from gpusandbox.linux.seccompbpf import assemble, parse
        prog = assemble(parse(doc, arch, where, skip_unknown), arch)
        if entry:
            _cache_store(entry, data, arch, prog)
    return prog


# --- programs shipped next to the profiles ----------------------------------------
# The shipped profiles are compiled once, when they change, into
# seccomp/<name>.<arch>.bpf (python -m gpusandbox.linux.seccomp --precompile),
# so a launch by a user without a writable cache (a system account, a batch
# user without a home) still pays neither json nor the compiler.  A unit test
# fails when a .bpf no longer matches its profile.  They sit in the package's
# own (root-owned) directory, trusted like the code that reads them.
_SHIPPED_MAGIC = b"GSBXBPF2"


def _shipped_blob(data, arch, prog):
    head = (f"{arch} {COMPILER_VERSION} {len(data)} {_sum(data)} "
            f"{len(prog)} {_sum(prog)}").encode()
    return _SHIPPED_MAGIC + struct.pack("<H", len(head)) + head + prog


def _shipped(path, data, arch):
    """The precompiled program for a shipped profile whose bytes match, or None.
    Profiles using minKernel depend on the running kernel: never precompiled."""
    if b"minKernel" in data:
        return None
    try:
        blob = read_file(f"{path[:-5]}.{arch}.bpf")
    except OSError:
        return None
    if not blob.startswith(_SHIPPED_MAGIC) or len(blob) < 10:
        return None
    n = struct.unpack_from("<H", blob, 8)[0]
    prog = blob[10 + n:]
    if blob != _shipped_blob(data, arch, prog) or not prog or len(prog) % _INSN.size:
        return None
    return prog


def precompile(dirs=None):
    """Write <profile>.<arch>.bpf for every shipped profile and architecture."""
    written = []
    for name in SHIPPED:
        path = profile_path(name)
        data = _read(path)
        for arch in ("x86_64", "aarch64"):
            out = f"{path[:-5]}.{arch}.bpf"
            with open(out, "wb") as f:
                f.write(_shipped_blob(data, arch, compile_bytes(data, arch, path)))
            written.append(out)
    return written


def compile_bytes(data, arch, where="<profile>"):
    """Compile the JSON text of a profile (no cache)."""
    import json

    from gpusandbox.linux.seccompbpf import assemble, parse
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise SeccompError(f"seccomp profile {where} is not valid JSON", str(e),
                           "fix the JSON syntax at the position shown") from None
    return assemble(parse(doc, arch, where), arch)


# --- cache ------------------------------------------------------------------------
#
# One file per (profile path, architecture): a fixed header, a context line,
# the profile's bytes and the program.  Nothing in it is trusted unless every
# length adds up, the context and profile bytes are identical to the current
# ones and the program's CRC matches; anything else means "compile again".

_MAGIC = b"GSBPF\x00\x02\x00"
_HDR = struct.Struct("<8sIIIQ")     # magic, context len, profile len, prog len, _sum(prog)


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):           # the XDG spec says to ignore relative paths
        base = os.path.join(_home(), ".cache")
    return os.path.join(base, "gpusandbox", "seccomp")


def _home():
    """$HOME when it is the caller's own, else the passwd entry's: a HOME
    inherited across su/setpriv/sudo names another user's directory, where
    the cache could neither be written nor trusted."""
    home = os.environ.get("HOME", "")
    try:
        if os.path.isabs(home) and os.stat(home).st_uid == os.geteuid():
            return home
    except OSError:
        pass
    import pwd
    try:
        return pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        return home or "/"


def _private_dir(d):
    """Create d (0700) and accept it only if we own it and nobody else can
    write to it: a planted entry would be installed as our filter."""
    try:
        os.makedirs(os.path.dirname(d), 0o700, exist_ok=True)
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        st = os.stat(d)
    except OSError:
        return False
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _context(arch):
    return f"{arch} {COMPILER_VERSION} {os.uname().release}".encode()


def _cache_entry(path, arch, prefix=""):
    d = cache_dir()
    if not _private_dir(d):
        return None
    tag = _sum(os.fsencode(os.path.abspath(path))) & 0xFFFFFFFF
    return os.path.join(d, f"{prefix}{tag:08x}-{arch}.bpf")


def _cache_load(entry, data, arch):
    try:
        with open(entry, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_size > 1 << 22:
                return None
            blob = f.read()
    except OSError:
        return None
    if len(blob) < _HDR.size:
        return None
    magic, nctx, ndata, nprog, crc = _HDR.unpack_from(blob)
    ctx = _context(arch)
    a, b = _HDR.size, _HDR.size + nctx
    c, end = b + ndata, b + ndata + nprog
    if (magic != _MAGIC or end != len(blob) or blob[a:b] != ctx or blob[b:c] != data
            or not nprog or nprog % _INSN.size or nprog > BPF_MAXINSNS * _INSN.size):
        return None
    prog = blob[c:end]
    first = _INSN.pack(BPF_LD_W_ABS, 0, 0, SECCOMP_DATA_ARCH)     # loads seccomp_data.arch
    if _sum(prog) != crc or prog[:_INSN.size] != first:
        return None
    return prog


def _cache_store(entry, data, arch, prog):
    """Write atomically (a private temporary file renamed over the entry);
    a failure only costs the next launch a compile."""
    from . import fsutil
    ctx = _context(arch)
    blob = _HDR.pack(_MAGIC, len(ctx), len(data), len(prog), _sum(prog)) + ctx + data + prog
    fsutil.write_atomic(entry, blob, 0o600, best_effort=True)


# --- install -----------------------------------------------------------------------

SECCOMP_SET_MODE_FILTER = 1


class _SockFprog(lsys.Structure):
    """struct sock_fprog (linux/filter.h).  Made here, in the launcher: the
    command stage, a fork, only fills one in."""
    _fields_ = [("len", lsys.c_ushort), ("filter", lsys.c_void_p)]


_READY = {}


def ready(prog):
    """The sock_fprog of a compiled program (and the buffer it points to,
    kept with it), made once per program: the launcher asks for it before
    the clone (stages/parent.spawn_init), so the command stage, a fork of a
    fork, only passes it to the kernel."""
    got = _READY.get(prog)
    if got is None:
        n = len(prog) // _INSN.size
        if not prog or len(prog) % _INSN.size or n > BPF_MAXINSNS:
            raise ValueError(f"not a compiled seccomp program ({len(prog)} bytes)")
        buf = lsys.create_string_buffer(bytes(prog), len(prog))
        got = _READY[prog] = (_SockFprog(n, lsys.addressof(buf)), buf)
    return got[0]


def install(prog, flags=0):
    """Install a compiled program on the calling thread (and its future
    children).  The caller must have set no_new_privs (or hold CAP_SYS_ADMIN).
    `flags` are SECCOMP_FILTER_FLAG_* bits; none are needed for the
    single-threaded command process (TSYNC only matters with threads)."""
    fprog = ready(prog)
    try:
        lsys.syscall("seccomp", lsys.c_uint(SECCOMP_SET_MODE_FILTER),
                     lsys.c_uint(flags), lsys.byref(fprog))
    except OSError as e:
        why = {13: "no_new_privs is not set and CAP_SYS_ADMIN is missing",
               22: "the kernel rejected the program or flags",
               38: "the kernel lacks seccomp filter support"}.get(e.errno, os.strerror(e.errno))
        raise OSError(e.errno, f"installing the seccomp filter failed: {why}") from None


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--precompile"]:
        for p in precompile():
            print(p)
    else:
        sys.exit("usage: python -m gpusandbox.linux.seccomp --precompile")
