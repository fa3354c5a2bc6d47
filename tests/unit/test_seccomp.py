"""The seccomp compiler, checked by running its programs in a classic-BPF
interpreter that follows the kernel's seccomp_data layout and semantics."""
import json
import os
import struct

import pytest

from gpusandbox.errors import SeccompError
from gpusandbox.linux import seccomp
from gpusandbox.linux.syscalls_table import AARCH64, X86_64

AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_ARM = 0x40000028
TABLE = {"x86_64": X86_64, "aarch64": AARCH64}
ARCHES = ("x86_64", "aarch64")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ALLOW, KILL_PROCESS, KILL_THREAD, TRAP, LOG = "allow", "kill_process", "kill_thread", "trap", "log"
EPERM, ENOSYS = ("errno", 1), ("errno", 38)


class Run:
    def __init__(self, verdict, steps):
        self.verdict, self.steps = verdict, steps


def run_bpf(prog, nr, arch, args=(), ip=0):
    """Execute a seccomp program the way the kernel does (forward jumps only,
    32-bit accumulator, word loads from struct seccomp_data)."""
    assert len(prog) % 8 == 0 and 0 < len(prog) // 8 <= 4096
    insns = [struct.unpack_from("<HBBI", prog, i) for i in range(0, len(prog), 8)]
    regs = [a & (2**64 - 1) for a in args] + [0] * (6 - len(args))
    data = struct.pack("<IIQ6Q", nr & 0xFFFFFFFF, arch, ip, *regs)
    pc = acc = steps = 0
    while True:
        assert pc < len(insns), "ran off the end of the program"
        code, jt, jf, k = insns[pc]
        steps += 1
        pc += 1
        if code == 0x20:                       # ld [k]
            assert k % 4 == 0 and k + 4 <= len(data)
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x54:                     # and #k
            acc &= k
        elif code == 0x05:                     # ja k
            pc += k
        elif code in (0x15, 0x25, 0x35, 0x45):
            ok = {0x15: acc == k, 0x25: acc > k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if ok else jf
        elif code == 0x06:                     # ret #k
            return Run(_verdict(k), steps)
        else:
            raise AssertionError(f"opcode {code:#x} is not allowed in seccomp")


def _verdict(k):
    action, data = k & 0xFFFF0000, k & 0xFFFF
    return {0x7FFF0000: ALLOW, 0x80000000: KILL_PROCESS, 0: KILL_THREAD, 0x00030000: TRAP,
            0x7FFC0000: LOG}.get(action) or ("errno", data)


def prog_for(profile, arch):
    return seccomp.compile_profile(profile, arch, cache=False)


def check(prog, arch, name_or_nr, args=(), audit=None):
    nr = TABLE[arch][name_or_nr] if isinstance(name_or_nr, str) else name_or_nr
    return run_bpf(prog, nr, AUDIT[arch] if audit is None else audit, args).verdict


CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWTIME, CLONE_FILES = 0x10000000, 0x20000, 0x80, 0x400
SIGCHLD = 17
PTHREAD_FLAGS = 0x3D0F00                     # glibc's clone flags for a thread
TIOCSTI, TIOCLINUX, TIOCGWINSZ = 0x5412, 0x541C, 0x5413

DEFAULT_CASES = [
    ("read", (), ALLOW),
    ("getpid", (), ALLOW),
    ("keyctl", (), EPERM),
    ("add_key", (), EPERM),
    ("bpf", (), EPERM),
    ("perf_event_open", (), EPERM),
    ("userfaultfd", (), EPERM),
    ("mount", (), EPERM),
    ("fsopen", (), EPERM),
    ("setns", (), EPERM),
    ("init_module", (), EPERM),
    ("open_by_handle_at", (), EPERM),
    ("io_uring_setup", (), EPERM),
    ("fanotify_init", (), ENOSYS),           # real but unlisted: ENOSYS, not EPERM
    ("kcmp", (), ALLOW),                     # Open MPI 5 decides on CMA with it
    (1000, (), ENOSYS),
    (0xFFFFFFFF, (), None),                  # syscall(-1): per-arch, see below
    ("clone", (SIGCHLD,), ALLOW),
    ("clone", (PTHREAD_FLAGS,), ALLOW),
    ("clone", (CLONE_NEWUSER | SIGCHLD,), EPERM),
    ("clone", (CLONE_NEWNS | SIGCHLD,), EPERM),
    ("clone3", (0, 88), ENOSYS),
    ("unshare", (CLONE_NEWUSER,), EPERM),
    ("unshare", (CLONE_NEWTIME,), EPERM),
    ("unshare", (CLONE_FILES,), ALLOW),
    ("ioctl", (3, TIOCSTI), EPERM),
    ("ioctl", (3, (1 << 32) | TIOCSTI), EPERM),   # the kernel reads cmd as 32 bits
    ("ioctl", (3, TIOCLINUX), EPERM),
    ("ioctl", (3, TIOCGWINSZ), ALLOW),
    ("ioctl", (5, 0xC020462A), ALLOW),        # an nvidia-style _IOWR request
    ("personality", (0,), ALLOW),
    ("personality", (0xFFFFFFFF,), ALLOW),
    ("personality", (0x0040000,), ALLOW),
    ("personality", (0x0008,), EPERM),
    ("personality", (0x0020000,), EPERM),
    ("socket", (2, 1, 0), ALLOW),
    ("socket", (40, 1, 0), EPERM),
    ("memfd_create", (), ALLOW),
    ("mbind", (), ALLOW),
    ("set_mempolicy", (), ALLOW),
    ("process_vm_readv", (), ALLOW),
    ("process_vm_writev", (), ALLOW),
    ("pidfd_getfd", (), ALLOW),
    ("sched_setaffinity", (), ALLOW),
    ("futex_waitv", (), ALLOW),
    ("rseq", (), ALLOW),
    ("ptrace", (), ALLOW),
    ("close_range", (), ALLOW),
    ("statx", (), ALLOW),
    ("faccessat2", (), ALLOW),
    ("epoll_pwait2", (), ALLOW),
    ("execve", (), ALLOW),
    ("exit_group", (), ALLOW),
]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("name,args,expected", DEFAULT_CASES)
def test_default_profile_verdicts(arch, name, args, expected):
    prog = prog_for("default", arch)
    if expected is None:
        expected = KILL_PROCESS if arch == "x86_64" else ENOSYS
    assert check(prog, arch, name, args) == expected


@pytest.mark.parametrize("arch", ARCHES)
def test_profiling_allows_perf_event_open_only(arch):
    prof, default = prog_for("profiling", arch), prog_for("default", arch)
    assert check(prof, arch, "perf_event_open") == ALLOW
    for name in ("bpf", "keyctl", "mount", "read"):
        assert check(prof, arch, name) == check(default, arch, name)


def test_profiling_json_is_default_plus_perf():
    def load(n):
        with open(os.path.join(ROOT, "seccomp", n + ".json")) as f:
            doc = json.load(f)
        rules = set()
        for e in doc.pop("syscalls"):
            for n in e["names"]:
                rules.add((n, e["action"], e.get("errnoRet"), json.dumps(e.get("args"))))
        doc.pop("comment")
        return doc, rules
    d_top, d_rules = load("default")
    p_top, p_rules = load("profiling")
    assert d_top == p_top
    assert p_rules - d_rules == {("perf_event_open", "SCMP_ACT_ALLOW", None, "null")}
    assert d_rules - p_rules == {("perf_event_open", "SCMP_ACT_ERRNO", 1, "null")}


def test_x32_and_foreign_entry_points_are_killed():
    x86 = prog_for("default", "x86_64")
    assert check(x86, "x86_64", 0x40000000 | 39) == KILL_PROCESS          # x32 getpid
    assert check(x86, "x86_64", 20, audit=AUDIT_ARCH_I386) == KILL_PROCESS   # int 0x80 getpid
    assert check(x86, "x86_64", 39, audit=AUDIT["aarch64"]) == KILL_PROCESS
    arm = prog_for("default", "aarch64")
    assert check(arm, "aarch64", 20, audit=AUDIT_ARCH_ARM) == KILL_PROCESS
    assert check(arm, "aarch64", 172, audit=AUDIT["x86_64"]) == KILL_PROCESS


def test_arch_numbers_differ():
    # The same name compiles to each ABI's own number.
    arm = prog_for("default", "aarch64")
    assert AARCH64["keyctl"] != X86_64["keyctl"]
    assert run_bpf(arm, AARCH64["keyctl"], AUDIT["aarch64"]).verdict == EPERM
    assert run_bpf(arm, X86_64["keyctl"], AUDIT["aarch64"]).verdict != EPERM


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("name", ["default", "profiling"])
def test_program_is_small_and_dispatch_is_a_tree(arch, name):
    prog = prog_for(name, arch)
    assert len(prog) % 8 == 0 and len(prog) // 8 < 4096
    worst = max(run_bpf(prog, nr, AUDIT[arch], (0, 0)).steps for nr in range(0, 600))
    # A linear scan would take hundreds of steps for the last syscalls.
    assert worst <= 30, worst


# --- 64-bit argument comparisons -----------------------------------------------

V = 0x1_0000_0005
SAMPLES = [0, 4, 5, 6, 0xFFFFFFFF, 0x1_0000_0000, V - 1, V, V + 1, 0x1_FFFF_FFFF,
           0x2_0000_0000, 0x2_0000_0005, 0x0_0000_0005 | (1 << 63), 2**64 - 1]
OPS = {"SCMP_CMP_EQ": lambda a: a == V, "SCMP_CMP_NE": lambda a: a != V,
       "SCMP_CMP_LT": lambda a: a < V, "SCMP_CMP_LE": lambda a: a <= V,
       "SCMP_CMP_GT": lambda a: a > V, "SCMP_CMP_GE": lambda a: a >= V}


def _write(tmp_path, doc, name="p.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(p)


def _profile(syscalls, default="SCMP_ACT_ERRNO", errno=38, **extra):
    doc = {"defaultAction": default, "defaultErrnoRet": errno,
           "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"], "syscalls": syscalls}
    doc.update(extra)
    return doc


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("index", [0, 5])
def test_64bit_comparisons(tmp_path, op, index):
    path = _write(tmp_path, _profile([{"names": ["read"], "action": "SCMP_ACT_ALLOW",
                                       "args": [{"index": index, "value": V, "op": op}]}],
                                     errno=99))
    prog = prog_for(path, "x86_64")
    for a in SAMPLES:
        args = [0] * 6
        args[index] = a
        want = ALLOW if OPS[op](a) else ("errno", 99)
        assert check(prog, "x86_64", "read", args) == want, hex(a)


def test_masked_eq_spanning_both_halves(tmp_path):
    mask, datum = 0xF_0000_00F0, 0x3_0000_0010
    path = _write(tmp_path, _profile([{"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [
        {"index": 2, "value": mask, "valueTwo": datum, "op": "SCMP_CMP_MASKED_EQ"}]}]))
    prog = prog_for(path, "x86_64")
    for a in (datum, datum | 0xFF0F, 0x3_0000_0000, 0x13_0000_0010, 0x7_0000_0010, 0):
        want = ALLOW if a & mask == datum else ENOSYS
        assert check(prog, "x86_64", "read", (0, 0, a)) == want, hex(a)


