"""The image requirement check (gpusandbox/gpu/require.py)."""
import json
import os

import pytest

from gpusandbox.errors import GpuError
from gpusandbox import gpu
from gpusandbox.gpu import require
from tests.unit.gpu_fixtures import HAVE_GCC, HAVE_LDCONFIG, IS_ROOT, FakeDriver


class Gpu:
    def __init__(self, model, minor=0):
        self.model = model
        self.minor = minor


class Host:
    def __init__(self, driver="535.104.05", models=("NVIDIA H100 80GB HBM3",)):
        self.version = driver
        self.gpus = [Gpu(m, i) for i, m in enumerate(models)]


def _no_ceiling():
    raise AssertionError("the CUDA ceiling helper must not run here")


# --- grammar -----------------------------------------------------------------

def test_space_is_or_comma_is_and():
    alts = require.parse_constraint("cuda>=12.4 brand=tesla,driver>=470,driver<471")
    assert alts == [[("cuda", ">=", "12.4")],
                    [("brand", "=", "tesla"), ("driver", ">=", "470"), ("driver", "<", "471")]]


@pytest.mark.parametrize("expr", ["cuda=>12", "cuda", "cuda>=", "gpu>=1", "brand<tesla",
                                  "cuda>=12.x", "driver>=550.", "=12"])
def test_malformed_constraints_are_refused_with_the_variable_named(expr):
    with pytest.raises(GpuError) as e:
        require.parse_constraint(expr, "NVIDIA_REQUIRE_X")
    assert "NVIDIA_REQUIRE_X" in e.value.line()
    assert e.value.hint and e.value.code == 125


@pytest.mark.parametrize("expr,facts,want", [
    ("cuda>=12.4", dict(cuda="12.4"), True),
    ("cuda>=12.4", dict(cuda="12.2"), False),
    ("cuda=12.4", dict(cuda="12.4.0"), True),          # trailing zeros do not count
    ("cuda>=12.4.1", dict(cuda="12.4"), False),
    ("cuda!=12.4", dict(cuda="12.4"), False),
    ("cuda<12", dict(cuda="11.8"), True),
    ("cuda>12.3", dict(cuda="12.10"), True),            # numeric, not lexical
    ("driver>=550.54.15", dict(driver="550.54.14"), False),
    ("driver<=550.54.15", dict(driver="550.54.15"), True),
    ("arch>=8.0", dict(arch="9.0"), True),
    ("arch>=8.0", dict(arch="7.5"), False),
    ("brand=Tesla", dict(brand="tesla"), True),         # names compare case-insensitively
    ("brand!=geforce", dict(brand="GeForce"), False),
    # OR of ANDs
    ("cuda>=12.4 brand=tesla,driver>=470,driver<471", dict(cuda="11.4", brand="Tesla", driver="470.82.01"), True),
    ("cuda>=12.4 brand=tesla,driver>=470,driver<471", dict(cuda="11.4", brand="GeForce", driver="470.82.01"), False),
    ("cuda>=12.4 brand=tesla,driver>=470,driver<471", dict(cuda="11.4", brand="Tesla", driver="535.1"), False),
])
def test_evaluate(expr, facts, want):
    assert require.evaluate(expr, facts) is want


def test_unknown_facts_make_the_result_unknown_not_true():
    assert require.evaluate("arch>=8.0", dict(arch=None)) is None
    # a known-true alternative wins over an unknown one
    assert require.evaluate("arch>=8.0 cuda>=12", dict(arch=None, cuda="12.4")) is True
    # a known-false atom decides its alternative even beside an unknown one
    assert require.evaluate("arch>=8.0,cuda>=13", dict(arch=None, cuda="12.4")) is False


# --- the launch-time check ------------------------------------------------------

def test_driver_older_than_the_image_cuda_refuses_with_both_ways_out():
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470,driver<471"}
    with pytest.raises(GpuError) as e:
        require.check(env, None, Host("535.104.05"), (12, 2), {})
    err = e.value
    assert err.code == 125
    line = err.line()
    assert "cuda>=12.4" in line and "NVIDIA_REQUIRE_CUDA" in line
    assert "535.104.05" in line and "up to 12.2" in line
    assert "\n" not in line
    assert "CUDA 12.2 or older" in err.hint
    assert "550.54.14" in err.hint          # the first Linux driver of CUDA 12.4
    assert "--no-require" in err.hint


def test_a_driver_that_meets_the_image_passes_silently():
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}
    assert require.check(env, None, Host("550.54.15"), (12, 4), {}) is None


