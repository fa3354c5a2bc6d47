"""The cgroup v2 device filter: a BPF_PROG_TYPE_CGROUP_DEVICE program.

cgroup v2 has no devices.allow file; device access is decided by BPF programs
attached to the cgroup (Documentation/admin-guide/cgroup-v2.rst, "Device
controller").  The kernel runs them on open() and mknod() of a device node
with a struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor;}
where access_type is (access << 16) | type; a return of 1 allows, 0 denies
(EPERM).  The program is assembled here from plain rule tuples
(type, major, minor, access), e.g. ('c', 195, 0, 'rw'); None as major or
minor means any.  Everything not matched by a rule is denied, block devices
included.

This module imports nothing beyond os/ctypes/struct/sys: it is on the launch
path of every root `run`.
"""
import ctypes
import os
import struct
import sys

from gpusandbox.linux import sys as _sys

# include/uapi/linux/bpf.h: struct bpf_cgroup_dev_ctx encodings.
DEV_BLOCK, DEV_CHAR = 1, 2
ACC_MKNOD, ACC_READ, ACC_WRITE = 1, 2, 4
_TYPES = {"b": DEV_BLOCK, "c": DEV_CHAR, "a": None}
_ACCESS = {"m": ACC_MKNOD, "r": ACC_READ, "w": ACC_WRITE}
ACC_ALL = ACC_MKNOD | ACC_READ | ACC_WRITE

# The character devices every sandbox /dev holds (the same set docker and
# the OCI runtime spec's default devices give a container).
DEFAULT_RULES = (
    ("c", 1, 3, "rwm"),    # null
    ("c", 1, 5, "rwm"),    # zero
    ("c", 1, 7, "rwm"),    # full
    ("c", 1, 8, "rwm"),    # random
    ("c", 1, 9, "rwm"),    # urandom
    ("c", 5, 0, "rwm"),    # tty
    ("c", 5, 2, "rwm"),    # ptmx
    ("c", 136, None, "rwm"),  # pts/N (Unix98 pty slaves)
)

# Opcodes (include/uapi/linux/bpf_common.h, bpf.h).  Only this subset is
# emitted; the unit tests interpret exactly it.
LDX_MEM_W = 0x61     # BPF_LDX | BPF_MEM | BPF_W: dst = *(u32 *)(src + off)
MOV64_X = 0xbf       # BPF_ALU64 | BPF_MOV | BPF_X: dst = src
MOV64_K = 0xb7       # BPF_ALU64 | BPF_MOV | BPF_K: dst = imm
AND64_K = 0x57       # BPF_ALU64 | BPF_AND | BPF_K: dst &= imm
RSH64_K = 0x77       # BPF_ALU64 | BPF_RSH | BPF_K: dst >>= imm
JNE_K = 0x55         # BPF_JMP | BPF_JNE | BPF_K: if dst != imm: pc += off
JSET_K = 0x45        # BPF_JMP | BPF_JSET | BPF_K: if dst & imm: pc += off
EXIT = 0x95          # BPF_JMP | BPF_EXIT: return r0

# Registers: r1 holds the context on entry; r0 is the verdict.
R0, R1, R_TYPE, R_ACC, R_MAJOR, R_MINOR = 0, 1, 2, 3, 4, 5

_MAX_MAJOR = (1 << 12) - 1   # MAJOR() of a dev_t is 12 bits, MINOR() 20 bits
_MAX_MINOR = (1 << 20) - 1