def test_negative_values_mean_sign_extended_registers(tmp_path):
    rule = {"names": ["openat"], "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": -100, "op": "SCMP_CMP_EQ"}]}
    path = _write(tmp_path, _profile([rule]))
    prog = prog_for(path, "x86_64")
    assert check(prog, "x86_64", "openat", (-100,)) == ALLOW
    assert check(prog, "x86_64", "openat", (0xFFFFFF9C,)) == ENOSYS


def test_entries_for_one_syscall_are_tried_in_order(tmp_path):
    path = _write(tmp_path, _profile([
        {"names": ["write"], "action": "SCMP_ACT_ERRNO", "errnoRet": 5,
         "args": [{"index": 0, "value": 7, "op": "SCMP_CMP_EQ"}]},
        {"names": ["write"], "action": "SCMP_ACT_LOG",
         "args": [{"index": 0, "value": 7, "op": "SCMP_CMP_GE"}]},
        {"names": ["write"], "action": "SCMP_ACT_TRAP"},
        {"names": ["write"], "action": "SCMP_ACT_ALLOW"},      # unreachable
        {"names": ["read"], "action": "SCMP_ACT_KILL"},
        {"names": ["close"], "action": "SCMP_ACT_ERRNO"},      # errnoRet defaults to EPERM
    ]))
    prog = prog_for(path, "aarch64")
    assert check(prog, "aarch64", "write", (7,)) == ("errno", 5)
    assert check(prog, "aarch64", "write", (8,)) == LOG
    assert check(prog, "aarch64", "write", (6,)) == TRAP
    assert check(prog, "aarch64", "read") == KILL_THREAD
    assert check(prog, "aarch64", "close") == EPERM


