"""Unit tests for issue 15: the CUDA driver table, the forward-compat decision
and ELF note reader, the requirement check's brand terms, and the MPS option
parsing and refusals (no privileges; the image is a temporary directory)."""
import json
import os
import struct

import pytest

from gpusandbox.errors import GpuError, UsageError
from gpusandbox.gpu import compat, cudatable, mpscli, require, share
from gpusandbox.gpu.mps import Daemon


# --- the table -------------------------------------------------------------------

def test_table_covers_11_0_to_13_x_without_12_7_and_is_ordered():
    rels = sorted(cudatable.TOOLKIT_DRIVERS)
    assert rels[0] == (11, 0) and rels[-1][0] == 13 and (12, 7) not in rels
    firsts = [cudatable.parse(cudatable.TOOLKIT_DRIVERS[r][0]) for r in rels]
    assert firsts == sorted(firsts)      # a newer release never needs an older driver
    for rel, drivers in cudatable.TOOLKIT_DRIVERS.items():
        assert [cudatable.parse(d) for d in drivers] == sorted(cudatable.parse(d) for d in drivers)
        # 11.0 predates minor-version compatibility's 450.80.02 floor.
        assert cudatable.minor_compat(f"{rel[0]}.{rel[1]}", drivers[0]) is (rel != (11, 0)), rel


def test_table_lookups():
    assert cudatable.toolkit_driver("12.4.1") == ((12, 4), "550.54.14")
    assert cudatable.toolkit_driver("12.7") == ((12, 8), "570.26")
    assert cudatable.toolkit_driver("14.0") is None
    assert cudatable.driver_cuda("535.104.05") == (12, 2)
    assert cudatable.driver_cuda("560.35.03") == (12, 6)
    assert cudatable.minor_compat("12.9", "525.60.13") is True
    assert cudatable.minor_compat("12.9", "520.61.05") is False
    assert cudatable.minor_compat("13.1", "575.57.08") is False
    assert cudatable.minor_compat("10.2", "440.33") is None


def test_ways_out_notes():
    same, fwd = cudatable.ways_out("12.4", "535.104.05", True)
    assert "minor-version compatibility" in same and "--no-require" in same
    assert "data-center" in fwd and "cuda-compat" in fwd
    # Another major: no same-major note; GeForce: the compat way is closed.
    notes = cudatable.ways_out("13.0", "535.104.05", False)
    assert len(notes) == 1 and "error 804" in notes[0]


# --- the ELF note and the decision ----------------------------------------------

def elf_with_note(payload, owner=b"NVIDIA Corporation", section=compat.NOTE_SECTION):
    """A minimal ELF64 little-endian file: a null section, the note, .shstrtab."""
    desc = json.dumps(payload).encode() if not isinstance(payload, bytes) else payload
    name = owner + b"\0"
    note = struct.pack("<III", len(name), len(desc), 1) + name.ljust((len(name) + 3) & ~3, b"\0") \
        + desc.ljust((len(desc) + 3) & ~3, b"\0")
    strtab = b"\0" + section + b"\0.shstrtab\0"
    note_off = 64
    str_off = note_off + len(note)
    sh_off = (str_off + len(strtab) + 7) & ~7
    hdr = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    hdr += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 2)
    secs = [bytes(64),
            struct.pack("<IIQQQQIIQQ", 1, 7, 2, 0, note_off, len(note), 0, 0, 4, 0),
            struct.pack("<IIQQQQIIQQ", 1 + len(section) + 1, 3, 0, 0, str_off, len(strtab),
                        0, 0, 1, 0)]
    body = hdr + note + strtab
    return body + bytes(sh_off - len(body)) + b"".join(secs)


def image(tmp_path, libs, note=None, link=True):
    d = tmp_path / "img" / "usr/local/cuda-12.9/compat"
    d.mkdir(parents=True)
    os.symlink("cuda-12.9", tmp_path / "img/usr/local/cuda")
    for n in libs:
        # Without a note: a well-formed ELF file whose only note is another's.
        data = elf_with_note(note) if note is not None \
            else elf_with_note(NOTE, section=b".note.gnu.build-id")
        (d / n).write_bytes(data)
    if link:
        os.symlink(libs[0], d / "libcuda.so.1")
    return str(tmp_path / "img")


NOTE = {"format": 1, "CUDA version": "12.9", "driver": [535, 550, 560, 565, 570, 575]}


def test_read_note(tmp_path):
    p = tmp_path / "lib"
    p.write_bytes(elf_with_note(NOTE))
    with open(p, "rb") as f:
        assert compat.read_note(f.fileno()) == NOTE
    p.write_bytes(elf_with_note(NOTE, section=b".note.other"))
    with open(p, "rb") as f:
        assert compat.read_note(f.fileno()) is None
    p.write_bytes(elf_with_note(NOTE, owner=b"Someone Else"))
    with open(p, "rb") as f:
        assert compat.read_note(f.fileno()) is None
    p.write_bytes(elf_with_note(NOTE)[:200])          # section headers cut off
    with open(p, "rb") as f:
        with pytest.raises(ValueError):
            compat.read_note(f.fileno())