def normalize(rules):
    """Validate rule tuples; returns them as (type, major, minor, access-mask)
    with duplicates removed, order kept.  Raises ValueError naming the rule."""
    out, seen = [], set()
    for rule in rules:
        try:
            kind, major, minor, access = rule
        except (TypeError, ValueError):
            raise ValueError(f"device rule {rule!r}: expected (type, major, minor, access)") from None
        if kind not in _TYPES:
            raise ValueError(f"device rule {rule!r}: type must be 'c', 'b' or 'a'")
        for val, top, name in ((major, _MAX_MAJOR, "major"), (minor, _MAX_MINOR, "minor")):
            if val is not None and (not isinstance(val, int) or isinstance(val, bool)
                                    or not 0 <= val <= top):
                raise ValueError(f"device rule {rule!r}: {name} must be None or 0..{top}")
        mask = 0
        for ch in access or "":
            if ch not in _ACCESS:
                raise ValueError(f"device rule {rule!r}: access letters are r, w, m")
            mask |= _ACCESS[ch]
        if not mask:
            raise ValueError(f"device rule {rule!r}: empty access")
        key = (kind, major, minor, mask)
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def v1_lines(rules):
    """The same rules as cgroup v1 devices.allow lines ('c 195:0 rw'), for
    hosts without cgroup2."""
    letters = ((ACC_READ, "r"), (ACC_WRITE, "w"), (ACC_MKNOD, "m"))
    out = []
    for kind, major, minor, mask in normalize(rules):
        acc = "".join(ch for bit, ch in letters if mask & bit)
        out.append(f"{kind} {'*' if major is None else major}:{'*' if minor is None else minor} {acc}")
    return out


def assemble(rules):
    """Rule tuples -> list of (opcode, dst, src, off, imm) instructions.

    Layout: unpack the context once, then one block per rule that falls
    through to the next block on the first mismatch, ending in "return 1";
    after the last block, "return 0".  Jumps only go forward, so the
    verifier's walk is linear in the number of rules."""
    prog = [
        (LDX_MEM_W, R_TYPE, R1, 0, 0),      # access_type
        (MOV64_X, R_ACC, R_TYPE, 0, 0),
        (AND64_K, R_TYPE, 0, 0, 0xFFFF),    # low 16 bits: device type
        (RSH64_K, R_ACC, 0, 0, 16),         # high 16 bits: requested access
        (LDX_MEM_W, R_MAJOR, R1, 4, 0),
        (LDX_MEM_W, R_MINOR, R1, 8, 0),
    ]
    for kind, major, minor, mask in normalize(rules):
        checks = []
        if _TYPES[kind] is not None:
            checks.append((JNE_K, R_TYPE, _TYPES[kind]))
        if mask != ACC_ALL:
            # Any requested access bit outside the rule's mask: no match.
            # (open(O_RDWR) asks for READ|WRITE at once; both must be allowed.)
            checks.append((JSET_K, R_ACC, ACC_ALL & ~mask))
        if major is not None:
            checks.append((JNE_K, R_MAJOR, major))
        if minor is not None:
            checks.append((JNE_K, R_MINOR, minor))
        block = len(checks) + 2
        for i, (op, reg, imm) in enumerate(checks):
            # off counts from the next instruction: skip the rest of the block.
            prog.append((op, reg, 0, block - i - 1, imm))
        prog.append((MOV64_K, R0, 0, 0, 1))
        prog.append((EXIT, 0, 0, 0, 0))
    prog.append((MOV64_K, R0, 0, 0, 0))
    prog.append((EXIT, 0, 0, 0, 0))
    return prog


def encode(insns):
    """Instructions -> bytes of struct bpf_insn[] {u8 code; u8 dst:4, src:4;
    s16 off; s32 imm} in host byte order (bitfield order follows it)."""
    little = sys.byteorder == "little"
    out = bytearray()
    for op, dst, src, off, imm in insns:
        regs = (src << 4 | dst) if little else (dst << 4 | src)
        out += struct.pack("=BBhi", op, regs, off, imm)
    return bytes(out)


# --- bpf(2) ------------------------------------------------------------------
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_PROG_DETACH = 9
BPF_PROG_GET_FD_BY_ID = 13
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_PROG_QUERY = 16
BPF_PROG_TYPE_CGROUP_DEVICE = 15
BPF_CGROUP_DEVICE = 6
BPF_F_ALLOW_OVERRIDE = 1
BPF_F_ALLOW_MULTI = 2
BPF_F_QUERY_EFFECTIVE = 1