def test_minimum_driver_of_a_release_without_its_own_row_is_the_next_release():
    with pytest.raises(GpuError) as e:
        require.check({"NVIDIA_REQUIRE_CUDA": "cuda>=12.7"}, None, Host(), (12, 2), {})
    assert "570.26" in e.value.hint and "CUDA 12.8" in e.value.hint


@pytest.mark.parametrize("where", ["image", "caller"])
def test_nvidia_disable_require_skips_with_a_warning(where):
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0"}
    environ = {}
    (env if where == "image" else environ)["NVIDIA_DISABLE_REQUIRE"] = "true"
    warning = require.check(env, None, Host(), _no_ceiling, environ)
    assert warning and "NVIDIA_DISABLE_REQUIRE" in warning and "skipped" in warning


def test_no_require_option_skips_with_a_warning():
    warning = require.check({"NVIDIA_REQUIRE_CUDA": "cuda>=13.0"}, None, Host(), _no_ceiling, {},
                            no_require=True)
    assert "--no-require" in warning


def test_disable_require_false_does_not_skip():
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0", "NVIDIA_DISABLE_REQUIRE": "false"}
    with pytest.raises(GpuError):
        require.check(env, None, Host(), (12, 2), {})


def test_legacy_cuda_version_implies_cuda_major_minor():
    env = {"CUDA_VERSION": "12.4.1"}
    with pytest.raises(GpuError) as e:
        require.check(env, None, Host(), (12, 3), {})
    assert "cuda>=12.4" in e.value.line() and "CUDA_VERSION=12.4.1" in e.value.line()
    # 12.4.1 needs only 12.4: the patch level is not a driver requirement
    assert require.check(env, None, Host(), (12, 4), {}) is None


def test_nvidia_require_cuda_overrides_the_legacy_variable():
    env = {"CUDA_VERSION": "12.4.1", "NVIDIA_REQUIRE_CUDA": "cuda>=11.8"}
    assert require.check(env, None, Host(), (12, 2), {}) is None


def test_invalid_legacy_cuda_version_is_named():
    with pytest.raises(GpuError) as e:
        require.check({"CUDA_VERSION": "twelve"}, None, Host(), (12, 2), {})
    assert "CUDA_VERSION" in e.value.line()


