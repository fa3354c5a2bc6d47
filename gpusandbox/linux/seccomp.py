"""Seccomp: compile OCI/Docker-format JSON profiles to classic BPF and install them.

The launcher compiles once, before the first fork; the command process installs
the bytes as its last step before execve (after no_new_privs).

Program layout (one native architecture per program):
  1. seccomp_data.arch must be the target's AUDIT_ARCH, else KILL_PROCESS.  A
     64-bit process can still enter the kernel through the 32-bit ABI (int 0x80
     on x86_64, AArch32 on arm64) where numbers mean other calls, so every
     number-based rule below would be meaningless there.
  2. x86_64: numbers with __X32_SYSCALL_BIT reach the x32 ABI under the same
     AUDIT_ARCH; they are killed as well.  No GPU program uses either ABI (CUDA
     is 64-bit only), and SIGSYS makes an attempt visible where a quiet errno
     would let an exploit probe.
  3. A balanced jump tree over ranges of syscall numbers that share a verdict:
     about log2(ranges) compares per syscall instead of a linear scan.
  4. The verdict: a return, or the argument checks of the profile's entries for
     that syscall, tried in file order; the first that matches decides, and
     none matching gives the default action.

Profile semantics: defaultAction/defaultErrnoRet, architectures (or Docker's
archMap), syscalls[] with names, action, errnoRet, args (ANDed), includes /
excludes by arches, caps and minKernel.  A name the target architecture does
not have is skipped (profiles list every architecture's calls), except that
a name known to no architecture is an error when the default action allows,
since a misspelt deny rule would then silently allow.  Entries that require
capabilities (includes.caps) are skipped: the command runs without them.
"""
import os
import struct

from gpusandbox.errors import SeccompError
from gpusandbox.linux.sys import read_file

COMPILER_VERSION = 1
BPF_MAXINSNS = 4096

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SCMP_ARCH = {"SCMP_ARCH_X86_64": "x86_64", "SCMP_ARCH_AARCH64": "aarch64"}
X32_SYSCALL_BIT = 0x40000000

RET_KILL_PROCESS = 0x80000000
RET_KILL_THREAD = 0x00000000
RET_TRAP = 0x00030000
RET_ERRNO = 0x00050000
RET_LOG = 0x7FFC0000
RET_ALLOW = 0x7FFF0000
_ACTIONS = {"SCMP_ACT_ALLOW": RET_ALLOW, "SCMP_ACT_KILL": RET_KILL_THREAD,
            "SCMP_ACT_KILL_THREAD": RET_KILL_THREAD,
            "SCMP_ACT_KILL_PROCESS": RET_KILL_PROCESS, "SCMP_ACT_TRAP": RET_TRAP,
            "SCMP_ACT_LOG": RET_LOG, "SCMP_ACT_ERRNO": RET_ERRNO}
_OPS = ("SCMP_CMP_EQ", "SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_GT",
        "SCMP_CMP_GE", "SCMP_CMP_MASKED_EQ")
EPERM, MAX_ERRNO = 1, 4095

# Classic BPF opcodes (linux/bpf_common.h) the kernel's seccomp checker accepts.
LD_W_ABS = 0x20
ALU_AND_K = 0x54
JA, JEQ, JGT, JGE = 0x05, 0x15, 0x25, 0x35
RET_K = 0x06
_INSN = struct.Struct("<HBBI")   # struct sock_filter; both supported ABIs are little-endian
OFF_NR, OFF_ARCH, OFF_ARGS = 0, 4, 16

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


# --- programs shipped next to the profiles ----------------------------------------
# The shipped profiles are compiled once, when they change, into
# seccomp/<name>.<arch>.bpf (python -m gpusandbox.linux.seccomp --precompile),
# so a launch by a user without a writable cache (a system account, a batch
# user without a home) still pays neither json nor the compiler.  A unit test
# fails when a .bpf no longer matches its profile.  They sit in the package's
# own (root-owned) directory, trusted like the code that reads them.
_SHIPPED_MAGIC = b"GSBXBPF1"


def _shipped_blob(data, arch, prog):
    import zlib
    head = (f"{arch} {COMPILER_VERSION} {len(data)} {zlib.crc32(data)} "
            f"{zlib.crc32(prog)}").encode()
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
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise SeccompError(f"seccomp profile {where} is not valid JSON", str(e),
                           "fix the JSON syntax at the position shown") from None
    return assemble(parse(doc, arch, where), arch)