# No GPL-only helper is called, so the kernel does not require a GPL license
# string (the verifier checks the license only for gpl_only helpers).
LICENSE = b"Apache-2.0"
PROG_NAME = b"gpusandbox_dev"   # BPF_OBJ_NAME_LEN is 16 with the NUL
_ATTR_SIZE = 128                # covers every field used; the rest stays zero


class LoadError(OSError):
    """BPF_PROG_LOAD refused the program; .log holds the verifier's words."""

    def __init__(self, err, log):
        super().__init__(err, f"BPF_PROG_LOAD failed: {os.strerror(err)}")
        self.log = log


def _bpf(cmd, attr):
    return _sys.syscall("bpf", ctypes.c_int(cmd), ctypes.byref(attr), ctypes.c_uint(len(attr)))


def load(insns, log_size=1 << 16):
    """Load the program; returns its fd (O_CLOEXEC, as every bpf fd is).

    The first try runs without a log (the verifier is faster that way); a
    refusal is retried with log_level 1 so the error carries the log."""
    code = encode(insns)
    insn_buf = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(LICENSE)
    for level in (0, 1):
        attr = ctypes.create_string_buffer(_ATTR_SIZE)
        log = ctypes.create_string_buffer(log_size if level else 1)
        struct.pack_into("=IIQQIIQII16s", attr, 0, BPF_PROG_TYPE_CGROUP_DEVICE,
                         len(insns), ctypes.addressof(insn_buf), ctypes.addressof(lic),
                         level, log_size if level else 0,
                         ctypes.addressof(log) if level else 0, 0, 0, PROG_NAME)
        try:
            return _bpf(BPF_PROG_LOAD, attr)
        except OSError as e:
            if level or e.errno not in (22, 13):    # EINVAL/EACCES: verifier said no
                raise LoadError(e.errno, log.value.decode("utf-8", "replace")) from None
    raise AssertionError("unreachable")


def prog_id(fd):
    """The kernel's id of the program behind fd (struct bpf_prog_info.id)."""
    info = ctypes.create_string_buffer(8)          # u32 type; u32 id
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into("=IIQ", attr, 0, fd, len(info), ctypes.addressof(info))
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return struct.unpack_from("=I", info, 4)[0]


def attach(cgroup_fd, prog_fd, flags=BPF_F_ALLOW_MULTI):
    """cgroup_fd must be a real open fd of the directory (not O_PATH):
    cgroup_get_from_fd() uses fdget(), which refuses O_PATH files."""
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into("=IIII", attr, 0, cgroup_fd, prog_fd, BPF_CGROUP_DEVICE, flags)
    _bpf(BPF_PROG_ATTACH, attr)


def detach(cgroup_fd, prog_fd):
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into("=III", attr, 0, cgroup_fd, prog_fd, BPF_CGROUP_DEVICE)
    _bpf(BPF_PROG_DETACH, attr)


def query(cgroup_fd, effective=False, max_progs=64):
    """(attach_flags, [prog ids]) of the device programs on the cgroup: those
    attached to it, or with effective=True those that run for it (its own
    plus the ancestors' that apply)."""
    ids = (ctypes.c_uint32 * max_progs)()
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into("=IIIIQI", attr, 0, cgroup_fd, BPF_CGROUP_DEVICE,
                     BPF_F_QUERY_EFFECTIVE if effective else 0, 0,
                     ctypes.addressof(ids), max_progs)
    _bpf(BPF_PROG_QUERY, attr)
    flags, = struct.unpack_from("=I", attr, 12)
    count, = struct.unpack_from("=I", attr, 24)
    return flags, list(ids[:min(count, max_progs)])


def prog_alive(ident):
    """Whether the kernel still holds a program with this id."""
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    struct.pack_into("=I", attr, 0, ident)
    try:
        fd = _bpf(BPF_PROG_GET_FD_BY_ID, attr)
    except OSError as e:
        if e.errno == 2:   # ENOENT: released
            return False
        raise
    os.close(fd)
    return True
