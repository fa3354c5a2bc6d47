"""Seccomp profile compiler: an OCI/Docker-format JSON profile, parsed, to a
classic BPF program (the bytes of a struct sock_filter[]).

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

from gpusandbox.errors import SeccompError
from gpusandbox.linux.sys import BPF_LD_W_ABS as LD_W_ABS
from gpusandbox.linux.sys import BPF_MAXINSNS  # noqa: F401 (the compiler's vocabulary)
from gpusandbox.linux.sys import SECCOMP_DATA_ARCH as OFF_ARCH
from gpusandbox.linux.sys import SOCK_FILTER as _INSN

# The version of what this compiler writes is seccomp.py's COMPILER_VERSION,
# stamped on every program it keeps: bump it when the output changes.

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

# Classic BPF opcodes (linux/bpf_common.h) the kernel's seccomp checker accepts
# (LD_W_ABS: linux/sys.py's, with the instruction layout).
ALU_AND_K = 0x54
JA, JEQ, JGT, JGE = 0x05, 0x15, 0x25, 0x35
RET_K = 0x06
OFF_NR, OFF_ARGS = 0, 16        # in struct seccomp_data (OFF_ARCH: linux/sys.py's)


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


def parse(doc, arch, where, skip_unknown=False):
    """Profile document -> (default_ret, {nr: [(conds, ret), ...]}).
    A name no table knows is refused where the default allows (a misspelt
    deny rule would be ignored), unless skip_unknown: then it is left out,
    as runc and crun do with an OCI config's names."""
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
                if strict and not skip_unknown and all(n not in t for t in tables.values()):
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
