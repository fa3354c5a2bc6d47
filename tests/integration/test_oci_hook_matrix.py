"""`gpusandbox hook` under crun (in a cgroup2 view of this hybrid host), and
the hook against run's attack matrix: each place the hook writes holds a
planted link of one kind (absolute, relative, chained, dangling, towards
the host's /etc, through /proc/self/root); one container per kind, every
place planted at once.  Nothing outside the container root may be
created, written or mounted."""
import hashlib
import json
import os
import subprocess

from .conftest import host_mounts, tree_checksum
from .oci_fixtures import (BASE_ENV, CGROUP2_VIEW, CRUN, SHOW, oci_dir,  # noqa: F401
                           runc_bundle, runc_run)
from .test_oci_hook import _plant, canary, hook_def  # noqa: F401 (fixture)

LIBDIR = "/usr/lib/x86_64-linux-gnu"
# The places the hook binds or writes for GPU 0, and whether a directory
# (True) or a file is bound there.
PLACES = {"/etc/ld.so.cache": False, "/usr/lib/firmware": True, "/usr/bin/nvidia-smi": False,
          f"{LIBDIR}/libcuda.so.1": False, f"{LIBDIR}/libnvidia-ml.so.1": False}
HOST_ETC = ("/etc/hostname", "/etc/passwd", "/etc/ld.so.cache")


def link_target(kind, place, is_dir, canary, root):
    """The link planted at `place` for one kind of attack."""
    host = str(canary / ("sub" if is_dir else "secret"))
    if kind == "absolute":
        return host
    if kind == "relative":
        return "../" * 10 + host.lstrip("/")
    if kind == "chained":
        # place -> /chain-N (a link in the root) -> ../../host path
        hop = f"/chain-{abs(hash(place)) % 10**6}"
        _plant(root, hop, "../" * 6 + host.lstrip("/"))
        return hop
    if kind == "dangling":
        return str(canary / "nothere" / os.path.basename(place))
    if kind == "host-etc":
        return "/etc" if is_dir else "/etc/hostname"
    if kind == "proc-self-root":
        return "/proc/self/root" + host
    raise AssertionError(kind)


def _etc_state():
    h = hashlib.sha256()
    for p in HOST_ETC:
        st = os.lstat(p)
        h.update(f"{p}{st.st_mtime_ns}{st.st_size}".encode())
    h.update("\0".join(sorted(os.listdir("/etc"))).encode())
    return h.hexdigest()


def test_hook_link_matrix_stays_in_root(sim_host, oci_dir, canary):
    d = oci_dir
    hook = hook_def(d, sim_host.root, "createRuntime")
    runc_bundle(d, ["sh", "-c", SHOW], env=["NVIDIA_VISIBLE_DEVICES=0"],
                hooks={"createRuntime": [hook]})
    root = d / "rootfs"
    kinds = ("absolute", "relative", "chained", "dangling", "host-etc", "proc-self-root")
    results = {}
    for kind in kinds:
        planted = {}
        for place, is_dir in PLACES.items():
            planted[place] = link_target(kind, place, is_dir, canary, root)
            _plant(root, place, planted[place])
        before, etc, mounts = tree_checksum(canary), _etc_state(), host_mounts()
        r = runc_run(d, f"h-m-{kind}")
        new = [m for m in host_mounts() if m not in mounts]
        assert tree_checksum(canary) == before, kind
        assert _etc_state() == etc, kind
        assert [m for m in new if str(canary) in m or m.split()[0].startswith("/etc")] == [], \
            (kind, new)
        # Resolved inside the root (RESOLVE_IN_ROOT), a link only moves
        # where the injection lands in the container, or fails it closed.
        results[kind] = r.returncode
        if r.returncode != 0:
            assert "gpusandbox: error: " in r.stderr, (kind, r.stderr)
        else:
            assert "ls: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" in r.stdout, (kind, r.stdout)
        for place in PLACES:
            p = root / place.lstrip("/")
            if p.is_symlink() or p.is_file():
                p.unlink()
    # The plain kinds inject; only magic links may refuse.
    assert [k for k, rc in results.items() if rc != 0 and k != "proc-self-root"] == [], results


def test_hook_under_crun(sim_host, oci_dir):
    """crun (cgroup2 view, no cgroup manager: crun cannot load its BPF
    device program here) runs the createRuntime hook `hook install` writes:
    GPU 0's node (no device filter: ENXIO from the absent driver), not GPU
    1's, the driver files."""
    d = oci_dir
    hook = hook_def(d, sim_host.root, "createRuntime")
    runc_bundle(d, ["sh", "-c", SHOW], env=["NVIDIA_VISIBLE_DEVICES=0"],
                hooks={"createRuntime": [hook]})
    cfg = json.loads((d / "config.json").read_text())
    cfg["linux"].pop("resources", None)
    (d / "config.json").write_text(json.dumps(cfg))
    state = d / "crun-state"
    crun = [CRUN, "--root", str(state), "--cgroup-manager", "disabled"]
    try:
        r = subprocess.run(CGROUP2_VIEW + crun + ["run", "--bundle", str(d), "h-crun"],
                           capture_output=True, text=True, timeout=60, env=BASE_ENV,
                           stdin=subprocess.DEVNULL)
    finally:
        subprocess.run(CGROUP2_VIEW + crun + ["delete", "-f", "h-crun"], capture_output=True)
    assert r.returncode == 0, r.stderr
    assert "open: cat: /dev/nvidia0: No such device or address" in r.stdout, r.stdout
    assert "absent /dev/nvidia1" in r.stdout, r.stdout
    assert "ls: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" in r.stdout, r.stdout
    assert "ls: /usr/bin/nvidia-smi\n" in r.stdout, r.stdout
