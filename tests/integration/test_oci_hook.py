"""`gpusandbox hook` through real runc: the hook `hook install` registers
injects the GPUs NVIDIA_VISIBLE_DEVICES asks for into the live container,
and holds against the attacks the toolkit's hook fell to: links in the
container root planted or swapped during injection (CVE-2024-0132 class)
and the container's environment reaching the hook (CVE-2025-23266)."""
import json
import os
import subprocess
import threading

import pytest

from .conftest import CLI, host_mounts, tree_checksum
from .oci_fixtures import (BASE_ENV, RUNC, SHOW, make_rootfs, oci_dir,  # noqa: F401
                           runc_bundle, runc_run)

PROC = "; ls /proc/driver/nvidia/gpus | sed 's/^/bus: /'"


def hook_def(d, sim_root, stage):
    """The hook object `gpusandbox hook install` writes, as podman would put
    it into config.json."""
    r = subprocess.run([CLI, "hook", "install", "--dir", str(d / "hooks.d"), "--stage", stage,
                        "--driver-root", sim_root], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads((d / "hooks.d" / "gpusandbox-hook.json").read_text())
    assert doc["version"] == "1.0.0" and doc["stages"] == [stage] and doc["when"]["always"]
    assert "-I" in doc["hook"]["args"] and doc["hook"]["env"]
    return doc["hook"]


def test_hook_injects_selected_gpu(sim_host, oci_dir):
    stage = "createRuntime"
    d = oci_dir
    hook = hook_def(d, sim_host.root, stage)
    runc_bundle(d, ["sh", "-c", SHOW + PROC], env=["NVIDIA_VISIBLE_DEVICES=0"],
                hooks={stage: [hook]})
    r = runc_run(d, "h-" + stage)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "absent /dev/nvidia1" in out, out
    # The node is there; the runtime applied the cgroup device rules before
    # hooks ran, so opening it is refused (docs/hook.md: use the wrapper).
    assert "open: cat: /dev/nvidia0: Operation not permitted" in out, out
    assert "ls: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" in out, out
    assert "ls: /usr/bin/nvidia-smi\n" in out, out
    assert f"bus: {sim_host.gpus[0]['bus_id']}\n" in out
    assert out.count("bus: ") == 1, out


def test_hook_without_gpu_request_leaves_container_alone(sim_host, oci_dir):
    d = oci_dir
    hook = hook_def(d, sim_host.root, "createRuntime")
    runc_bundle(d, ["sh", "-c", SHOW], hooks={"createRuntime": [hook]})
    before = tree_checksum(d / "rootfs")
    r = runc_run(d, "h-none")
    assert r.returncode == 0, r.stderr
    assert "absent /dev/nvidia0" in r.stdout
    assert tree_checksum(d / "rootfs") == before


EVIL_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "loaded\n", 7); close(fd); }
}
"""


def test_container_env_never_reaches_hook(sim_host, oci_dir):
    """CVE-2025-23266: LD_PRELOAD (and Python's own variables) in the
    container's environment, pointing at a library the image carries.  runc
    gives a createContainer hook without `env` the container's environment
    (the control shows the attack is live); the hook `hook install` writes
    runs clean and still injects."""
    d = oci_dir
    marker = d / "pwned"
    src = d / "evil.c"
    src.write_text(EVIL_C)
    hook = hook_def(d, sim_host.root, "createContainer")
    bad_env = ["LD_PRELOAD=/proc/self/cwd/evil.so", "PYTHONPATH=/evil", "PYTHONINSPECT=1",
               "NVIDIA_VISIBLE_DEVICES=0"]
    runc_bundle(d, ["sh", "-c", SHOW], env=bad_env, hooks={"createContainer": [hook]})
    so = d / "rootfs" / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(so), str(src)],
                   check=True)
    (d / "rootfs" / "evil").mkdir()
    (d / "rootfs" / "evil" / "sitecustomize.py").write_text(
        f"open({str(marker)!r}, 'a').write('python\\n')\n")
    r = runc_run(d, "h-env")
    assert not marker.exists(), marker.read_text()
    assert r.returncode == 0, r.stderr
    assert "ls: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" in r.stdout, r.stdout
    # Control: the same hook registered without an explicit env.
    cfg = json.loads((d / "config.json").read_text())
    del cfg["hooks"]["createContainer"][0]["env"]
    (d / "config.json").write_text(json.dumps(cfg))
    runc_run(d, "h-env2")
    assert marker.exists(), "control: runc did not hand the container env to the hook"


def _new_mounts_at(canary, before):
    """Host mounts made since `before` on the canary (other tests on this
    machine mount elsewhere at the same time)."""
    return [m for m in host_mounts() if m not in before and str(canary) in m]


@pytest.fixture
def canary(oci_dir):
    c = oci_dir / "canary"
    (c / "sub").mkdir(parents=True)
    (c / "secret").write_text("host secret\n")
    os.chmod(c, 0o777)
    return c


def _plant(root, path, target):
    p = root / path.lstrip("/")
    if p.is_symlink() or p.is_file():
        p.unlink()
    elif p.exists():
        subprocess.run(["rm", "-rf", str(p)], check=True)
    p.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, p)


def test_hook_planted_links_stay_in_root(sim_host, oci_dir, canary):
    """Links at the places the hook writes, absolute and relative, towards a
    host directory: nothing is created, written or mounted outside the root."""
    d = oci_dir
    hook = hook_def(d, sim_host.root, "createRuntime")
    runc_bundle(d, ["sh", "-c", SHOW], env=["NVIDIA_VISIBLE_DEVICES=0"],
                hooks={"createRuntime": [hook]})
    root = d / "rootfs"
    _plant(root, "/etc/ld.so.cache", str(canary / "secret"))
    _plant(root, "/usr/lib/firmware", "../../../../../../" + str(canary / "sub").lstrip("/"))
    _plant(root, "/usr/bin/nvidia-smi", str(canary / "secret"))
    _plant(root, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", str(canary / "sub" / "x"))
    before, mounts = tree_checksum(canary), host_mounts()
    r = runc_run(d, "h-links")
    assert tree_checksum(canary) == before
    assert _new_mounts_at(canary, mounts) == []
    assert r.returncode == 0, r.stderr
    assert "ls: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" in r.stdout, r.stdout


def test_hook_links_swapped_during_injection(sim_host, oci_dir, canary):
    """A racer swaps the firmware and library directories between real
    directories and links to the host while the hook injects: a run may
    fail, nothing outside the root changes."""
    d = oci_dir
    hook = hook_def(d, sim_host.root, "createRuntime")
    runc_bundle(d, ["true"], env=["NVIDIA_VISIBLE_DEVICES=0"], hooks={"createRuntime": [hook]})
    root = d / "rootfs"
    fw = root / "usr" / "lib" / "firmware"
    fw.mkdir(parents=True, exist_ok=True)
    before, mounts = tree_checksum(canary), host_mounts()
    stop = threading.Event()

    def racer():
        aside = root / "usr" / "lib" / ".fw-aside"
        while not stop.is_set():
            for step in (lambda: os.rename(fw, aside),
                         lambda: os.symlink(str(canary / "sub"), fw),
                         lambda: os.unlink(fw),
                         lambda: os.rename(aside, fw)):
                try:
                    step()
                except OSError:
                    pass

    t = threading.Thread(target=racer, daemon=True)
    t.start()
    try:
        codes = [runc_run(d, f"h-race{i}").returncode for i in range(2)]
    finally:
        stop.set()
        t.join()
    assert tree_checksum(canary) == before
    assert _new_mounts_at(canary, mounts) == []
    assert codes  # each run either injected or failed; none escaped


def test_hook_rootless_runc(sim_host, oci_dir, canary, test_user):
    """Rootless runc (the test user's own user namespace): the hook, at the
    legacy prestart stage, enters it, injects GPU 0, and planted links still
    resolve inside the root."""
    d = oci_dir
    hook = hook_def(d, sim_host.root, "prestart")
    make_rootfs(d)
    root = d / "rootfs"
    _plant(root, "/etc/ld.so.cache", str(canary / "secret"))
    _plant(root, "/usr/lib/firmware", str(canary / "sub"))
    as_user = ["setpriv", f"--reuid={test_user.pw_uid}", f"--regid={test_user.pw_gid}",
               "--clear-groups", "--"]
    subprocess.run(["chown", "-R", f"{test_user.pw_uid}:{test_user.pw_gid}", str(d)], check=True)
    subprocess.run(as_user + [RUNC, "spec", "--rootless"], cwd=d, check=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["process"].update(terminal=False, args=["sh", "-c", SHOW])
    cfg["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=0")
    cfg["hooks"] = {"prestart": [hook]}
    (d / "config.json").write_text(json.dumps(cfg))
    before, mounts = tree_checksum(canary), host_mounts()
    env = dict(BASE_ENV, HOME=str(d), XDG_RUNTIME_DIR=str(d / "xdg"))
    r = subprocess.run(as_user + [RUNC, "--root", str(d / "state"), "run", "r1"],
                       capture_output=True, text=True, env=env, cwd=d, timeout=60,
                       stdin=subprocess.DEVNULL)
    subprocess.run(as_user + [RUNC, "--root", str(d / "state"), "delete", "-f", "r1"],
                   capture_output=True, env=env)
    assert tree_checksum(canary) == before
    assert _new_mounts_at(canary, mounts) == []
    assert r.returncode == 0, r.stderr
    # No device cgroup for a rootless container on cgroup v1: the node opens
    # as far as the (absent) driver.
    assert "open: cat: /dev/nvidia0: No such device or address" in r.stdout, r.stdout
    assert "absent /dev/nvidia1" in r.stdout
    assert "ls: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" in r.stdout, r.stdout
