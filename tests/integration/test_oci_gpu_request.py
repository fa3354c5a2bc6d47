"""One GPU request for every door (gpu/request.py): `gpusandbox-oci create`
reads a config.json's NVIDIA_DRIVER_CAPABILITIES and cdi.k8s.io/*
annotations as the wrapper, the precreate filter and the hook do (it used to
read NVIDIA_VISIBLE_DEVICES alone), and `run` takes CDI names in the
caller's NVIDIA_VISIBLE_DEVICES as those doors take them in the container's."""
import json
import os
import subprocess

import pytest

from .conftest import CLI, MODES
from .test_oci_cdi import ANN, SPEC_ENV, spec_dir  # noqa: F401 (fixture)
from .test_oci_runtime import HERE, OCI, _as, _config, oci_dirs  # noqa: F401 (fixture)

LIBDIR = "/usr/lib/x86_64-linux-gnu"
SHOW = ("for n in 0 1; do if [ -e /dev/nvidia$n ]; then echo have nvidia$n; "
        "else echo no nvidia$n; fi; done; "
        f"for f in libcuda.so.1 libnvidia-ml.so.1; do if [ -e {LIBDIR}/$f ]; then "
        "echo have $f; else echo no $f; fi; done")


def create(mode, oci_dirs, test_user, conf, env):
    """The container's output through gpusandbox-oci create/start (a minimal
    conmon, oci_caller.py), as root or as the test user."""
    (oci_dirs / "bundle" / "config.json").write_text(json.dumps(conf))
    out_file = oci_dirs / "root" / "out"
    env = {"PATH": "/usr/bin:/bin", **env}
    with open(out_file, "w") as out:
        r = subprocess.run(_as(mode, test_user, ["/usr/bin/python3", str(HERE / "oci_caller.py"),
                                                 OCI, str(oci_dirs / "root" / "s"),
                                                 str(oci_dirs / "bundle"), "req"], env),
                           stdout=subprocess.PIPE, stderr=out, text=True, timeout=60,
                           env={**os.environ, **env})
    res = json.loads(r.stdout)
    assert res["create"] == [0, ""] and res["exit"] == 0, res
    return out_file.read_text().split("\n")


def filtered(conf, env):
    """The precreate filter's edit of the same config (the wrapper's edit:
    configedit.edit), its generated files removed as runc's delete would."""
    r = subprocess.run([CLI, "oci-filter"], input=json.dumps(conf).encode(),
                       capture_output=True, env={"PATH": "/usr/bin:/bin", **env})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    post = out["hooks"]["poststop"][-1]
    subprocess.run(post["args"], env=dict(e.split("=", 1) for e in post["env"]),
                   input=b"{}", capture_output=True, check=True)
    return {os.path.basename(m["destination"]) for m in out["mounts"]
            if m["destination"].startswith(LIBDIR)}


@pytest.mark.parametrize("mode", MODES)
def test_create_honours_driver_capabilities_as_the_filter_does(mode, oci_dirs, rootfs,
                                                               test_user, sim_host):
    """NVIDIA_DRIVER_CAPABILITIES=utility: NVML and nvidia-smi, no CUDA
    driver library, through create as through the filter/wrapper edit."""
    conf = _config(rootfs, ["sh", "-c", SHOW], mode, test_user)
    conf["process"]["env"] += ["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=utility"]
    env = {"GPUSANDBOX_DRIVER_ROOT": sim_host.root}
    out = create(mode, oci_dirs, test_user, conf, env)
    assert out[:4] == ["no nvidia0", "have nvidia1", "no libcuda.so.1", "have libnvidia-ml.so.1"]
    libs = filtered(conf, env)
    assert "libnvidia-ml.so.1" in libs and not any(n.startswith("libcuda.") for n in libs), libs
    # and the default (utility,compute) gives both, through both doors
    conf["process"]["env"].pop()
    assert create(mode, oci_dirs, test_user, conf, env)[2:4] == \
        ["have libcuda.so.1", "have libnvidia-ml.so.1"]
    assert "libcuda.so.1" in filtered(conf, env)


@pytest.mark.parametrize("mode", MODES)
def test_create_takes_a_cdi_annotation(mode, oci_dirs, rootfs, test_user, sim_host, spec_dir):
    """A cdi.k8s.io/* annotation selects the device on create, as on the
    wrapper, filter and hook (tests/integration/test_oci_cdi.py); the spec
    directory is the caller's setting, never the config's."""
    conf = _config(rootfs, ["sh", "-c", SHOW], mode, test_user)
    conf["annotations"] = {ANN: "nvidia.com/gpu=1"}
    out = create(mode, oci_dirs, test_user, conf, {SPEC_ENV: spec_dir})
    assert out[:4] == ["no nvidia0", "have nvidia1", "have libcuda.so.1",
                       "have libnvidia-ml.so.1"], out


def test_run_takes_cdi_names_in_the_callers_variable(runner, rootfs, sim_host, spec_dir):
    """`run` with NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1 in the caller's
    environment: the device of that CDI spec, as `--device nvidia.com/gpu=1`
    (it was an unknown device before)."""
    r = runner.run([str(rootfs), "sh", "-c", SHOW],
                   env={"NVIDIA_VISIBLE_DEVICES": "nvidia.com/gpu=1", SPEC_ENV: spec_dir})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:4] == ["no nvidia0", "have nvidia1", "have libcuda.so.1",
                                        "have libnvidia-ml.so.1"], r.stdout
