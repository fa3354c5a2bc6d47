"""CDI names through the wrapper, the precreate filter and the hook: a
container that names `nvidia.com/gpu=N` in a `cdi.k8s.io/*` annotation (or
in NVIDIA_VISIBLE_DEVICES) gets what a spec from `gpusandbox cdi generate`
for the simulated host describes, through real podman and runc; and the
files the filter generates go when the container does."""
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from .conftest import CLI, MODES
from .oci_fixtures import (CRUN, RUNC, SHOW, Podman, assert_schema_valid, make_rootfs,
                           oci_dir, runc_bundle, runc_run, shim)  # noqa: F401 (fixture)
from .test_oci_hook import hook_def

ANN = "cdi.k8s.io/gsbx-test"
SPEC_ENV = "GPUSANDBOX_CDI_SPEC_DIRS"


@pytest.fixture(scope="module")
def spec_dir(cli, sim_host):
    """A spec for the simulated host as an admin writes it (`gpusandbox cdi
    generate`, the toolkit's hook commands included: done natively), in a
    directory the test user can read; callers get it through
    GPUSANDBOX_CDI_SPEC_DIRS, so no other test sees it."""
    d = tempfile.mkdtemp(prefix="gsbx-test-cdispecs-", dir="/tmp")
    os.chmod(d, 0o755)
    r = subprocess.run([CLI, "cdi", "generate", "--driver-root", sim_host.root,
                        "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook",
                        "--output", str(d)], capture_output=True, text=True, timeout=120)
    try:
        assert r.returncode == 0, r.stderr
        assert os.listdir(d) == ["nvidia-gpu.yaml"]
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def check_gpu0(out, why="No such device or address"):
    assert f"open: cat: /dev/nvidia0: {why}" in out, out
    assert "absent /dev/nvidia1" in out, out
    assert "ls: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" in out, out


def recorder(d, user=None):
    """A runtime that keeps a copy of the config.json it is handed and the
    bundle's path, then execs runc with the same arguments."""
    rec = d / "rec"
    rec.mkdir()
    if user is not None:
        os.chown(rec, user.pw_uid, user.pw_gid)
    p = d / "record-runtime"
    p.write_text("#!/bin/sh\n"
                 "b=.; prev=\n"
                 "for a in \"$@\"; do [ \"$prev\" = --bundle ] && b=$a; prev=$a; done\n"
                 f"if [ -f \"$b/config.json\" ]; then cp \"$b/config.json\" {rec}/seen.json; "
                 f"echo \"$b\" > {rec}/bundle; fi\n"
                 f"exec {RUNC} \"$@\"\n")
    os.chmod(p, 0o755)
    return str(p), rec


def cache_source(cfg):
    return next(m["source"] for m in cfg["mounts"] if m["destination"] == "/etc/ld.so.cache")


def test_podman_cdi_annotation_through_wrapper(cli, test_user, oci_dir, sim_host, spec_dir):
    """podman --annotation cdi.k8s.io/...=nvidia.com/gpu=0 over the wrapper
    (root, runc): the spec's device rules let GPU 0 through the runtime's
    cgroup, the driver files are there, and the loader cache the wrapper
    generated lives in the bundle, which the engine removes."""
    podman = Podman(oci_dir, "root", test_user)
    (podman.d / "img").mkdir()
    rootfs = make_rootfs(podman.d / "img")
    rec, seen = recorder(podman.d)
    wrap = shim(podman.d, sim_host.root, runtime=rec, env={SPEC_ENV: spec_dir})
    r = podman.run_rootfs(rootfs, ["sh", "-c", SHOW], pre=["--runtime", wrap],
                          annotations=[f"{ANN}=nvidia.com/gpu=0"])
    assert r.returncode == 0, r.stderr
    check_gpu0(r.stdout)
    cfg = json.loads((seen / "seen.json").read_text())
    assert_schema_valid(cfg)
    bundle = (seen / "bundle").read_text().strip()
    assert cache_source(cfg).startswith(os.path.realpath(bundle) + "/"), cfg["mounts"]
    assert not os.path.exists(bundle), "the engine left the bundle"


