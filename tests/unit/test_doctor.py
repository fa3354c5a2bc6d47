"""`gpusandbox doctor` checks on hand-made trees (gpusandbox/doctor/).

Kernel switches are simulated through the files the checks read (a Roots
tree), never by changing the machine; drivers are FakeDriver trees."""
import json
import os
import shutil
import tempfile

import pytest

from gpusandbox import doctor
from tests.unit.gpu_fixtures import HAVE_GCC, HAVE_LDCONFIG, IS_ROOT, FakeDriver

needs_fake_driver = pytest.mark.skipif(not (HAVE_GCC and HAVE_LDCONFIG and IS_ROOT),
                                       reason="FakeDriver needs gcc, ldconfig and root (mknod)")


def _write(root, rel, text, mode=0o644):
    path = os.path.join(str(root), rel.lstrip("/"))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)
    return path


def _by_name(checks):
    return {c.name: c for c in checks}


# --- user namespaces ---------------------------------------------------------------

@pytest.mark.parametrize("rel,value,words", [
    ("sys/kernel/unprivileged_userns_clone", "0", "unprivileged_userns_clone"),
    ("sys/user/max_user_namespaces", "0", "max_user_namespaces"),
    ("sys/kernel/apparmor_restrict_unprivileged_userns", "1", "AppArmor"),
])
def test_user_namespaces_disabled_fails_rootless(tmp_path, rel, value, words):
    _write(tmp_path, rel, value + "\n")
    c = doctor.check_userns(doctor.Roots(proc=str(tmp_path)), euid=1000)
    assert c.status == doctor.FAIL
    assert words in c.detail and "sysctl" in c.fix
    # root launches do not need them: a warning for the other users only
    assert doctor.check_userns(doctor.Roots(proc=str(tmp_path)), euid=0).status == doctor.WARN


def test_user_namespaces_allowed(tmp_path):
    _write(tmp_path, "sys/kernel/unprivileged_userns_clone", "1\n")
    _write(tmp_path, "sys/user/max_user_namespaces", "63000\n")
    _write(tmp_path, "sys/kernel/apparmor_restrict_unprivileged_userns", "0\n")
    c = doctor.check_userns(doctor.Roots(proc=str(tmp_path)), euid=1000)
    assert c.status == doctor.PASS and "63000" in c.detail


# --- subordinate ids ---------------------------------------------------------------

def test_subids_missing_range_and_helpers(tmp_path):
    _write(tmp_path, "etc/subuid", "alice:100000:65536\n")
    _write(tmp_path, "etc/subgid", "")
    bindir = tmp_path / "bin"
    _write(bindir, "newuidmap", "#!/bin/sh\n", 0o755)          # not setuid: useless
    checks = _by_name(doctor.check_subids(doctor.Roots(etc=str(tmp_path / "etc")), "alice",
                                          1000, str(bindir)))
    assert checks["/etc/subuid"].status == doctor.PASS and "65536" in checks["/etc/subuid"].detail
    assert checks["/etc/subgid"].status == doctor.FAIL and "alice" in checks["/etc/subgid"].detail
    assert checks["newuidmap"].status == doctor.FAIL and "setuid" in checks["newuidmap"].detail
    assert checks["newgidmap"].status == doctor.FAIL and "uidmap" in checks["newgidmap"].fix


@pytest.mark.skipif(not IS_ROOT, reason="making a setuid-root file needs root")
def test_subids_setuid_helpers_pass(tmp_path):
    _write(tmp_path, "etc/subuid", "1000:100000:65536\n")
    _write(tmp_path, "etc/subgid", "1000:100000:65536\n")
    for tool in ("newuidmap", "newgidmap"):
        _write(tmp_path, f"bin/{tool}", "#!/bin/sh\n", 0o4755)
    checks = doctor.check_subids(doctor.Roots(etc=str(tmp_path / "etc")), "nobody-here", 1000,
                                 str(tmp_path / "bin"))
    assert [c.status for c in checks] == [doctor.PASS] * 4