# --- profile -> per-syscall rules --------------------------------------------

def _fail(where, what, why, hint="see the OCI runtime spec (config-linux, seccomp) for the format"):
    raise SeccompError(f"seccomp profile {where}: {what}", why, hint)


def _ret(action, errno_ret, where, what):
    if action not in _ACTIONS:
        _fail(where, what, f"unsupported action {action!r}",
              f"use one of {', '.join(sorted(_ACTIONS))}")
    if action != "SCMP_ACT_ERRNO":
        return _ACTIONS[action]
    e = EPERM if errno_ret is None else errno_ret
    if type(e) is not int or not 0 <= e <= MAX_ERRNO:
        _fail(where, what, f"errnoRet {errno_ret!r} is not an errno (0..{MAX_ERRNO})")
    return RET_ERRNO | e


def _u64(v, where, what):
    if type(v) is not int or not -(1 << 63) <= v < (1 << 64):
        _fail(where, what, f"{v!r} is not a 64-bit integer")
    return v & 0xFFFFFFFFFFFFFFFF   # negative values mean the sign-extended register


def _kernel_at_least(spec):
    def nums(s):
        out = []
        for part in s.split(".")[:3]:
            digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
            out.append(int(digits) if digits else 0)
        return out
    return nums(os.uname().release) >= nums(str(spec))


def _applies(entry, arch, where, what):
    """Docker's includes/excludes: arches, caps, minKernel."""
    inc, exc = entry.get("includes") or {}, entry.get("excludes") or {}
    if not isinstance(inc, dict) or not isinstance(exc, dict):
        _fail(where, what, "includes/excludes must be objects")
    scmp = {v: k for k, v in SCMP_ARCH.items()}[arch]
    if inc.get("arches") and scmp not in inc["arches"]:
        return False
    if exc.get("arches") and scmp in exc["arches"]:
        return False
    if inc.get("caps"):
        return False
    mk = entry.get("minKernel") or inc.get("minKernel")
    return not mk or _kernel_at_least(mk)


def parse(doc, arch, where):
    """Profile document -> (default_ret, {nr: [(conds, ret), ...]})."""
    from gpusandbox.linux import syscalls_table
    tables = {"x86_64": syscalls_table.X86_64, "aarch64": syscalls_table.AARCH64}
    if arch not in tables:
        raise SeccompError(f"seccomp: unsupported architecture {arch}", None,
                           "filters exist for x86_64 and aarch64; use --seccomp unconfined")
    if not isinstance(doc, dict):
        _fail(where, "top level", "must be a JSON object")
    default = _ret(doc.get("defaultAction"), doc.get("defaultErrnoRet"), where, "defaultAction")
    arches = doc.get("architectures")
    if arches is None and isinstance(doc.get("archMap"), list):
        arches = [m.get("architecture") for m in doc["archMap"] if isinstance(m, dict)]
    if arches and not any(SCMP_ARCH.get(a) == arch for a in arches):
        _fail(where, "architectures", f"does not list {arch}",
              f"add \"{[k for k, v in SCMP_ARCH.items() if v == arch][0]}\" to architectures")
    table = tables[arch]
    strict = default in (RET_ALLOW, RET_LOG)
    rules = {}
    entries = doc.get("syscalls") or []
    if not isinstance(entries, list):
        _fail(where, "syscalls", "must be a list")
    for i, ent in enumerate(entries):
        what = f"syscalls[{i}]"
        if not isinstance(ent, dict):
            _fail(where, what, "must be an object")
        names = ent.get("names")
        if names is None and "name" in ent:
            names = [ent["name"]]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            _fail(where, what, "names must be a list of syscall names")
        what = f"syscalls[{i}] ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})"
        ret = _ret(ent.get("action"), ent.get("errnoRet"), where, what)
        conds = tuple(_cond(a, where, what) for a in (ent.get("args") or ()))
        if not _applies(ent, arch, where, what):
            continue
        for n in names:
            nr = table.get(n)
            if nr is None:
                if strict and all(n not in t for t in tables.values()):
                    _fail(where, what, f"unknown syscall {n!r}",
                          "a misspelt rule would be ignored; fix the name")
                continue
            rules.setdefault(nr, []).append((conds, ret))
    return default, rules