def test_ceiling_helper_runs_only_for_cuda_constraints():
    calls = []

    def ceiling():
        calls.append(1)
        return (12, 4)

    assert require.check({"NVIDIA_REQUIRE_DRIVER": "driver>=500"}, None, Host(), ceiling, {}) is None
    assert calls == []
    assert require.check({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, None, Host(), ceiling, {}) is None
    assert calls == [1]
    assert require.check({}, None, Host(), ceiling, {}) is None
    assert calls == [1]


def test_driver_constraint():
    with pytest.raises(GpuError) as e:
        require.check({"NVIDIA_REQUIRE_DRIVER": "driver>=550"}, None, Host("535.104.05"), (12, 2), {})
    assert "driver>=550" in e.value.line() and "driver 535.104.05" in e.value.line()


def test_arch_constraint_is_checked_on_every_selected_gpu():
    host = Host(models=("NVIDIA H100 80GB HBM3", "Tesla T4"))
    env = {"NVIDIA_REQUIRE_ARCH": "arch>=8.0"}
    with pytest.raises(GpuError) as e:
        require.check(env, None, host, (12, 4), {})
    assert "Tesla T4" in e.value.line() and "7.5" in e.value.line()
    # selecting only the H100 satisfies it
    assert require.check(env, None, host, (12, 4), {}, gpus=[host.gpus[0]]) is None


def test_brand_constraint():
    env = {"NVIDIA_REQUIRE_BRAND": "brand=tesla brand=nvidia"}
    assert require.check(env, None, Host(models=("NVIDIA A100-SXM4-80GB",)), (12, 4), {}) is None
    with pytest.raises(GpuError) as e:
        require.check(env, None, Host(models=("NVIDIA GeForce RTX 4090",)), (12, 4), {})
    assert "brand GeForce" in e.value.line()


def test_no_gpu_selected_means_arch_and_brand_hold():
    env = {"NVIDIA_REQUIRE_ARCH": "arch>=9.0,brand=tesla"}
    assert require.check(env, None, Host(models=("Tesla T4",)), (12, 4), {}, gpus=[]) is None


def test_unknown_gpu_model_launches_with_a_warning():
    warning = require.check({"NVIDIA_REQUIRE_ARCH": "arch>=8.0"}, None,
                            Host(models=("Mystery Accelerator 9",)), (12, 4), {})
    assert warning and "arch" in warning and "Mystery Accelerator 9" in warning


def test_unknown_ceiling_launches_with_a_warning():
    warning = require.check({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, None, Host(), lambda: None, {})
    assert warning and "cuda" in warning


@pytest.mark.skipif(not (HAVE_GCC and HAVE_LDCONFIG and IS_ROOT),
                    reason="FakeDriver needs gcc, ldconfig and root (mknod)")
def test_default_ceiling_is_asked_from_the_host_libcuda():
    from gpusandbox.gpu import discover
    with FakeDriver(gpus=1) as drv:          # its libcuda answers 12040
        host = discover.discover(drv.root, environ={})
        assert require.check({"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}, None, host) is None
        with pytest.raises(GpuError) as e:
            require.check({"NVIDIA_REQUIRE_CUDA": "cuda>=12.5"}, None, host, environ={})
    assert "up to 12.4" in e.value.line() and drv.version in e.value.line()


def test_a_mapping_is_not_a_ceiling():
    with pytest.raises(TypeError):
        require.check({"NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, None, Host(), {"PATH": "/bin"})


@pytest.mark.parametrize("model,arch,brand", [
    ("NVIDIA H100 80GB HBM3", "9.0", "Nvidia"),
    ("NVIDIA A100-SXM4-40GB", "8.0", "Nvidia"),
    ("NVIDIA A10", "8.6", "Nvidia"),
    ("NVIDIA L4", "8.9", "Nvidia"),
    ("Tesla V100-SXM2-16GB", "7.0", "Tesla"),
    ("Tesla T4", "7.5", "Tesla"),
    ("NVIDIA GeForce RTX 3090", "8.6", "GeForce"),
    ("NVIDIA GeForce RTX 4090", "8.9", "GeForce"),
    ("NVIDIA RTX A6000", "8.6", "NvidiaRTX"),
    ("NVIDIA RTX 6000 Ada Generation", "8.9", "NvidiaRTX"),
    ("Quadro RTX 8000", "7.5", "QuadroRTX"),
    ("NVIDIA TITAN V", "7.0", "Titan"),
    ("Unheard-of Board", None, None),
])
def test_model_table(model, arch, brand):
    assert require.gpu_arch(model) == arch
    assert require.gpu_brand(model) == brand


# --- the CUDA an image carries ------------------------------------------------------

def _touch(root, path, data=b""):
    full = os.path.join(root, path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as f:
        f.write(data)


def test_image_without_variables_is_held_to_the_cuda_runtime_it_carries(tmp_path):
    root = str(tmp_path)
    libdir = f"/usr/lib/{os.uname().machine}-linux-gnu"
    _touch(root, f"{libdir}/libcudart.so.12.4.127")
    os.symlink("libcudart.so.12.4.127", os.path.join(root, libdir.lstrip("/"), "libcudart.so.12"))
    with pytest.raises(GpuError) as e:
        require.check({}, root, Host(), (12, 2), {})
    assert "cuda>=12.4" in e.value.line() and "libcudart.so.12.4" in e.value.line()
    assert require.check({}, root, Host(), (12, 4), {}) is None


def test_toolkit_version_json(tmp_path):
    root = str(tmp_path)
    _touch(root, "/usr/local/cuda-12.6/version.json",
           json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.6.2"}}).encode())
    os.symlink("cuda-12.6", os.path.join(root, "usr/local/cuda"))
    assert gpu.image_cuda_version(root) == ((12, 6), "/usr/local/cuda/version.json")


def test_toolkit_version_txt(tmp_path):
    root = str(tmp_path)
    _touch(root, "/usr/local/cuda/version.txt", b"CUDA Version 10.2.89\n")
    assert gpu.image_cuda_version(root)[0] == (10, 2)


def test_image_symlinks_cannot_point_the_scan_at_host_files(tmp_path):
    host_dir = tmp_path / "host"
    (host_dir / "cuda").mkdir(parents=True)
    (host_dir / "cuda" / "version.txt").write_text("CUDA Version 99.1.0\n")
    root = tmp_path / "image"
    (root / "usr/local").mkdir(parents=True)
    # an absolute link in the image resolves inside the image, not on the host
    os.symlink(str(host_dir / "cuda"), str(root / "usr/local/cuda"))
    assert gpu.image_cuda_version(str(root)) is None


def test_image_without_cuda_has_no_requirement(tmp_path):
    (tmp_path / "usr/lib").mkdir(parents=True)
    assert require.requirements({}, str(tmp_path)) == []
    assert require.check({}, str(tmp_path), Host(), _no_ceiling, {}) is None
