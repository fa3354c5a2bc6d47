"""The launch path's lazy loads (issue 24, "A lean launch path"): each module
left off a plain launch is left off by a check that sees everything the
module would have acted on.  tests/integration/test_launch_imports.py counts
the modules of a real launch; these tests hold each check to what it stands
in for."""
import os
import sys
import subprocess

import pytest

from gpusandbox import conffile, plandev, settings, settingswhere
from gpusandbox.fabric import discover
from gpusandbox.plan import LaunchPlan
from gpusandbox.spec import RunSpec

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --- settings.configured: siterun, conffile and sitehooks --------------------------

def _under(path, dirs):
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dirs)


@pytest.mark.parametrize("env", [
    {"HOME": "/home/u"},
    {"HOME": "/home/u", "XDG_CONFIG_HOME": "/xdg"},
    {"HOME": "relative", "XDG_CONFIG_HOME": "/xdg"},
])
def test_every_settings_file_and_the_hooks_lie_in_a_directory_configured_checks(env):
    dirs = settings.source_dirs(env)
    paths = [settings.SYSTEM_FILE, settings.KEYS["hooks-dir"].default,
             *conffile.site_files(conffile.SITE_DIR),
             os.path.join(conffile.SITE_DIR, conffile.DROPIN_DIR, "x.conf")]
    if conffile.user_file(env):
        paths.append(conffile.user_file(env))
    if env["HOME"].startswith("/"):
        paths.append(os.path.join(env["HOME"], settings.USER_FILE))
    assert [p for p in paths if not _under(p, dirs)] == []


def test_configured_by_any_variable_or_any_source_directory(tmp_path):
    home = tmp_path / "home"
    env = {"HOME": str(home)}
    # The machine's own /etc/gpusandbox decides for every caller: the check
    # here is on the caller's part, so skip where the site has one.
    if os.path.lexists("/etc/gpusandbox"):
        pytest.skip("this machine has /etc/gpusandbox")
    assert not settings.configured(env)
    assert [type(s).__name__ for s in settings.sources(env)] == ["EnvSource"]
    for var in settings.ENV_VARS:
        assert var.startswith(settingswhere.PREFIX), var    # what settingswhere checks
        assert settings.configured({**env, var: "x"}), var
    assert not settings.configured({**env, "GPUSANDBOX_NETWORK": ""})
    assert not settings.configured({**env, "NVIDIA_VISIBLE_DEVICES": "all"})
    (home / ".config/gpusandbox").mkdir(parents=True)
    assert settings.configured(env)
    assert "TomlSource" in [type(s).__name__ for s in settings.sources(env)]
    xdg = tmp_path / "xdg"
    (xdg / "gpusandbox").mkdir(parents=True)
    assert settings.configured({"XDG_CONFIG_HOME": str(xdg)})


def test_an_unconfigured_launch_reads_its_driver_root_without_the_settings(tmp_path):
    """plandev.driver_roots: --driver-root, else with nothing configured the
    default root (settings.KEYS' own), neither loading settings.py."""
    if os.path.lexists("/etc/gpusandbox"):
        pytest.skip("this machine has /etc/gpusandbox")
    assert settings.KEYS["driver-root"].default == settingswhere.DRIVER_ROOT
    code = ("import sys; from gpusandbox import plandev; from gpusandbox.spec import RunSpec; "
            "s = RunSpec(); s.dev_root = '/d'; a = plandev.driver_roots(s, {'HOME': sys.argv[1]}); "
            "s.driver_root = '/r'; b = plandev.driver_roots(s, {'GPUSANDBOX_DRIVER_ROOT': '/e'}); "
            "print(a, b, 'gpusandbox.settings' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, cwd=REPO, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "('/', '/d') ('/r', '/d') False", out.stderr
    env = {"HOME": str(tmp_path), "GPUSANDBOX_DRIVER_ROOT": str(tmp_path)}
    spec = RunSpec()
    assert plandev.driver_roots(spec, env) == (str(tmp_path), None)


def test_an_unconfigured_run_reads_no_site_module(tmp_path):
    """cli._site on a caller with no variable and no file: the spec is
    untouched and neither siterun, conffile nor sitehooks is loaded."""
    if os.path.lexists("/etc/gpusandbox"):
        pytest.skip("this machine has /etc/gpusandbox")
    code = ("import sys; from gpusandbox import cli; "
            "spec = cli.parse_run_args(['/nonexistent', 'true']); cli._site(spec); "
            "print(sorted(m for m in ('gpusandbox.siterun', 'gpusandbox.conffile', "
            "'gpusandbox.sitehooks') if m in sys.modules), spec.binds, spec.env_set)")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=REPO)
    assert out.stdout.strip() == "[] [] []", out.stderr
    (tmp_path / ".config/gpusandbox").mkdir(parents=True)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd=REPO)
    assert out.stdout.startswith("['gpusandbox.conffile', 'gpusandbox.sitehooks', "
                                 "'gpusandbox.siterun']"), out.stderr


# --- plandev.has_adapters: gpusandbox.fabric's discover, select, inject -----------

def _sim(tmp_path, hcas, cxis=()):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text("Character devices:\n195 nvidia\n")
    for name in hcas:
        (tmp_path / "proc/sys/class/infiniband" / name / "ports/1").mkdir(parents=True)
    for name in cxis:
        (tmp_path / "proc/sys/class/cxi_user" / name).mkdir(parents=True)
    return str(tmp_path)


