"""`gpusandbox doctor REF` of an image in the store, root and rootless: found
as `run` finds a cached image, its tree and its config's Env checked (the
CUDA requirement comes from the image config, not the tree), the verify
sandbox run on it, and an image not in the store refused with one line and
the hint to pull, without pulling."""
import json
import os

from tests.integration.test_doctor_cli import _checks, old_host  # noqa: F401
from tests.integration.test_images_local import gsbx, image_files, store  # noqa: F401
from tests.unit import image_fixtures as fx


def test_doctor_of_a_store_image(runner, store, image_files, old_host, shared_tmp):  # noqa: F811
    arch = shared_tmp / "cuda.tar"
    fx.write_docker_archive(str(arch), [(["gsbx/doctor:1"], [image_files["base"]], dict(
        Env=["PATH=/usr/bin:/bin", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"], Cmd=["/bin/false"]))])
    os.chmod(arch, 0o644)
    r = gsbx(runner, store, ["pull", "-q", f"docker-archive:{arch}"])
    assert r.returncode == 0, r.stderr
    dig = r.stdout.strip()

    r = gsbx(runner, store, ["doctor", "--json", "--gpus", "0", "--driver-root", old_host,
                             "gsbx/doctor:1"], timeout=300)
    assert r.stdout, r.stderr
    checks = _checks(json.loads(r.stdout))
    assert r.returncode == 1
    root = checks[("image", "rootfs")]
    assert root["status"] == "pass" and f"docker.io/gsbx/doctor:1 ({dig[:19]})" in root["detail"]
    req = checks[("image", "CUDA requirement")]
    assert req["status"] == "fail" and "cuda>=12.4" in req["detail"] and "12.2" in req["detail"]
    # the probe ran in a sandbox of the store image (its Cmd /bin/false not run)
    assert checks[("verify", "device nodes in sandbox")]["status"] == "pass", checks

    before = sorted(os.listdir(store / "refs")), sorted(os.listdir(store / "images"))
    r = gsbx(runner, store, ["doctor", "docker://gsbx/missing:2"])
    assert r.returncode == 125 and r.stdout == ""
    err = r.stderr.splitlines()
    assert err[0].startswith("gpusandbox: error: image not in the store: "
                             "docker.io/gsbx/missing:2"), err
    assert err[1:] == ["hint: pull it first: gpusandbox pull docker://docker.io/gsbx/missing:2"]
    assert (sorted(os.listdir(store / "refs")), sorted(os.listdir(store / "images"))) == before
