"""The device-filter assembler, checked without the kernel.

A small interpreter runs the emitted eBPF subset on a struct
bpf_cgroup_dev_ctx so that verdicts for (type, major, minor, access) can be
checked against what the rules say; the kernel-level check is in
tests/integration/test_bpf_kernel.py."""
import struct
import sys

import pytest

from gpusandbox.linux import bpfdev as b

GPU_RULES = [("c", 195, 0, "rw"), ("c", 195, 255, "rw"), ("c", 508, None, "rw")]
ACCESS = {"m": b.ACC_MKNOD, "r": b.ACC_READ, "w": b.ACC_WRITE}


def run(insns, dev_type, major, minor, access):
    """Interpret the emitted subset; returns r0 at exit.  Refuses anything the
    verifier would (backward or out-of-range jumps, unknown opcodes, reading
    an unset register, falling off the end)."""
    ctx = struct.pack("=III", (access << 16) | dev_type, major, minor)
    regs = {1: "ctx"}
    pc, steps = 0, 0
    u64 = (1 << 64) - 1
    while True:
        assert 0 <= pc < len(insns), f"pc {pc} out of the program"
        steps += 1
        assert steps <= len(insns), "a loop: the verifier would refuse it"
        op, dst, src, off, imm = insns[pc]
        pc += 1
        if op == b.LDX_MEM_W:
            assert regs.get(src) == "ctx" and off in (0, 4, 8)
            regs[dst] = struct.unpack_from("=I", ctx, off)[0]
        elif op == b.MOV64_X:
            regs[dst] = regs[src]
        elif op == b.MOV64_K:
            regs[dst] = imm & u64
        elif op == b.AND64_K:
            regs[dst] = regs[dst] & (imm & u64)
        elif op == b.RSH64_K:
            regs[dst] = regs[dst] >> imm
        elif op in (b.JNE_K, b.JSET_K):
            assert off >= 0, "backward jump"
            taken = regs[dst] != (imm & u64) if op == b.JNE_K else regs[dst] & (imm & u64)
            if taken:
                pc += off
        elif op == b.EXIT:
            return regs[0]
        else:
            raise AssertionError(f"unexpected opcode {op:#x}")


def verdict(rules, t, major, minor, access):
    mask = 0
    for ch in access:
        mask |= ACCESS[ch]
    return run(b.assemble(rules), {"c": b.DEV_CHAR, "b": b.DEV_BLOCK}[t], major, minor, mask)


def test_small_rule_list_instruction_by_instruction():
    prog = b.assemble([("c", 195, 0, "rw"), ("c", 136, None, "rwm")])
    assert prog == [
        (b.LDX_MEM_W, 2, 1, 0, 0),          # r2 = ctx->access_type
        (b.MOV64_X, 3, 2, 0, 0),            # r3 = r2
        (b.AND64_K, 2, 0, 0, 0xFFFF),       # r2 = type
        (b.RSH64_K, 3, 0, 0, 16),           # r3 = access
        (b.LDX_MEM_W, 4, 1, 4, 0),          # r4 = major
        (b.LDX_MEM_W, 5, 1, 8, 0),          # r5 = minor
        # rule 1: c 195:0 rw
        (b.JNE_K, 2, 0, 5, b.DEV_CHAR),
        (b.JSET_K, 3, 0, 4, b.ACC_MKNOD),   # mknod asked: not this rule
        (b.JNE_K, 4, 0, 3, 195),
        (b.JNE_K, 5, 0, 2, 0),
        (b.MOV64_K, 0, 0, 0, 1),
        (b.EXIT, 0, 0, 0, 0),
        # rule 2: c 136:* rwm (no access or minor check)
        (b.JNE_K, 2, 0, 3, b.DEV_CHAR),
        (b.JNE_K, 4, 0, 2, 136),
        (b.MOV64_K, 0, 0, 0, 1),
        (b.EXIT, 0, 0, 0, 0),
        # default: deny
        (b.MOV64_K, 0, 0, 0, 0),
        (b.EXIT, 0, 0, 0, 0),
    ]