def test_a_hostile_note_never_raises_past_decide(tmp_path):
    deep = b"[" * 60000 + b"]" * 60000        # deeper than json's recursion limit
    root = image(tmp_path, ["libcuda.so.575.57.08"], note=deep[:65000])
    d = compat.decide("auto", root, "550.54.15", ["Tesla"])
    assert not d.use and "unreadable" in d.reason


def test_decide_uses_compat_on_a_listed_branch(tmp_path):
    root = image(tmp_path, ["libcuda.so.575.57.08", "libnvidia-ptxjitcompiler.so.575.57.08"], NOTE)
    d = compat.decide("auto", root, "550.54.15", ["Nvidia"])
    assert d.use and d.drivers == NOTE["driver"] and "branch 550" in d.reason
    assert ("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1") in d.entries


@pytest.mark.parametrize("host,brands,note,want", [
    ("545.23.08", ["Tesla"], NOTE, "not the host's 545"),
    ("550.54.15", ["GeForce"], NOTE, "brand is GeForce"),
    ("550.54.15", [None], NOTE, "brand is unknown"),
    ("580.65.06", ["Nvidia"], NOTE, "not newer than the host"),
    ("575.57.08", ["Nvidia"], None, "not newer"),
])
def test_decide_refuses(tmp_path, host, brands, note, want):
    root = image(tmp_path, ["libcuda.so.575.57.08"], note)
    d = compat.decide("auto", root, host, brands)
    assert not d.use and want in d.reason, d.reason


def test_decide_without_note_uses_a_newer_branch_and_force_and_off(tmp_path):
    root = image(tmp_path, ["libcuda.so.575.57.08"], note=None)
    assert compat.decide("auto", root, "550.54.15", ["Tesla"]).use
    assert not compat.decide("off", root, "550.54.15", ["Tesla"]).use
    assert compat.decide("force", root, "550.54.15", ["GeForce"]).use


def test_decide_needs_exactly_one_libcuda(tmp_path):
    root = image(tmp_path, ["libcuda.so.575.57.08", "libcuda.so.560.35.03"], NOTE)
    assert "not exactly one" in compat.decide("auto", root, "550.54.15", ["Tesla"]).reason
    with pytest.raises(GpuError):
        compat.decide("force", root, "550.54.15", ["Tesla"])
    with pytest.raises(GpuError):
        compat.decide("force", str(tmp_path), "550.54.15", ["Tesla"])   # no compat dir


def test_prefer_replaces_the_injected_names():
    from gpusandbox.gpu.ldcache import Entry
    entries = [Entry(b"libcuda.so.1", b"/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
               Entry(b"libnvidia-ml.so.1", b"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")]
    d = compat.Decision(True, "x", "575.57.08", [("libcuda.so.1", "/c/libcuda.so.1")])
    out = compat.prefer(entries, d, lambda n, p: Entry(n.encode(), p.encode()))
    assert sorted((e.name, e.path) for e in out) == [
        (b"libcuda.so.1", b"/c/libcuda.so.1"),
        (b"libnvidia-ml.so.1", b"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1")]


# --- the requirement check's brand terms ------------------------------------------

class _Gpu:
    def __init__(self, model):
        self.model = model


class _Host:
    version = "535.104.05"

    def __init__(self, model):
        self.gpus = [_Gpu(model)]


REQ = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=535,driver<536 "
                              "brand=geforce,driver>=535,driver<536"}


def test_brand_term_passes_with_compat_and_is_refused_without():
    used = compat.Decision(True, "used")
    host = _Host("Tesla V100-SXM2-16GB")
    assert require.check(REQ, None, host, (12, 2), {}, compat=used) is None
    assert require.check(REQ, None, host, (12, 2), {}, compat=None) is None   # as before
    gf = _Host("NVIDIA GeForce RTX 4090")
    with pytest.raises(GpuError) as e:
        require.check(REQ, None, gf, (12, 2), {},
                      compat=compat.Decision(False, "this GPU's brand is GeForce"))
    assert "brand=geforce,driver>=535,driver<536" in e.value.why and "GeForce" in e.value.why
    assert "minor-version compatibility" in e.value.hint and "804" in e.value.hint
    # A cuda term that holds needs no compat libraries.
    assert require.check(REQ, None, gf, (12, 4), {}, compat=compat.Decision(False, "x")) is None