def _cond(a, where, what):
    if not isinstance(a, dict):
        _fail(where, what, "each args entry must be an object")
    idx, op = a.get("index"), a.get("op")
    if type(idx) is not int or not 0 <= idx <= 5:
        _fail(where, what, f"argument index {idx!r} is not 0..5")
    if op not in _OPS:
        _fail(where, what, f"unsupported comparison {op!r}", f"use one of {', '.join(_OPS)}")
    return (idx, op, _u64(a.get("value"), where, what), _u64(a.get("valueTwo", 0), where, what))


# --- assembler -----------------------------------------------------------------

class _Prog:
    """Builds the program backwards, so every jump target already exists and
    forward offsets are known when a jump is written.  Labels are positions
    counted from the end."""

    def __init__(self):
        self.rev = []

    def op(self, code, k=0):
        self.rev.append((code, 0, 0, k & 0xFFFFFFFF))
        return len(self.rev) - 1

    def ret(self, value):
        return self.op(RET_K, value)

    def jump(self, code, k, jt, jf):
        if jt == jf:
            return self.goto(jt)
        while True:
            i = len(self.rev)
            ot, of = i - jt - 1, i - jf - 1
            # Conditional offsets are 8 bits: hop through an unconditional
            # jump (32-bit offset) placed right after this one.
            if ot > 255:
                self.rev.append((JA, 0, 0, ot))
                jt = i
            elif of > 255:
                self.rev.append((JA, 0, 0, of))
                jf = i
            else:
                self.rev.append((code, ot, of, k & 0xFFFFFFFF))
                return i

    def goto(self, target):
        i = len(self.rev)
        if i - target - 1 == 0:
            return target
        self.rev.append((JA, 0, 0, i - target - 1))
        return i

    def then(self, code, k, nxt):
        """An instruction that falls through to `nxt`."""
        self.goto(nxt)
        return self.op(code, k)

    def bytes(self):
        return b"".join(_INSN.pack(*ins) for ins in reversed(self.rev))


def _emit_half(p, off, mask, code, k, t, f):
    """A = seccomp_data[off] (& mask); if A <code> k goto t else f."""
    nxt = p.jump(code, k, t, f)
    if mask != 0xFFFFFFFF:
        nxt = p.then(ALU_AND_K, mask, nxt)
    return p.then(LD_W_ABS, off, nxt)


def _emit_cond(p, cond, ok, bad):
    idx, op, v, v2 = cond
    lo_off, hi_off = OFF_ARGS + 8 * idx, OFF_ARGS + 8 * idx + 4
    if op == "SCMP_CMP_MASKED_EQ":
        m, d = v, v2
        if d & ~m:
            return p.goto(bad)        # (arg & m) can never equal d
        lab = ok
        if m & 0xFFFFFFFF:
            lab = _emit_half(p, lo_off, m & 0xFFFFFFFF, JEQ, d & 0xFFFFFFFF, lab, bad)
        if m >> 32:
            lab = _emit_half(p, hi_off, m >> 32, JEQ, d >> 32, lab, bad)
        return lab
    if op in ("SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE"):
        # a != v is !(a == v); a < v is !(a >= v); a <= v is !(a > v).
        inv = {"SCMP_CMP_NE": "SCMP_CMP_EQ", "SCMP_CMP_LT": "SCMP_CMP_GE",
               "SCMP_CMP_LE": "SCMP_CMP_GT"}[op]
        return _emit_cond(p, (idx, inv, v, v2), bad, ok)
    vh, vl = v >> 32, v & 0xFFFFFFFF
    if op == "SCMP_CMP_EQ":
        lab = _emit_half(p, lo_off, 0xFFFFFFFF, JEQ, vl, ok, bad)
        return _emit_half(p, hi_off, 0xFFFFFFFF, JEQ, vh, lab, bad)
    # GT / GE: the high halves decide unless equal, then the low halves do.
    lo = _emit_half(p, lo_off, 0xFFFFFFFF, JGT if op == "SCMP_CMP_GT" else JGE, vl, ok, bad)
    eq = p.jump(JEQ, vh, lo, bad)
    return p.then(LD_W_ABS, hi_off, p.jump(JGT, vh, ok, eq))


def _emit_verdict(p, verdict):
    if isinstance(verdict, int):
        return p.ret(verdict)
    nxt = None
    for conds, ret in reversed(verdict):
        lab = p.ret(ret)
        for c in reversed(conds):
            lab = _emit_cond(p, c, lab, nxt)
        nxt = lab
    return nxt