@pytest.mark.parametrize("mode", MODES)
def test_podman_cdi_annotation_through_filter(mode, cli, test_user, oci_dir, sim_host,
                                              spec_dir):
    """The precreate filter over plain runc: the annotation's device, and
    the loader cache it generated is gone once the container is (removed by
    the poststop hook the filter added, run by runc's delete)."""
    podman = Podman(oci_dir, mode, test_user)
    hooks = podman.d / "hooks.d"
    r = subprocess.run([CLI, "hook", "install", "--stage", "precreate", "--dir", str(hooks),
                        "--driver-root", sim_host.root], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads((hooks / "gpusandbox-filter.json").read_text())
    doc["hook"]["env"].append(f"{SPEC_ENV}={spec_dir}")
    (hooks / "gpusandbox-filter.json").write_text(json.dumps(doc))
    (podman.d / "img").mkdir()
    rootfs = make_rootfs(podman.d / "img", test_user if mode == "rootless" else None)
    rec, seen = recorder(podman.d, test_user if mode == "rootless" else None)
    r = podman.run_rootfs(rootfs, ["sh", "-c", SHOW], pre=["--runtime", rec,
                                                           "--hooks-dir", str(hooks)],
                          annotations=[f"{ANN}=nvidia.com/gpu=0"])
    assert r.returncode == 0, r.stderr
    check_gpu0(r.stdout)
    cfg = json.loads((seen / "seen.json").read_text())
    assert_schema_valid(cfg)
    src = cache_source(cfg)
    post = cfg["hooks"]["poststop"][-1]
    assert post["path"] == "/bin/sh" and post["args"][-2:] == ["sh", os.path.dirname(src)], post
    assert not os.path.exists(os.path.dirname(src)), "the filter's files outlived the container"
    state = os.path.dirname(os.path.dirname(src))
    assert state == ("/run/gpusandbox/oci" if mode == "root"
                     else f"/tmp/gpusandbox-{test_user.pw_uid}/oci")


def test_hook_cdi_names_through_runc(cli, oci_dir, sim_host, spec_dir):
    """The hook injects CDI names, from an annotation (GPU 0) and from
    NVIDIA_VISIBLE_DEVICES (GPU 1), through the same resolve; the nodes are
    there (the runtime's cgroup was applied before hooks: EPERM)."""
    d = oci_dir
    hook = hook_def(d, sim_host.root, "createRuntime")
    hook["env"].append(f"{SPEC_ENV}={spec_dir}")
    runc_bundle(d, ["sh", "-c", SHOW], env=["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"],
                hooks={"createRuntime": [hook]}, extra={"annotations": {ANN: "nvidia.com/gpu=0"}})
    r = runc_run(d, "h-cdi")
    assert r.returncode == 0, r.stderr
    for n in (0, 1):
        assert f"open: cat: /dev/nvidia{n}: Operation not permitted" in r.stdout, r.stdout
    assert "ls: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" in r.stdout, r.stdout


def test_podman_cdi_annotation_through_wrapper_rootless_crun(cli, test_user, oci_dir,
                                                             sim_host, spec_dir):
    """Rootless podman, the wrapper over crun (cgroup2 view, as the wrapper's
    crun test): the annotation's GPU 0, bound from the spec's host node."""
    podman = Podman(oci_dir, "rootless", test_user, view=True)
    (podman.d / "img").mkdir()
    rootfs = make_rootfs(podman.d / "img", test_user)
    rt = shim(podman.d / "rt", sim_host.root, runtime=CRUN, name="crun",
              env={SPEC_ENV: spec_dir})
    r = podman.run_rootfs(rootfs, ["sh", "-c", SHOW], pre=["--runtime", rt], cgroups=False,
                          annotations=[f"{ANN}=nvidia.com/gpu=0"])
    assert r.returncode == 0, r.stderr
    check_gpu0(r.stdout)
