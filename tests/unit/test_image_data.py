"""Image data is untrusted input to the host side (issue 17 items C, F, 8, 10):
every file the launcher reads from an image (config.json, /etc/environment,
a toolkit's version.json, ld.so.cache, library file names) either parses or
raises a SandboxError (exit 125 with one line), never another exception, and
costs no more than its size says.  The fuzzers feed thousands of mutated
files through the same functions plan.build uses."""
import json
import os
import random
import stat
import struct
import tracemalloc

import pytest

from gpusandbox import doctor, environ as envmod
from gpusandbox.errors import SandboxError
from gpusandbox import gpu
from gpusandbox.gpu import ceiling, inject, ldcache, require
from gpusandbox import isdigits, number

CONFIG = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
          "process": {"cwd": "/work", "env": ["PATH=/usr/bin", "CUDA_VERSION=12.4.1",
                                               "NVIDIA_REQUIRE_CUDA=cuda>=12.4"]}}
# Values that broke the launcher: Unicode digits, numbers past int()'s
# conversion limit, NULs, wrong types, deep nesting.
EVIL_STR = ["12.²", "1" * 5000, "١٢.٤", "12.4\0", "", "=", "\udcff", "12." * 3000,
            "cuda>=" + "9" * 5000, "cuda>=1²", "x" * 70000]
EVIL_VAL = [5, -1, 1e308, None, True, [], {}, [5], {"a": 5}, "1" * 5000, "12.²"]