def test_includes_and_excludes(tmp_path):
    path = _write(tmp_path, _profile([
        {"names": ["arch_prctl", "read"], "action": "SCMP_ACT_ALLOW",
         "includes": {"arches": ["SCMP_ARCH_X86_64"]}},
        {"names": ["write"], "action": "SCMP_ACT_ALLOW",
         "excludes": {"arches": ["SCMP_ARCH_X86_64"]}},
        {"names": ["close"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
        {"names": ["dup"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "2.6"}},
        {"names": ["dup3"], "action": "SCMP_ACT_ALLOW", "includes": {"minKernel": "999.0"}},
    ]))
    x86, arm = prog_for(path, "x86_64"), prog_for(path, "aarch64")
    assert check(x86, "x86_64", "read") == ALLOW and check(arm, "aarch64", "read") == ENOSYS
    assert check(x86, "x86_64", "arch_prctl") == ALLOW    # absent on aarch64: skipped there
    assert check(x86, "x86_64", "write") == ENOSYS and check(arm, "aarch64", "write") == ALLOW
    assert check(x86, "x86_64", "close") == ENOSYS
    assert check(x86, "x86_64", "dup") == ALLOW and check(x86, "x86_64", "dup3") == ENOSYS


def test_long_jumps_in_a_big_program(tmp_path):
    # Argument rules on 300 syscalls make the tree span far more than the
    # 255 instructions a conditional jump can reach.
    names = sorted(X86_64, key=X86_64.get)[:300]
    rules = [{"names": [n], "action": "SCMP_ACT_ERRNO", "errnoRet": 1 + i % 200,
              "args": [{"index": 1, "value": 0x1_0000_0000 + i, "op": "SCMP_CMP_EQ"}]}
             for i, n in enumerate(names)]
    path = _write(tmp_path, _profile(rules, default="SCMP_ACT_ALLOW", errno=None))
    prog = prog_for(path, "x86_64")
    assert len(prog) // 8 > 2000
    assert any(struct.unpack_from("<HBBI", prog, i)[0] == 0x05 for i in range(0, len(prog), 8))
    for i, n in enumerate(names):
        assert check(prog, "x86_64", n, (0, 0x1_0000_0000 + i)) == ("errno", 1 + i % 200), n
        assert check(prog, "x86_64", n, (0, i)) == ALLOW, n


def test_too_many_instructions_is_an_error(tmp_path):
    # Distinct rules per syscall (identical neighbours would share one range).
    rules = [{"names": [n], "action": "SCMP_ACT_ALLOW", "args": [
        {"index": i, "value": 2**40 + nr * 8 + i, "op": "SCMP_CMP_GT"} for i in range(6)]}
        for n, nr in X86_64.items()]
    path = _write(tmp_path, _profile(rules))
    with pytest.raises(SeccompError, match="too large"):
        prog_for(path, "x86_64")


# --- errors ------------------------------------------------------------------------

@pytest.mark.parametrize("doc,needle", [
    ('{"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [', "not valid JSON"),
    ([1, 2], "top level"),
    (_profile([{"names": ["read"], "action": "SCMP_ACT_BOGUS"}]), "syscalls[0] (read)"),
    (_profile([{"names": ["read"], "action": "SCMP_ACT_ERRNO", "errnoRet": 5000}]), "errnoRet"),
    (_profile([{"names": ["read"], "action": "SCMP_ACT_NOTIFY"}]), "SCMP_ACT_NOTIFY"),
    (_profile([{"names": "read", "action": "SCMP_ACT_ALLOW"}]), "names"),
    (_profile([{"names": ["read"], "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 6, "value": 1, "op": "SCMP_CMP_EQ"}]}]), "index 6"),
    (_profile([{"names": ["read"], "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_SAME"}]}]), "SCMP_CMP_SAME"),
    (_profile([{"names": ["read"], "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": "1", "op": "SCMP_CMP_EQ"}]}]), "64-bit integer"),
    (_profile([], defaultAction=None), "defaultAction"),
    (_profile([], architectures=["SCMP_ARCH_PPC64LE"]), "does not list x86_64"),
    (_profile([{"names": ["raed"], "action": "SCMP_ACT_ERRNO"}], default="SCMP_ACT_ALLOW"),
     "unknown syscall 'raed'"),
])
def test_malformed_profiles_name_file_and_entry(tmp_path, doc, needle):
    path = _write(tmp_path, doc)
    with pytest.raises(SeccompError) as ei:
        prog_for(path, "x86_64")
    msg = ei.value.line()
    assert path in msg and needle in msg, msg
    assert ei.value.hint


def test_unknown_name_in_deny_by_default_profile_is_skipped(tmp_path):
    # Docker profiles list other architectures' calls; with a denying default
    # a name nobody has can only deny more, so it is skipped.
    with_it = _write(tmp_path, _profile([{"names": ["read", "s390_runtime_instr"],
                                          "action": "SCMP_ACT_ALLOW"}]), "a.json")
    without = _write(tmp_path, _profile([{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]),
                     "b.json")
    assert prog_for(with_it, "x86_64") == prog_for(without, "x86_64")


def test_unknown_profile_names_and_paths():
    with pytest.raises(SeccompError, match="unknown seccomp profile 'nosuch'") as ei:
        seccomp.compile_profile("nosuch")
    assert "default" in ei.value.hint
    with pytest.raises(SeccompError, match="cannot read seccomp profile /nonexistent/p.json"):
        seccomp.compile_profile("/nonexistent/p.json")


def test_unsupported_architecture():
    with pytest.raises(SeccompError, match="unsupported architecture ppc64le"):
        seccomp.compile_profile("default", "ppc64le", cache=False)


# --- cache -------------------------------------------------------------------------

@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    # These tests are about the per-user cache: leave the shipped programs out.
    monkeypatch.setattr(seccomp, "_shipped", lambda *a: None)
    return tmp_path / "xdg" / "gpusandbox" / "seccomp"


def _no_compile(*a, **k):
    raise AssertionError("compiled although a valid cache entry exists")


def test_cache_hit_skips_the_compiler(cache_home, monkeypatch):
    first = seccomp.compile_profile("default", "x86_64")
    assert first == prog_for("default", "x86_64")
    assert oct(cache_home.stat().st_mode & 0o777) == "0o700"
    assert oct(cache_home.parent.stat().st_mode & 0o777) == "0o700"
    monkeypatch.setattr(seccomp, "compile_bytes", _no_compile)
    assert seccomp.compile_profile("default", "x86_64") == first


def test_cache_follows_profile_edits_and_arch(cache_home, tmp_path):
    path = _write(tmp_path, _profile([{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]))
    a = seccomp.compile_profile(path, "x86_64")
    assert check(a, "x86_64", "read") == ALLOW
    _write(tmp_path, _profile([{"names": ["read"], "action": "SCMP_ACT_ERRNO"}]))
    b = seccomp.compile_profile(path, "x86_64")
    assert check(b, "x86_64", "read") == EPERM
    c = seccomp.compile_profile(path, "aarch64")
    assert run_bpf(c, AARCH64["read"], AUDIT["aarch64"]).verdict == EPERM


@pytest.mark.parametrize("damage", ["flip_prog", "truncate", "garbage", "empty", "swap_profile"])
def test_corrupt_cache_entries_are_never_trusted(cache_home, damage):
    good = seccomp.compile_profile("default", "x86_64")
    (entry,) = list(cache_home.iterdir())
    blob = bytearray(entry.read_bytes())
    if damage == "flip_prog":
        blob[-3] ^= 0x40              # e.g. turns a RET ERRNO into something else
    elif damage == "truncate":
        blob = blob[:-8]
    elif damage == "garbage":
        blob = bytearray(os.urandom(len(blob)))
    elif damage == "empty":
        blob = bytearray()
    else:                             # entry for other profile bytes, same length
        i = blob.index(b"SCMP_ACT_ALLOW")
        blob[i:i + 14] = b"SCMP_ACT_TRAP "
    entry.write_bytes(bytes(blob))
    assert seccomp.compile_profile("default", "x86_64") == good
    assert entry.read_bytes() != bytes(blob)          # rewritten with a good entry


def test_cache_in_a_shared_directory_is_not_used(cache_home, monkeypatch):
    cache_home.mkdir(parents=True)
    cache_home.chmod(0o777)
    seccomp.compile_profile("default", "x86_64")
    assert list(cache_home.iterdir()) == []
    calls = []
    real = seccomp.compile_bytes
    monkeypatch.setattr(seccomp, "compile_bytes", lambda *a: calls.append(1) or real(*a))
    seccomp.compile_profile("default", "x86_64")
    assert calls == [1]


def test_install_rejects_bytes_that_are_not_a_program():
    with pytest.raises(ValueError):
        seccomp.install(b"\x00" * 7)
    with pytest.raises(ValueError):
        seccomp.install(b"")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give an entry another owner")
def test_cache_entry_owned_by_someone_else_is_not_used(cache_home, monkeypatch):
    seccomp.compile_profile("default", "x86_64")
    (entry,) = list(cache_home.iterdir())
    os.chown(entry, 65534, 65534)
    calls = []
    real = seccomp.compile_bytes
    monkeypatch.setattr(seccomp, "compile_bytes", lambda *a: calls.append(1) or real(*a))
    seccomp.compile_profile("default", "x86_64")
    assert calls == [1] and entry.stat().st_uid == 0


# --- programs shipped next to the profiles ----------------------------------------

@pytest.mark.parametrize("name", seccomp.SHIPPED)
@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_shipped_programs_match_their_profiles(name, arch):
    """A profile edited without `python -m gpusandbox.linux.seccomp --precompile`
    fails here (and would silently fall back to compiling at every launch)."""
    path = seccomp.profile_path(name)
    data = open(path, "rb").read()
    assert seccomp._shipped(path, data, arch) == seccomp.compile_bytes(data, arch, path)


def test_shipped_program_ignored_when_profile_changed(tmp_path):
    src = seccomp.profile_path("default")
    prof = tmp_path / "default.json"
    data = open(src, "rb").read()
    prof.write_bytes(data)
    arch = seccomp.host_arch()
    shipped = open(src[:-5] + f".{arch}.bpf", "rb").read()
    (tmp_path / f"default.{arch}.bpf").write_bytes(shipped)
    assert seccomp._shipped(str(prof), data, arch) is not None
    changed = data.replace(b'"perf_event_open"', b'"perf_event_open", "fanotify_init"', 1)
    assert changed != data
    assert seccomp._shipped(str(prof), changed, arch) is None
    (tmp_path / f"default.{arch}.bpf").write_bytes(shipped[:-8] + b"\0" * 8)
    assert seccomp._shipped(str(prof), data, arch) is None