def test_ceiling_hint_names_the_other_ways_out():
    with pytest.raises(GpuError) as e:
        require.check({"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}, None, _Host("NVIDIA H100"),
                      (12, 2), {})
    assert "minor-version compatibility" in e.value.hint
    assert "cuda-compat" in e.value.hint and "data-center" in e.value.hint


# --- sharing ---------------------------------------------------------------------

@pytest.mark.parametrize("text,mib", [("8G", 8192), ("8GiB", 8192), ("512M", 512),
                                      ("1.5g", 1536), ("1T", 1 << 20)])
def test_parse_memory(text, mib):
    assert share.parse_memory(text) == mib


@pytest.mark.parametrize("text", ["", "8", "8X", "-1G", "0M", "G", "1e3G"])
def test_parse_memory_refuses(text):
    with pytest.raises(UsageError):
        share.parse_memory(text)


def test_parse_compute_and_mode():
    assert share.parse_compute("30%") == 30 and share.parse_compute("100") == 100
    for bad in ("0", "101", "x%", "", "30.5"):
        with pytest.raises(UsageError):
            share.parse_compute(bad)
    assert share.parse_mode("Exclusive_Process\n") == "Exclusive_Process"
    assert share.parse_mode("Default") == "Default" and share.parse_mode("[N/A]") is None
    assert "tier 2" in share.tier_line("Exclusive_Process")
    assert "tier 1" in share.tier_line(None) and "assumed" in share.tier_line(None)


def test_readback_tolerance():
    assert mpscli.readback_ok(want_mib=1044, shown="1G")
    assert mpscli.readback_ok(want_mib=8192, shown="8G")
    assert not mpscli.readback_ok(want_mib=8192, shown="7G")
    assert mpscli.readback_ok(want_mib=512, shown="512M")
    assert mpscli.readback_ok(want_pct=25, shown_pct="25.0")
    assert not mpscli.readback_ok(want_pct=25, shown_pct="30.0")


class _ShareGpu:
    def __init__(self, model, index=0):
        self.model, self.index, self.uuid = model, index, "GPU-12345678-aaaa"


class _Sel:
    def __init__(self, gpus, migs=()):
        self.gpus, self.migs, self.none = list(gpus), list(migs), False
        self.caps, self.visible = ("utility", "compute"), "0"


class _ShareHost:
    def __init__(self):
        self.migs, self.bins, self.driver_root = [], {}, "/drv"


class _Spec:
    user = None


def test_check_gpu_refusals(monkeypatch):
    host = _ShareHost()
    monkeypatch.setattr(share, "compute_mode", lambda h, g: "Default")
    gpu, mode = share.check_gpu(host, _Sel([_ShareGpu("NVIDIA H100 80GB HBM3")]), _Spec)
    assert mode == "Default"
    with pytest.raises(GpuError) as e:
        share.check_gpu(host, _Sel([_ShareGpu("Tesla P100-PCIE-16GB")]), _Spec)
    assert "compute capability 6.0 is below 7.0" in e.value.line()
    with pytest.raises(UsageError, match="exactly one GPU"):
        share.check_gpu(host, _Sel([_ShareGpu("NVIDIA H100"), _ShareGpu("NVIDIA H100", 1)]), _Spec)
    monkeypatch.setattr(share, "compute_mode", lambda h, g: "Prohibited")
    with pytest.raises(GpuError) as e:
        share.check_gpu(host, _Sel([_ShareGpu("NVIDIA H100")]), _Spec)
    assert "PROHIBITED" in e.value.line()
    host.migs = [type("Mig", (), {"gpu": _ShareGpu("NVIDIA H100")})()]
    monkeypatch.setattr(share, "compute_mode", lambda h, g: "Default")
    with pytest.raises(GpuError) as e:
        share.check_gpu(host, _Sel([_ShareGpu("NVIDIA H100")]), _Spec)
    assert "MIG is enabled" in e.value.line()


def test_daemon_paths_and_binaries(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    host = _ShareHost()
    d = Daemon(host, _ShareGpu("NVIDIA H100"), {"XDG_RUNTIME_DIR": "/nonexistent"})
    assert d.pipe == "/tmp/gpusandbox-4242/mps/gpu-12345678/pipe"
    d.check_paths()
    with pytest.raises(GpuError) as e:
        d.binary()
    assert "no nvidia-cuda-mps-control" in e.value.line()
    d.pipe = "/" + "x" * 90
    with pytest.raises(GpuError) as e:
        d.check_paths()
    assert "unix socket" in e.value.line()


def test_final_env_overrides_every_mps_variable():
    env = {"CUDA_MPS_PIPE_DIRECTORY": "/img", "CUDA_MPS_LOG_DIRECTORY": "/l",
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "90", "PATH": "/bin"}
    forced = {"CUDA_MPS_PIPE_DIRECTORY": "/run/nvidia-mps",
              "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M"}
    assert share.final_env(env, forced) == dict(forced, PATH="/bin")


def test_dmem_status(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids\n")
    ok, why = share.dmem_status(str(tmp_path))
    assert not ok and "no dmem controller" in why
    (tmp_path / "cgroup.controllers").write_text("cpu dmem memory\n")
    (tmp_path / "dmem.capacity").write_text("drm/0000:03:00.0/vram0 8514437120\n")
    assert "no NVIDIA region" in share.dmem_status(str(tmp_path))[1]
    (tmp_path / "dmem.capacity").write_text("nvidia/0000:06:00.0/vidmem 85899345920\n")
    ok, why = share.dmem_status(str(tmp_path))
    assert not ok and "does not set dmem limits" in why


def test_mps_command_usage_errors_are_one_line_exit_125():
    for argv in ([], ["start"], ["up", "--bogus"]):
        with pytest.raises(UsageError) as e:
            mpscli.main(argv)
        assert e.value.code == 125 and e.value.line().startswith("gpusandbox mps: ")