@pytest.mark.parametrize("hcas,cxis", [([], []), (["mlx5_0"], []), (["mlx5_0", "mlx5_1"], []),
                                       ([], ["cxi0"]), (["mlx5_0"], ["cxi0"])])
def test_has_adapters_sees_what_discovery_sees(tmp_path, hcas, cxis):
    root = _sim(tmp_path, hcas, cxis)
    assert plandev.has_adapters(root) == bool(discover.discover(root).nics())


def test_has_adapters_without_a_sysfs_class(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/devices").write_text("Character devices:\n195 nvidia\n")
    assert plandev.has_adapters(str(tmp_path)) is False
    assert discover.discover(str(tmp_path)).hcas == []


# --- gpu.compat_absent: gpu/compat.py -------------------------------------------

def _compat_image(tmp_path, layout):
    root = tmp_path / "img"
    (root / "usr/local").mkdir(parents=True)
    if layout == "dir":
        (root / "usr/local/cuda/compat").mkdir(parents=True)
    elif layout == "file":
        (root / "usr/local/cuda").mkdir()
        (root / "usr/local/cuda/compat").write_text("")
    elif layout == "escape":        # resolved inside the image: the host's /tmp is not it
        (root / "usr/local/cuda").mkdir()
        os.symlink(str(tmp_path / "outside"), root / "usr/local/cuda/compat")
        (tmp_path / "outside").mkdir()
    elif layout == "dangling":
        os.symlink("cuda-12.9", root / "usr/local/cuda")
    return str(root)


@pytest.mark.parametrize("layout", ["none", "dir", "file", "escape", "dangling"])
@pytest.mark.parametrize("mode", ["auto", "off", "force"])
def test_compat_absent_is_what_decide_says_without_loading_it(tmp_path, layout, mode):
    from gpusandbox.errors import GpuError
    from gpusandbox.gpu import compat, compat_absent
    root = _compat_image(tmp_path, layout)
    fast = compat_absent(mode, root)
    if fast is None:
        return      # compat.decide reads the image itself
    assert mode == "auto"
    try:
        d = compat.decide(mode, root, "550.54.15", ["Tesla"])
    except GpuError:
        pytest.fail("compat_absent decided where compat.decide refuses")
    assert (fast.use, fast.reason, fast.version, fast.entries) == \
        (d.use, d.reason, d.version, d.entries)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:        # the planner passes the image's held fd
        assert compat_absent(mode, fd).reason == d.reason
    finally:
        os.close(fd)


def test_compat_absent_leaves_an_image_with_compat_libraries_to_compat(tmp_path):
    from gpusandbox.gpu import compat_absent
    assert compat_absent("auto", _compat_image(tmp_path, "dir")) is None
    assert compat_absent("auto", _compat_image(tmp_path / "b", "none")) is not None


# --- linux.seccomp: seccompbpf and zlib only on a miss ----------------------------

def test_a_shipped_program_loads_neither_the_compiler_nor_zlib(tmp_path):
    code = ("import sys\n"
            f"sys.path.insert(0, {REPO!r})\n"
            "from gpusandbox.linux import seccomp\n"
            "prog = seccomp.compile_profile('default')\n"
            "print(len(prog), sorted(m for m in sys.modules if m in "
            "('gpusandbox.linux.seccompbpf', 'zlib', 'json')))\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, cwd="/", check=True,
                         env={"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path)}
                         ).stdout.split(None, 1)
    assert int(out[0]) > 0 and out[1].strip() == "[]", out
    assert not list(tmp_path.iterdir())     # no cache entry either: the shipped program


def test_the_compiler_names_stay_importable_from_seccomp():
    from gpusandbox.linux import seccomp, seccompbpf
    from gpusandbox.linux.seccomp import JEQ, assemble, parse
    assert (JEQ, assemble, parse) == (seccompbpf.JEQ, seccompbpf.assemble, seccompbpf.parse)
    assert seccomp.LD_W_ABS == seccompbpf.LD_W_ABS and seccomp.OFF_ARCH == 4
    with pytest.raises(AttributeError):
        seccomp.no_such_name


# --- LaunchPlan.container_settings: stages/ocisetup.py -------------------------------

def test_a_plain_plan_has_no_container_settings():
    assert LaunchPlan(RunSpec()).container_settings() is False


@pytest.mark.parametrize("field,value", [
    ("oci", object()), ("hook_state", {"bundle": "/b"}), ("hooks", {"prestart": [{}]}),
    ("hooks", {"createRuntime": [{}]}), ("domainname", "example"),
    ("sysctl", (("kernel.msgmax", "4096"),)), ("rootfs_propagation", (0, False)),
])
def test_each_container_setting_loads_ocisetup(field, value):
    plan = LaunchPlan(RunSpec())
    setattr(plan, field, value)
    assert plan.container_settings() is True


# --- gpu/__init__.requirements: gpu/require.py --------------------------------------

def test_what_the_image_asks_is_read_by_the_package_and_require_uses_it(tmp_path):
    from gpusandbox import gpu
    from gpusandbox.gpu import require
    assert require.requirements is gpu.requirements and require.disabled is gpu.disabled
    # An image that asks nothing: no requirement, so the plan skips the check.
    assert gpu.requirements({}, str(tmp_path)) == []
    assert gpu.requirements({"CUDA_VERSION": "12.4.1"}, None) == [
        ("CUDA_VERSION=12.4.1", "cuda>=12.4")]
    assert gpu.disabled({"NVIDIA_DISABLE_REQUIRE": "yes"})