def test_encoding_is_struct_bpf_insn():
    code = b.encode([(b.LDX_MEM_W, 2, 1, 4, 0), (b.MOV64_K, 0, 0, -1, -7)])
    assert len(code) == 16
    regs = 0x12 if sys.byteorder == "little" else 0x21   # dst:4 then src:4 in bitfield order
    assert code[:8] == struct.pack("=BBhi", 0x61, regs, 4, 0)
    assert code[8:] == struct.pack("=BBhi", 0xb7, 0, -1, -7)


@pytest.mark.parametrize("t,major,minor,access,allowed", [
    ("c", 1, 3, "rw", 1),       # /dev/null
    ("c", 1, 3, "m", 1),
    ("c", 1, 9, "r", 1),        # urandom
    ("c", 5, 2, "rw", 1),       # ptmx
    ("c", 136, 7, "rw", 1),     # pts/7
    ("c", 136, 0xFFFFF, "w", 1),
    ("c", 195, 0, "rw", 1),     # the selected GPU
    ("c", 195, 0, "r", 1),
    ("c", 195, 0, "m", 0),      # no mknod of it: access mask is rw
    ("c", 195, 0, "rwm", 0),
    ("c", 195, 1, "rw", 0),     # another GPU
    ("c", 195, 2, "r", 0),
    ("c", 195, 255, "rw", 1),   # nvidiactl
    ("c", 195, 254, "rw", 0),   # nvidia-modeset, not granted
    ("c", 508, 0, "rw", 1),     # uvm, any minor
    ("c", 508, 1, "r", 1),
    ("b", 195, 0, "rw", 0),     # same numbers as a block device
    ("b", 7, 0, "r", 0),        # loop0
    ("b", 8, 0, "rw", 0),       # sda
    ("b", 1, 3, "rw", 0),
    ("c", 1, 1, "r", 0),        # /dev/mem
    ("c", 10, 200, "rw", 0),    # tun
    ("c", 4, 0, "rw", 0),       # tty0
])
def test_verdicts(t, major, minor, access, allowed):
    rules = list(b.DEFAULT_RULES) + GPU_RULES
    assert verdict(rules, t, major, minor, access) == allowed


def test_default_rules_alone_deny_every_gpu():
    for minor in (0, 1, 255):
        assert verdict(b.DEFAULT_RULES, "c", 195, minor, "rw") == 0
    assert verdict(b.DEFAULT_RULES, "c", 1, 5, "rw") == 1


def test_wildcards_and_any_type():
    rules = [("a", 7, None, "r"), ("c", None, 4, "w")]
    assert verdict(rules, "b", 7, 3, "r") == 1
    assert verdict(rules, "c", 7, 3, "r") == 1
    assert verdict(rules, "b", 7, 3, "rw") == 0      # write not granted by rule 1
    assert verdict(rules, "c", 99, 4, "w") == 1
    assert verdict(rules, "c", 99, 5, "w") == 0


def test_empty_rule_list_denies_everything():
    prog = b.assemble([])
    assert len(prog) == 8 and prog[-2:] == [(b.MOV64_K, 0, 0, 0, 0), (b.EXIT, 0, 0, 0, 0)]
    assert verdict([], "c", 1, 3, "r") == 0


def test_duplicates_collapse():
    once = b.assemble([("c", 195, 0, "rw")])
    assert b.assemble([("c", 195, 0, "rw"), ("c", 195, 0, "wr")]) == once


@pytest.mark.parametrize("rule,words", [
    (("x", 1, 3, "rw"), "type"),
    (("c", -1, 3, "rw"), "major"),
    (("c", 1, 1 << 20, "rw"), "minor"),
    (("c", 1, "3", "rw"), "minor"),
    (("c", 1, 3, "rx"), "access"),
    (("c", 1, 3, ""), "empty"),
    (("c", 1, 3), "expected"),
])
def test_bad_rules_are_named(rule, words):
    with pytest.raises(ValueError) as e:
        b.assemble([rule])
    assert words in str(e.value) and repr(rule) in str(e.value)


def test_v1_devices_lines_match_the_rules():
    rules = [("c", 195, 0, "rw"), ("c", 136, None, "mwr"), ("b", None, None, "m"), ("a", 7, 3, "wr")]
    assert b.v1_lines(rules) == ["c 195:0 rw", "c 136:* rwm", "b *:* m", "a 7:3 rw"]
