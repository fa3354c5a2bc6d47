"""Attacks on the GPU injection paths (CVE-2024-0132/0133/0134 class):
symlinks planted at every place the launcher writes driver files, links,
the loader cache or the masked /proc/driver, absolute, relative and chained.
Nothing may be created, mounted or written outside the root."""
import os
import shutil
import subprocess

import pytest

from .conftest import host_mounts, tree_checksum

PATHS = ["/etc/ld.so.cache", "/etc/ld.so.conf.d", "/usr/lib/x86_64-linux-gnu", "/usr/bin",
         "/lib/firmware/nvidia", "/proc/driver", "/lib"]
PATH_PARAMS = PATHS


@pytest.fixture
def canary(shared_tmp):
    d = shared_tmp / "canary"
    d.mkdir()
    (d / "secret").write_text("host secret\n")
    (d / "sub").mkdir()
    os.chmod(d, 0o777)
    os.chmod(d / "sub", 0o777)
    os.chmod(d / "secret", 0o666)
    return d


def plant(root, path, kind, canary):
    """Replace `path` in the image with a symlink towards the host canary."""
    target_host = canary / ("secret" if path == "/etc/ld.so.cache" else "sub")
    p = root / path.lstrip("/")
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.is_dir():
        shutil.rmtree(p)
    p.parent.mkdir(parents=True, exist_ok=True)
    if kind == "absolute":
        os.symlink(str(target_host), p)
    elif kind == "relative":
        depth = len(path.strip("/").split("/")) - 1
        os.symlink("../" * (depth + 3) + str(target_host).lstrip("/"), p)
    else:  # chained: image link -> image link -> host path
        os.symlink("/opt/hop1", p)
        os.symlink("/opt/hop2", root / "opt" / "hop1")
        os.symlink(str(target_host), root / "opt" / "hop2")


@pytest.mark.parametrize("path", PATH_PARAMS)
@pytest.mark.parametrize("kind", ["absolute", "relative", "chained"])
def test_symlinks_at_gpu_injection_paths(runner, small_rootfs, sim_host, canary, path, kind):
    root = small_rootfs
    env = ["-e", "PATH=/usr/bin:/usr/realbin:/bin"]
    if path == "/usr/bin":
        # Keep the image's tools reachable; nvidia-smi arrives by injection.
        shutil.copytree(root / "usr" / "bin", root / "usr" / "realbin", symlinks=True)
    if path == "/usr/lib/x86_64-linux-gnu":
        # Keep the image's loader and libc reachable, so that the command can
        # show whether the driver libraries arrived.
        shutil.copytree(root / "usr" / "lib" / "x86_64-linux-gnu", root / "usr" / "reallib")
        ld = root / "usr" / "lib64" / "ld-linux-x86-64.so.2"
        ld.unlink()
        os.symlink("/usr/reallib/ld-linux-x86-64.so.2", ld)
        env += ["-e", "LD_LIBRARY_PATH=/usr/reallib:/usr/lib/x86_64-linux-gnu"]
    plant(root, path, kind, canary)
    if runner.mode == "rootless":
        subprocess.run(["chown", "-R", f"{runner.uid}:{runner.gid}", str(root)], check=True)
    before_canary, before_mounts = tree_checksum(canary), host_mounts()
    r = runner.run(["--driver-root", str(sim_host), "--gpus", "0", *env, str(root),
                    "nvidia-smi", "-L"])
    assert tree_checksum(canary) == before_canary, f"host canary changed ({path}, {kind})"
    assert host_mounts() == before_mounts
    assert "Traceback" not in r.stderr
    if r.returncode == 125:
        # Refusing the hostile link is fine: one clear line that names it.
        first = r.stderr.splitlines()[0]
        assert first.startswith("gpusandbox: error: ") and (
            "symlink" in first or path in first), r.stderr
    else:
        # Contained: the injected nvidia-smi ran on the injected driver
        # library and the selected node, whatever the link pointed at.
        assert r.returncode == 0, (r.returncode, r.stderr)
        lines = r.stdout.splitlines()
        assert len(lines) == 1 and lines[0].startswith("GPU 0: "), r.stdout
        assert lines[0].endswith(f"(UUID: {sim_host.gpus[0]['uuid']})"), r.stdout


def test_image_visible_devices_never_widens(runner, small_rootfs, sim_host):
    (small_rootfs / "etc" / "environment").write_text(
        "NVIDIA_VISIBLE_DEVICES=all\nNVIDIA_DRIVER_CAPABILITIES=all\nCUDA_VISIBLE_DEVICES=0,1,2,3\n")
    r = runner.run(["--driver-root", str(sim_host), "--gpus", "2", str(small_rootfs), "sh", "-c",
                    "nvidia-smi -L; ls /dev | grep -c '^nvidia[0-9]'"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln for ln in lines if ln.startswith("GPU ")] == [lines[0]]
    assert lines[-1] == "1"