def _write(root, rel, data, mode=0o644):
    p = os.path.join(root, rel.lstrip("/"))
    os.makedirs(os.path.dirname(p), exist_ok=True)
    if os.path.lexists(p):
        os.unlink(p)
    with open(p, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    os.chmod(p, mode)


class Host:
    version = "550.54.15"
    gpus = []


def _requirement_path(env, root):
    """What plandev._gpu does with an image's rows, minus the GPU layer."""
    reqs = require.requirements(env, root)
    for src, expr in reqs:
        require.parse_constraint(expr, src)
    return require.check(env, root, Host(), (12, 4), {})


# --- the ASCII digit check ----------------------------------------------------

@pytest.mark.parametrize("s, want", [("12", True), ("²", False), ("١٢", False), ("", False),
                                     ("1a", False), ("٣", False), (5, False)])
def test_isdigits_is_ascii_only(s, want):
    assert isdigits(s) is want


def test_number_refuses_what_int_would_choke_on():
    assert number("1" * 5000) is None and number("12") == 12 and number("²") is None


# --- config.json (F) ----------------------------------------------------------------

@pytest.mark.parametrize("conf", [
    b'{"process": {"env": 5}}',
    b'{"process": {"env": [5]}}',
    b'{"process": {"env": "A=1"}}',
    b'{"process": 5}',
    b'{"process": {"cwd": 5}}',
    b'{"process": {"env": ["A=\\u0000"]}}',
    b"[" * 100000 + b"]" * 100000,
    b'{"a":' * 100000 + b"1" + b"}" * 100000,
    b"\xff\xfe",
    b"5",
])
def test_bad_config_json_is_one_usage_error(tmp_path, conf):
    with pytest.raises(SandboxError) as e:
        envmod.image_env(str(tmp_path), conf)
    assert e.value.code == 125 and "\n" not in e.value.line()


def _mutate_json(rng, value, depth=0):
    """A copy of value with one random part replaced by something hostile."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        k = rng.choice(list(value))
        return dict(value, **{k: _mutate_json(rng, value[k], depth + 1)})
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        return value[:i] + [_mutate_json(rng, value[i], depth + 1)] + value[i + 1:]
    pick = rng.random()
    if pick < 0.4:
        return rng.choice(EVIL_VAL)
    if pick < 0.8:
        return rng.choice(EVIL_STR) if not isinstance(value, str) or rng.random() < 0.5 \
            else value.split("=")[0] + "=" + rng.choice(EVIL_STR)
    return [value] * rng.randrange(1, 4)


def _mutate_bytes(rng, data):
    data = bytearray(data)
    for _ in range(rng.randrange(1, 6)):
        op = rng.random()
        pos = rng.randrange(len(data) + 1)
        if op < 0.3 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif op < 0.5:
            data[pos:pos] = rng.choice(EVIL_STR).encode("utf-8", "surrogatepass")[:200]
        elif op < 0.7:
            del data[pos:pos + rng.randrange(1, 16)]
        elif op < 0.85:
            data[pos:pos] = struct.pack("<I", rng.choice([0, 1, 0xFFFFFFFF, 0x7FFFFFFF, 48,
                                                          len(data), rng.randrange(1 << 32)]))
        else:
            data = data[:pos]
    return bytes(data)


def _expect_clean(fn, *args):
    try:
        fn(*args)
    except SandboxError as e:
        assert e.code == 125 and "\n" not in e.line()


def test_fuzz_config_json_through_the_plan(tmp_path):
    rng = random.Random(17)
    root = str(tmp_path)
    for i in range(3000):
        if i % 3:
            conf = json.dumps(_mutate_json(rng, CONFIG)).encode()
        else:
            conf = _mutate_bytes(rng, json.dumps(CONFIG).encode())
        try:
            items, _cwd = envmod.image_env(root, conf)
        except SandboxError as e:
            assert e.code == 125
            continue
        _expect_clean(_requirement_path, dict(items), None)


def test_fuzz_etc_environment_through_the_plan(tmp_path):
    rng = random.Random(18)
    root = str(tmp_path)
    seed = b"PATH=/usr/bin\nexport CUDA_VERSION=12.4.1\nNVIDIA_REQUIRE_CUDA='cuda>=12.0'\n"
    for i in range(3000):
        _write(root, "/etc/environment", _mutate_bytes(rng, seed))
        items, _ = envmod.image_env(root, None)
        for k, v in items:
            assert isinstance(k, str) and isinstance(v, str) and "\0" not in v
        _expect_clean(_requirement_path, dict(items), None)


# --- what the image carries: version files, library names (F, C) ------------------

def test_fuzz_toolkit_version_files_and_library_names(tmp_path):
    rng = random.Random(19)
    root = str(tmp_path)
    seed = json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.6.2"}})
    names = ["libcudart.so.12.4.127", "libcudart.so.12", "libcudart.so.1².0"]
    for i in range(1500):
        cfg = json.loads(seed)
        data = (json.dumps(_mutate_json(rng, cfg)).encode() if i % 2
                else _mutate_bytes(rng, seed.encode()))
        _write(root, "/usr/local/cuda/version.json", data)
        name = rng.choice(names) if i % 3 else \
            "libcudart.so." + rng.choice(EVIL_STR)[:200].replace("/", "").replace("\0", "")
        d = os.path.join(root, "usr/local/cuda-12.0/lib64")
        os.makedirs(d, exist_ok=True)
        for old in os.listdir(d):
            os.unlink(os.path.join(d, old))
        if name and name not in (".", ".."):
            try:
                _write(root, f"/usr/local/cuda-12.0/lib64/{name}", b"")
            except (OSError, ValueError, UnicodeEncodeError):
                pass
        _expect_clean(_requirement_path, {}, root)


@pytest.mark.parametrize("env", [{"CUDA_VERSION": "12.²"}, {"CUDA_VERSION": "1" * 5000 + ".0"},
                                 {"NVIDIA_REQUIRE_CUDA": "cuda>=" + "1" * 5000},
                                 {"NVIDIA_REQUIRE_CUDA": "cuda>=12.²"}])
def test_bad_versions_are_gpu_errors_with_a_short_line(env):
    with pytest.raises(SandboxError) as e:
        _requirement_path(env, None)
    assert e.value.code == 125 and len(e.value.line()) < 400


def test_unicode_digit_library_names_and_typed_version_json_are_ignored(tmp_path):
    root = str(tmp_path)
    _write(root, "/usr/lib/x86_64-linux-gnu/libcudart.so.1².0", b"")
    _write(root, "/usr/local/cuda/version.json", b'{"cuda": {"version": 12.4}}')
    assert gpu.image_cuda_version(root) is None


# --- ld.so.cache (C, F) ----------------------------------------------------------------

def _cache_bomb(nentries, strlen, terminated=True):
    """A cache whose entries all name one string of strlen bytes."""
    hdr_size, ent = 48, struct.Struct("<iIIIQ")
    table = b"".join(ent.pack(0x0303, 0, 0, 0, 0) for _ in range(nentries))
    strings = b"L" * strlen + (b"\0" if terminated else b"")
    off = hdr_size + len(table)
    table = b"".join(ent.pack(0x0303, off, off, 0, 0) for _ in range(nentries))
    header = struct.pack("<20sIIB3xI12x", ldcache.NEW_MAGIC, nentries, len(strings), 2, 0)
    return header + table + strings


@pytest.mark.parametrize("nentries, strlen", [(8000, 64 << 10), (60000, 4000)])
def test_cache_whose_entries_share_one_string_costs_its_size(nentries, strlen):
    data = _cache_bomb(nentries, strlen)
    tracemalloc.start()
    try:
        try:
            entries = ldcache.parse(data)
        except ldcache.CacheError:
            entries = None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # Copying the string per entry would take nentries * strlen * 2 (0.5-1 GB).
    assert peak < 64 << 20, peak
    if entries is not None:
        assert len({id(e.path) for e in entries}) == 1


def test_fuzz_ld_so_cache(tmp_path):
    rng = random.Random(20)
    seed = ldcache.build([ldcache.Entry(b"libc.so.6", b"/lib/x86_64-linux-gnu/libc.so.6"),
                          ldcache.Entry(b"libm.so.6", b"/lib/x86_64-linux-gnu/libm.so.6",
                                        hwcaps=b"x86-64-v3", hwcap=1 << 62)])
    for _ in range(4000):
        try:
            ldcache.parse(_mutate_bytes(rng, seed))
        except ldcache.CacheError:
            pass
    root = str(tmp_path)
    for _ in range(200):   # the launcher's own entry point never raises
        _write(root, "/etc/ld.so.cache", _mutate_bytes(rng, seed))
        assert isinstance(inject.image_cache(root), list)


# --- the carried-CUDA scan (C) ------------------------------------------------------------

def test_toolkit_link_fan_out_is_bounded(tmp_path, monkeypatch):
    root = str(tmp_path)
    lib = os.path.join(root, "opt/one/lib64")
    os.makedirs(lib)
    for k in range(300):
        open(os.path.join(lib, f"libcudart.so.12.{k}"), "w").close()
    os.makedirs(os.path.join(root, "usr/local"))
    for n in range(300):
        os.symlink("/opt/one", os.path.join(root, f"usr/local/cuda-{n}"))
    calls = []
    from gpusandbox import gpu
    real = gpu._listdir_in_root
    monkeypatch.setattr(gpu, "_listdir_in_root",
                        lambda *a, **kw: calls.append(a[1]) or real(*a, **kw))
    reads = []
    from gpusandbox.linux import sys as lsys
    real_read = lsys.read_in_root
    monkeypatch.setattr(lsys, "read_in_root",
                        lambda *a, **kw: reads.append(a[1]) or real_read(*a, **kw))
    gpu.image_cuda_version(root)
    # 7 library directories and /usr/local, at most 2 per looked-at toolkit.
    assert len(calls) <= 8 + 2 * gpu._MAX_TOOLKITS, len(calls)
    assert len(reads) <= 2 + 2 * gpu._MAX_TOOLKITS, len(reads)


def test_links_to_one_toolkit_are_read_once(tmp_path):
    root = str(tmp_path)
    lib = os.path.join(root, "opt/one/lib64")
    os.makedirs(lib)
    for k in (1, 4, 2):
        open(os.path.join(lib, f"libcudart.so.12.{k}"), "w").close()
    os.makedirs(os.path.join(root, "usr/local"))
    for n in ("12.4", "12.1", "12.2"):
        os.symlink("/opt/one", os.path.join(root, f"usr/local/cuda-{n}"))
    (major_minor, where) = gpu.image_cuda_version(root)
    assert major_minor == (12, 1) and where.startswith("/usr/local/cuda-12.1/")


# --- -e / --env-file count for the requirement check (issue 16 item 1) --------------------

class Spec:
    env_host = False

    def __init__(self, env_set=(), env_files=()):
        self.env_set, self.env_files = list(env_set), list(env_files)


def test_user_rows_follow_the_table_order(tmp_path):
    f = tmp_path / "env"
    f.write_text("NVIDIA_DISABLE_REQUIRE=false\nNVIDIA_REQUIRE_CUDA=cuda>=99.0\n")
    rows = envmod.user_rows(Spec(["NVIDIA_DISABLE_REQUIRE=true", "HOSTVAR"], [str(f)]),
                            {"HOSTVAR": "h"})
    env = dict([("NVIDIA_REQUIRE_CUDA", "cuda>=12.8")] + rows)
    assert env == {"NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": "true",
                   "HOSTVAR": "h"}
    assert require.check(env, None, Host(), (12, 4), {}).startswith("warning: ")
    del env["NVIDIA_DISABLE_REQUIRE"]
    with pytest.raises(SandboxError):
        require.check(env, None, Host(), (12, 4), {})


# --- doctor inspects what the launcher runs (item 10) ---------------------------------------

def _rootfs(d):
    os.makedirs(os.path.join(d, "bin"))
    os.makedirs(os.path.join(d, "etc"))


@pytest.mark.parametrize("root_path", ["/", "..", "other"])
def test_doctor_ignores_the_bundles_root_path(tmp_path, root_path):
    bundle = tmp_path / "bundle"
    _rootfs(str(bundle / "rootfs"))
    _rootfs(str(bundle / "other"))
    (bundle / "config.json").write_text(json.dumps(
        {"root": {"path": root_path}, "process": {"env": ["A=1"]}}))
    root, env = doctor.load_image(str(bundle))
    from gpusandbox.imageroot import image_root
    want, fd, _ = image_root(str(bundle))
    os.close(fd)
    assert root == want == str(bundle / "rootfs") and env == {"A": "1"}


@pytest.mark.parametrize("conf", [b'{"process": {"env": 5}}', b"[" * 100000])
def test_doctor_reports_a_bad_bundle_as_a_failed_check(tmp_path, conf):
    _rootfs(str(tmp_path / "rootfs"))
    (tmp_path / "config.json").write_bytes(conf)
    checks = doctor.check_image(doctor.Options(image=str(tmp_path)), None, None, None)[0]
    assert checks[0].name == "rootfs" and checks[0].status == doctor.FAIL


# --- the CUDA ceiling cache (item 8) ---------------------------------------------------------

class LibHost:
    def __init__(self, path, version="550.54.15"):
        class Lib:
            family, bits, host_path = "libcuda", 64, path
        self.libs = [Lib()]
        self.version = version


def _fake_helper(answer, calls):
    class Res:
        returncode, stdout = 0, answer

    def helper(code, args, timeout=20):
        calls.append(args)
        return Res()
    return helper


def test_ceiling_is_cached_per_library_identity(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    lib = tmp_path / "libcuda.so.550.54.15"
    lib.write_bytes(b"x" * 100)
    calls = []
    monkeypatch.setattr(ceiling, "_helper", _fake_helper("0 12040\n", calls))
    host = LibHost(str(lib))
    assert ceiling.driver_cuda_version(host) == (12, 4)
    assert ceiling.driver_cuda_version(host) == (12, 4)
    assert len(calls) == 1
    entries = list((tmp_path / "cache/gpusandbox/ceiling").iterdir())
    assert len(entries) == 1 and stat.S_IMODE(entries[0].stat().st_mode) & 0o022 == 0
    # Another driver version or a replaced library is another key.
    assert ceiling.driver_cuda_version(LibHost(str(lib), "555.42.02")) == (12, 4)
    lib.write_bytes(b"y" * 101)
    assert ceiling.driver_cuda_version(host) == (12, 4)
    assert len(calls) == 3


@pytest.mark.parametrize("content", ["KEY\n99.9\n", "KEY\n12.²\n", "KEY\n1" + "2" * 5000 + ".0\n",
                                     "other key\n99.9\n", "KEY\n99.9\nextra\n", "\xff"])
def test_a_forged_or_broken_cache_entry_is_not_believed(tmp_path, monkeypatch, content):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    lib = tmp_path / "libcuda.so.1"
    lib.write_bytes(b"x")
    host = LibHost(str(lib))
    key = ceiling._cache_key(host, str(lib))
    path = ceiling._cache_file(key, create=True)
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(content.replace("KEY", key) if content != "KEY\n99.9\n" else f"{key}\n99.9\n")
    if content == "KEY\n99.9\n":
        os.chmod(path, 0o666)     # writable by others: not ours to trust
    calls = []
    monkeypatch.setattr(ceiling, "_helper", _fake_helper("0 12040\n", calls))
    assert ceiling.driver_cuda_version(host) == (12, 4) and len(calls) == 1