def _emit_tree(p, ranges):
    """ranges: [(first_nr, verdict)] sorted, each running to the next one."""
    if len(ranges) == 1:
        return _emit_verdict(p, ranges[0][1])
    mid = len(ranges) // 2
    right = _emit_tree(p, ranges[mid:])
    left = _emit_tree(p, ranges[:mid])
    return p.jump(JGE, ranges[mid][0], right, left)


def _verdict(entries, default):
    """Entries after the first unconditional one are unreachable; a list
    without one ends in the default.  A plain return comes out as an int."""
    out = []
    for conds, ret in entries:
        out.append((conds, ret))
        if not conds:
            break
    else:
        out.append(((), default))
    return out[0][1] if len(out) == 1 else tuple(out)


def _add(ranges, lo, verdict):
    if not ranges or ranges[-1][1] != verdict:
        ranges.append((lo, verdict))


def assemble(parsed, arch):
    default, rules = parsed
    ranges, end = [], 0          # end: first number not covered yet
    for nr in sorted(rules):
        v = _verdict(rules[nr], default)
        if v == default:
            continue
        if nr > end:
            _add(ranges, end, default)
        _add(ranges, nr, v)
        end = nr + 1
    _add(ranges, end, default)
    p = _Prog()
    body = _emit_tree(p, ranges)
    if arch == "x86_64":
        kill = p.ret(RET_KILL_PROCESS)
        body = p.jump(JGE, X32_SYSCALL_BIT, kill, body)
    body = p.then(LD_W_ABS, OFF_NR, body)
    kill = p.ret(RET_KILL_PROCESS)
    p.then(LD_W_ABS, OFF_ARCH, p.jump(JEQ, AUDIT_ARCH[arch], body, kill))
    if len(p.rev) > BPF_MAXINSNS:
        raise SeccompError("seccomp profile too large", f"{len(p.rev)} BPF instructions, "
                           f"the kernel allows {BPF_MAXINSNS}", "merge or drop argument rules")
    return p.bytes()


# --- cache ------------------------------------------------------------------------
#
# One file per (profile path, architecture): a fixed header, a context line,
# the profile's bytes and the program.  Nothing in it is trusted unless every
# length adds up, the context and profile bytes are identical to the current
# ones and the program's CRC matches; anything else means "compile again".

_MAGIC = b"GSBPF\x00\x01\x00"
_HDR = struct.Struct("<8sIIII")     # magic, context len, profile len, prog len, prog crc


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


def _cache_entry(path, arch):
    import zlib
    d = cache_dir()
    if not _private_dir(d):
        return None
    tag = zlib.crc32(os.fsencode(os.path.abspath(path)))
    return os.path.join(d, f"{tag:08x}-{arch}.bpf")


def _cache_load(entry, data, arch):
    import zlib
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
    if zlib.crc32(prog) != crc or prog[:_INSN.size] != _INSN.pack(LD_W_ABS, 0, 0, OFF_ARCH):
        return None
    return prog


def _cache_store(entry, data, arch, prog):
    """Write atomically (a private temporary file renamed over the entry);
    a failure only costs the next launch a compile."""
    import zlib

    from . import fsutil
    ctx = _context(arch)
    blob = _HDR.pack(_MAGIC, len(ctx), len(data), len(prog), zlib.crc32(prog)) + ctx + data + prog
    fsutil.write_atomic(entry, blob, 0o600, best_effort=True)


# --- install -----------------------------------------------------------------------

SECCOMP_SET_MODE_FILTER = 1


def install(prog, flags=0):
    """Install a compiled program on the calling thread (and its future
    children).  The caller must have set no_new_privs (or hold CAP_SYS_ADMIN).
    `flags` are SECCOMP_FILTER_FLAG_* bits; none are needed for the
    single-threaded command process (TSYNC only matters with threads)."""
    import ctypes
    from gpusandbox.linux import sys as lsys
    n = len(prog) // _INSN.size
    if not prog or len(prog) % _INSN.size or n > BPF_MAXINSNS:
        raise ValueError(f"not a compiled seccomp program ({len(prog)} bytes)")

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(bytes(prog), len(prog))
    fprog = SockFprog(n, ctypes.cast(buf, ctypes.c_void_p))
    try:
        lsys.syscall("seccomp", ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                     ctypes.c_uint(flags), ctypes.byref(fprog))
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