# --- cgroups -------------------------------------------------------------------------

def test_no_cgroup2_mount_warns_rootless(tmp_path):
    _write(tmp_path, "self/mountinfo",
           "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
           "30 25 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    _write(tmp_path, "self/cgroup", "5:memory:/user.slice\n")
    _write(tmp_path, "self/status", "Name:\tpython\nCapEff:\t0000000000000000\n")
    checks = _by_name(doctor.check_cgroups(doctor.Roots(proc=str(tmp_path)), euid=1000))
    assert checks["cgroup v2"].status == doctor.WARN
    assert "no cgroup2 mount" in checks["cgroup v2"].detail
    assert checks["BPF device filter"].status == doctor.PASS  # rootless: not used


def _host_cgroups():
    """This machine's cgroup facts, read here independently of the product:
    (cgroup2 mount point or None, whether v1 hierarchies exist, the leaf
    parent a launch would use, the controllers the v1 side holds)."""
    mount, mroot, v1 = None, "/", False
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype = right.split()[0]
            if fstype == "cgroup2" and mount is None:
                mount, mroot = left.split()[4], left.split()[3]
            v1 = v1 or fstype == "cgroup"
    with open("/proc/self/cgroup") as f:
        own = next((ln.rstrip("\n")[3:] for ln in f if ln.startswith("0::")), "/")
    if mroot != "/" and own.startswith(mroot):
        own = own[len(mroot):]
    bound = set()
    with open("/proc/cgroups") as f:
        for line in f:
            fields = line.split()
            if len(fields) == 4 and not line.startswith("#") and fields[1] != "0" \
                    and fields[3] == "1":
                bound.add(fields[0])
    pdir = os.path.join(mount, own.lstrip("/")).rstrip("/") if mount else None
    return mount, v1 or bool(bound), pdir, bound


@pytest.mark.parametrize("euid", [0, 1000])
def test_cgroup_checks_on_this_machine(euid):
    mount, hybrid, pdir, bound = _host_cgroups()
    if mount is None:
        pytest.skip("no cgroup2 mount on this machine (covered by the fake-tree tests)")
    checks = _by_name(doctor.check_cgroups(doctor.Roots(), euid=euid))
    root = euid == 0
    kind = "hybrid: v1 controllers elsewhere" if hybrid else "unified"
    assert (checks["cgroup v2"].status, checks["cgroup v2"].detail) == (
        doctor.PASS, f"{mount} ({kind})")
    writable = all(os.access(p, os.W_OK) for p in (
        pdir, f"{pdir}/cgroup.procs", f"{pdir}/cgroup.subtree_control"))
    deleg = checks["cgroup delegation"]
    assert deleg.detail.startswith(pdir + " is ")
    assert deleg.status == (doctor.PASS if writable else doctor.FAIL if root else doctor.WARN)
    with open(f"{pdir}/cgroup.controllers") as f:
        have = set(f.read().split()) | (bound if root else set())
    missing = [c for c in ("memory", "pids", "cpu") if c not in have]
    ctl = checks["cgroup controllers"]
    if missing:
        assert ctl.status == doctor.WARN and ctl.fix
        assert ctl.detail.startswith(f"{', '.join(missing)} not available"), ctl.detail
    else:
        assert (ctl.status, ctl.detail) == (doctor.PASS, "memory, pids, cpu")
    bpf = checks["BPF device filter"]
    if not root:
        assert bpf.status == doctor.PASS and bpf.detail.startswith("not used rootless")
    elif os.geteuid() == 0:
        # Root with CAP_SYS_ADMIN on a cgroup2 host: the program loads (the
        # kernel tests in tests/integration prove it on this kernel).
        assert bpf.status == doctor.PASS and "a cgroup device program loads" in bpf.detail
    else:
        assert bpf.status == doctor.FAIL and "CAP_SYS_ADMIN" in bpf.detail


# --- overlayfs probe -------------------------------------------------------------------

def test_overlay_probe_leaves_nothing_behind():
    before = set(os.listdir(tempfile.gettempdir()))
    ok, why = doctor.probe_overlay()
    after = set(os.listdir(tempfile.gettempdir()))
    assert not {n for n in after - before if n.startswith("gpusandbox-doctor-")}
    if not ok:
        pytest.skip(f"this kernel refuses overlayfs in a user namespace: {why}")
    assert doctor.check_overlay(os.geteuid()).status == doctor.PASS


# --- the host driver ----------------------------------------------------------------------

def _opts(drv, **kw):
    return doctor.Options(driver_root=drv.root if hasattr(drv, "root") else str(drv), **kw)


def test_no_driver_loaded(tmp_path):
    checks, host, ceiling = doctor.check_driver(_opts(tmp_path))
    assert host is None
    c = _by_name(checks)["kernel module"]
    assert c.status == doctor.FAIL and "not loaded" in c.detail and "modprobe nvidia" in c.fix


@needs_fake_driver
def test_healthy_driver_passes_every_check():
    with FakeDriver(gpus=2) as drv:
        checks, host, ceiling = doctor.check_driver(_opts(drv))
    bad = [c for c in checks if c.status != doctor.PASS]
    assert not bad, bad
    assert ceiling == (12, 4)
    names = [c.name for c in checks]
    assert names == ["kernel module", "device nodes", "nvidia-uvm", "driver libraries",
                     "capabilities", "persistenced", "GSP firmware", "CUDA ceiling"]
    assert "12.4" in checks[-1].detail


@needs_fake_driver
def test_missing_nvidia_uvm():
    with FakeDriver(gpus=1, uvm=False) as drv:
        c = _by_name(doctor.check_driver(_opts(drv))[0])["nvidia-uvm"]
    assert c.status == doctor.FAIL and "CUDA cannot start" in c.detail
    assert "modprobe nvidia-uvm" in c.fix


@needs_fake_driver
def test_libraries_of_another_driver_version():
    with FakeDriver(gpus=1, version="550.54.15") as drv:
        # the module was upgraded, the user space was not (or the reverse)
        drv.write("proc/driver/nvidia/version",
                  "NVRM version: NVIDIA UNIX x86_64 Kernel Module  560.28.03  Thu Jul 18 2024\n")
        checks, host, _ = doctor.check_driver(_opts(drv))
    c = _by_name(checks)["driver libraries"]
    assert host is None
    assert c.status == doctor.FAIL
    assert "550.54.15" in c.detail and "560.28.03" in c.detail
    assert "reboot" in c.fix


@needs_fake_driver
def test_device_node_with_wrong_numbers():
    with FakeDriver(gpus=2) as drv:
        drv.mknod("dev/nvidia0", 195, 7)
        c = _by_name(doctor.check_driver(_opts(drv))[0])["device nodes"]
    assert c.status == doctor.FAIL and "195:7" in c.detail


@needs_fake_driver
def test_missing_persistenced_and_firmware_warn():
    with FakeDriver(gpus=1) as drv:
        os.unlink(drv.p("var/run/nvidia-persistenced/socket"))
        shutil.rmtree(drv.p(f"lib/firmware/nvidia/{drv.version}"))
        os.makedirs(drv.p("lib/firmware/nvidia/535.104.05"))
        checks = _by_name(doctor.check_driver(_opts(drv))[0])
    assert checks["persistenced"].status == doctor.WARN
    assert checks["GSP firmware"].status == doctor.WARN
    assert "535.104.05" in checks["GSP firmware"].detail


# --- the image --------------------------------------------------------------------------------

def _image(root, env=None, libc="glibc", debian=True):
    m = os.uname().machine
    _write(root, "bin/sh", "#!fake\n", 0o755)
    os.makedirs(os.path.join(str(root), "usr/bin"), exist_ok=True)
    if libc == "glibc":
        _write(root, f"lib/{m}-linux-gnu/libc.so.6", "")
    elif libc == "musl":
        _write(root, f"lib/ld-musl-{m}.so.1", "")
    if debian:
        _write(root, "etc/debian_version", "12.5\n")
    if env:
        _write(root, "etc/environment", "".join(f'{k}="{v}"\n' for k, v in env.items()))
    return str(root)


@needs_fake_driver
def test_image_needing_a_newer_cuda_fails_with_the_driver_to_install(tmp_path):
    img = _image(tmp_path, {"CUDA_VERSION": "12.6.2"})
    with FakeDriver(gpus=1) as drv:
        opts = _opts(drv, image=img)
        _, host, ceiling = doctor.check_driver(opts)
        checks = _by_name(doctor.check_image(opts, host, ceiling, None)[0])
    c = checks["CUDA requirement"]
    assert c.status == doctor.FAIL
    assert "cuda>=12.6" in c.detail and "12.4" in c.detail
    assert "560.28.03" in c.fix
    assert checks["rootfs"].status == doctor.PASS
    assert checks["libc"].status == doctor.PASS and "x86_64-linux-gnu" in checks["libc"].detail \
        or os.uname().machine != "x86_64"


@needs_fake_driver
def test_image_with_disable_require_warns(tmp_path):
    img = _image(tmp_path, {"CUDA_VERSION": "12.6.2", "NVIDIA_DISABLE_REQUIRE": "1"})
    with FakeDriver(gpus=1) as drv:
        opts = _opts(drv, image=img)
        _, host, ceiling = doctor.check_driver(opts)
        c = _by_name(doctor.check_image(opts, host, ceiling, None)[0])["CUDA requirement"]
    assert c.status == doctor.WARN and "NVIDIA_DISABLE_REQUIRE" in c.detail


def test_musl_image_warns_and_non_rootfs_fails(tmp_path):
    img = _image(tmp_path / "alpine", libc="musl", debian=False)
    checks = _by_name(doctor.check_image(doctor.Options(image=img), None, None, None)[0])
    assert checks["libc"].status == doctor.WARN and "musl" in checks["libc"].detail
    empty = tmp_path / "empty"
    empty.mkdir()
    c = doctor.check_image(doctor.Options(image=str(empty)), None, None, None)[0][0]
    assert c.name == "rootfs" and c.status == doctor.FAIL


def test_oci_bundle_env_comes_from_config_json(tmp_path):
    _image(tmp_path / "rootfs")
    (tmp_path / "config.json").write_text(json.dumps(
        {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
         "process": {"env": ["PATH=/usr/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"]}}))
    root, env = doctor.load_image(str(tmp_path))
    assert root == str(tmp_path / "rootfs")
    assert env["NVIDIA_REQUIRE_CUDA"] == "cuda>=12.0"
    checks = _by_name(doctor.check_image(doctor.Options(image=str(tmp_path)), None, None, None)[0])
    # no driver: the requirement is named, not judged
    assert checks["CUDA requirement"].status == doctor.WARN
    assert "cuda>=12.0" in checks["CUDA requirement"].detail


# --- output and exit status ----------------------------------------------------------------------

def _main(argv, roots, capsys):
    rc = doctor.main(argv, roots=roots)
    return rc, capsys.readouterr().out


def test_cli_reports_disabled_user_namespaces_and_exits_1(tmp_path, capsys, monkeypatch):
    _write(tmp_path, "proc/sys/user/max_user_namespaces", "0\n")
    monkeypatch.setattr(doctor.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(doctor, "check_overlay", lambda euid: doctor.Check(
        "launcher", "overlayfs in user namespace", doctor.PASS, "stubbed"))
    rc, out = _main(["--driver-root", str(tmp_path / "nodriver")],
                    doctor.Roots(proc=str(tmp_path / "proc")), capsys)
    assert rc == 1
    line = next(ln for ln in out.splitlines() if "user namespaces" in ln)
    assert line.split()[0] == "FAIL" and "max_user_namespaces = 0" in line and "fix:" in line
    assert any(ln.split()[:2] == ["FAIL", "kernel"] for ln in out.splitlines())


@needs_fake_driver
def test_cli_json_on_a_healthy_fake_host(capsys):
    # the launcher section reads this machine (root here, cgroups as they are)
    with FakeDriver(gpus=2) as drv:
        rc, out = _main(["--json", "--gpus", "1", "--driver-root", drv.root], None, capsys)
    report = json.loads(out)
    fails = [c for c in report["checks"] if c["status"] == "fail"]
    assert not fails, fails
    assert rc == 0 and report["ok"] is True
    assert report["summary"]["fail"] == 0
    listing = next(c for c in report["checks"] if c["name"] == "host GPU listing")
    assert listing["status"] == "pass" and "1: NVIDIA H100" in listing["detail"]
    # no image: the sandbox steps are skipped with a warning
    assert any(c["section"] == "verify" and c["status"] == "warn" for c in report["checks"])


def test_cli_usage_error_is_125(capsys):
    assert doctor.main(["--userns", "bogus"]) == 125
    assert "gpusandbox: error:" in capsys.readouterr().err


# --- the sandbox steps, with the sandbox's answers given ----------------------------------

class _Res:
    def __init__(self, stdout, rc=0):
        self.stdout, self.returncode, self.stderr = stdout, rc, ""


@needs_fake_driver
@pytest.mark.parametrize("nodes,cuda,want_nodes,want_cuda", [
    ("/dev/nvidiactl\n/dev/nvidia0\n/dev/nvidia-uvm\n", "CUDA 0 0 1\n", doctor.PASS, doctor.PASS),
    # a GPU that was not selected is visible: an isolation failure
    ("/dev/nvidiactl\n/dev/nvidia0\n/dev/nvidia1\n", "CUDA 0 0 1\n", doctor.FAIL, doctor.PASS),
    ("/dev/nvidiactl\n/dev/nvidia0\n", "CUDA 0 0 2\n", doctor.PASS, doctor.FAIL),
    ("/dev/nvidiactl\n/dev/nvidia0\n", "LOAD libcuda.so.1: cannot open shared object file\n",
     doctor.PASS, doctor.FAIL),
    ("/dev/nvidiactl\n/dev/nvidia0\n", "CUDA 100 -1 -1\n", doctor.PASS, doctor.FAIL),
])
def test_verification_judges_what_the_sandbox_saw(tmp_path, monkeypatch, nodes, cuda,
                                                  want_nodes, want_cuda):
    from gpusandbox.gpu import discover, select
    img = _image(tmp_path)
    _write(tmp_path, "usr/bin/python3", "#!fake\n", 0o755)
    answers = iter([_Res(nodes), _Res(cuda)])
    monkeypatch.setattr(doctor.verify, "_sandbox", lambda opts, facts, cmd: (next(answers), ""))
    with FakeDriver(gpus=2) as drv:
        host = discover.discover(drv.root, environ={})
        gpu0 = next(g for g in host.gpus if g.minor == 0)
        sel = select.resolve(str(gpu0.index), None, {}, host)
        opts = _opts(drv, image=img, gpus=str(gpu0.index))
        _, facts = doctor.check_image(opts, host, (12, 4), sel)
        checks = _by_name(doctor.check_verify(opts, host, sel, facts))
    assert checks["device nodes in sandbox"].status == want_nodes
    assert checks["CUDA in sandbox"].status == want_cuda
    if want_nodes == doctor.FAIL:
        assert "/dev/nvidia1" in checks["device nodes in sandbox"].detail
    if "CUDA 0 0 2" in cuda:
        assert "counts 2" in checks["CUDA in sandbox"].detail
    if "LOAD" in cuda:
        assert "did not load" in checks["CUDA in sandbox"].detail
