"""The registry helper's command line, as scripts/demo uses it: serve a
docker-registry on 127.0.0.1, write an image from a tree, push it, pull and
run it with gpusandbox, stop the registry by its pid (nothing left running)."""
import os
import shutil
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tool(*args, **kw):
    return subprocess.run(["/usr/bin/python3", "-m", "bench_lib.registry", *args],
                          cwd=os.path.join(REPO, "scripts"), capture_output=True, text=True,
                          timeout=120, **kw)


def _alive_registry(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "docker-registry" and state != "Z"
    except OSError:
        return False


@pytest.fixture
def served(tmp_path):
    for tool in ("/usr/bin/docker-registry", "skopeo"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed (scripts/test installs it)")
    reg = tmp_path / "reg"
    p = _tool("serve", str(reg))
    assert p.returncode == 0, p.stderr
    port, pid = (int(x) for x in p.stdout.split())
    try:
        yield reg, port, pid
    finally:
        _tool("stop", str(reg))


def test_serve_image_push_pull_run_stop(served, tmp_path, runner, small_rootfs, shared_tmp):
    reg, port, pid = served
    assert _alive_registry(pid)
    (small_rootfs / "etc" / "greeting").write_text("hello from the registry\n")
    p = _tool("image", str(tmp_path / "oci"), str(small_rootfs), "t")
    assert p.returncode == 0 and p.stdout.startswith("sha256:"), p.stderr
    p = _tool("push", str(reg), str(tmp_path / "oci"), "t", "x/demo:1")
    assert p.returncode == 0, p.stderr
    ref = f"docker://127.0.0.1:{port}/x/demo:1"
    os.chown(shared_tmp, runner.uid, runner.gid)
    r = runner.run([ref, "cat", "/etc/greeting"],
                   env={"GPUSANDBOX_STORE": str(shared_tmp / "store")})
    assert (r.returncode, r.stdout) == (0, "hello from the registry\n"), r.stderr
    p = _tool("stop", str(reg))
    assert p.returncode == 0, p.stderr
    for _ in range(50):
        if not _alive_registry(pid):
            break
        time.sleep(0.1)
    assert not _alive_registry(pid), "the registry still runs after stop"
    assert not (reg / "registry.pid").exists()
