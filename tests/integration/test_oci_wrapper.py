"""The runtime wrapper (bin/gpusandbox-runtime) and the podman precreate
filter (`gpusandbox oci-filter`), driven through real runc and podman 4.3 on
the simulated host, root and rootless.  Every config.json they write is
checked against the runtime-spec schema."""
import json
import os
import subprocess

import pytest

from .oci_fixtures import (BASE_ENV, CRUN, PYTHON, RUNC, SHOW, Podman, assert_schema_valid,
                           make_rootfs, oci_dir, runc_bundle, shim)  # noqa: F401 (fixture)
from .conftest import CLI, MODES

LEGACY = {"path": "/usr/bin/nvidia-container-runtime-hook",
          "args": ["nvidia-container-runtime-hook", "prestart"]}


def check_gpu0(out):
    """GPU 0 is there and reachable (ENXIO: past the cgroup device filter,
    no driver behind the simulated node), GPU 1 is not, the driver is."""
    assert "open: cat: /dev/nvidia0: No such device or address" in out, out
    assert "absent /dev/nvidia1" in out, out
    assert "ls: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" in out, out
    assert "ls: /usr/bin/nvidia-smi\n" in out, out


def test_wrapper_create_through_runc(cli, sim_host, oci_dir):
    """`gpusandbox-runtime create` edits the bundle then execs runc with the
    same arguments: GPU 0 only, the legacy toolkit hook dropped (runc would
    fail on its missing binary), unknown keys kept, schema-valid output."""
    d = oci_dir
    runc_bundle(d, ["sh", "-c", SHOW], env=["NVIDIA_VISIBLE_DEVICES=0"],
                hooks={"prestart": [LEGACY]},
                extra={"x-gsbx-unknown": {"keep": [1, "two"]}})
    cfg = json.loads((d / "config.json").read_text())
    cfg["linux"]["x-gsbx-inner"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    wrapper = shim(d, sim_host.root)
    state = d / "runc-state"
    out = d / "out.txt"
    # runc create hands its stdio to the container: files, not pipes, or
    # the wait for EOF lasts as long as the container.
    with open(out, "w") as f:
        r = subprocess.run([wrapper, "--root", str(state), "--log-format", "json", "create",
                            "--bundle", str(d), "w1"], stdout=f, stderr=subprocess.STDOUT,
                           env=BASE_ENV, stdin=subprocess.DEVNULL, timeout=60)
    try:
        assert r.returncode == 0, out.read_text()
        start = subprocess.run([RUNC, "--root", str(state), "start", "w1"],
                               capture_output=True, text=True, timeout=30)
        assert start.returncode == 0, start.stderr
        for _ in range(100):
            st = subprocess.run([RUNC, "--root", str(state), "state", "w1"],
                                capture_output=True, text=True)
            if '"stopped"' in st.stdout:
                break
            subprocess.run(["sleep", "0.05"])
    finally:
        subprocess.run([RUNC, "--root", str(state), "delete", "-f", "w1"], capture_output=True)
    check_gpu0(out.read_text())
    edited = json.loads((d / "config.json").read_text())
    assert edited["x-gsbx-unknown"] == {"keep": [1, "two"]}
    assert edited["linux"]["x-gsbx-inner"] is True
    assert edited["hooks"]["prestart"] == []
    assert_schema_valid(edited)
    assert not list(d.glob(".config.json.*")), "temporary file left behind"


def test_wrapper_passthrough_and_no_gpu(cli, sim_host, oci_dir):
    """Without NVIDIA_VISIBLE_DEVICES the bundle stays byte for byte; other
    commands reach runc unchanged; a bad selector fails create in --log's
    format, nothing on stdout."""
    d = oci_dir
    runc_bundle(d, ["true"])
    before = (d / "config.json").read_bytes()
    wrapper = shim(d, sim_host.root)
    state = d / "runc-state"
    with open(d / "p1.txt", "w") as f:
        r = subprocess.run([wrapper, "--root", str(state), "create", "--bundle", str(d), "p1"],
                           stdout=f, stderr=subprocess.STDOUT, env=BASE_ENV, timeout=60,
                           stdin=subprocess.DEVNULL)
    subprocess.run([RUNC, "--root", str(state), "delete", "-f", "p1"], capture_output=True)
    assert r.returncode == 0, (d / "p1.txt").read_text()
    assert (d / "config.json").read_bytes() == before
    v = subprocess.run([wrapper, "--version"], capture_output=True, text=True, env=BASE_ENV)
    assert v.stdout == subprocess.run([RUNC, "--version"], capture_output=True,
                                      text=True).stdout
    # `state` (podman's most frequent call) reaches runc without Python.
    trace = d / "trace"
    subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace), wrapper,
                    "--root", str(state), "--log-format", "json", "state", "nosuch"],
                   capture_output=True, env=BASE_ENV)
    execs = [ln for ln in trace.read_text().splitlines() if "execve(" in ln and "= 0" in ln]
    assert len(execs) == 3 and "python" not in trace.read_text(), execs   # shim, entry, runc
    assert f'execve("{RUNC}"' in execs[-1], execs
    cfg = json.loads(before)
    cfg["process"]["env"].append("NVIDIA_VISIBLE_DEVICES=7")
    (d / "config.json").write_text(json.dumps(cfg))
    log = d / "log.json"
    r = subprocess.run([wrapper, "--root", str(state), "--log", str(log), "--log-format", "json",
                        "create", "--bundle", str(d), "p2"],
                       capture_output=True, text=True, env=BASE_ENV, timeout=60)
    assert r.returncode != 0 and r.stdout == ""
    entry = json.loads(log.read_text().splitlines()[-1])
    assert entry["level"] == "error" and "unknown device '7'" in entry["msg"], entry
    assert not (state / "p2").exists()


@pytest.fixture(params=MODES)
def podman(request, cli, test_user, oci_dir):
    return Podman(oci_dir, request.param, test_user)


def _rootfs(podman):
    return make_rootfs(podman.d / "img", podman.user if podman.mode == "rootless" else None)


def test_podman_through_wrapper(cli, test_user, oci_dir, sim_host):
    """`podman --runtime gpusandbox-runtime run -e NVIDIA_VISIBLE_DEVICES=0`
    over runc as root: the device cgroup the runtime applies lets GPU 0
    through (ENXIO) and nothing else.  Rootless: the crun test below."""
    podman = Podman(oci_dir, "root", test_user)
    (podman.d / "img").mkdir()
    rootfs = _rootfs(podman)
    r = podman.run_rootfs(rootfs, ["sh", "-c", SHOW], env=["NVIDIA_VISIBLE_DEVICES=0"],
                          pre=["--runtime", shim(podman.d, sim_host.root)])
    assert r.returncode == 0, r.stderr
    check_gpu0(r.stdout)


def test_podman_through_wrapper_over_crun(cli, test_user, oci_dir, sim_host):
    """The wrapper over crun, which runs in a cgroup2 view of this hybrid
    host; podman allows --cgroups disabled (crun cannot raise RLIMIT_MEMLOCK
    for its BPF device program here) only for a runtime named crun.  Root
    and rootless in one test: one view namespace each."""
    for mode in MODES:
        sub = oci_dir / ("r" if mode == "root" else "u")
        sub.mkdir()
        podman = Podman(sub, mode, test_user, view=True)
        (podman.d / "img").mkdir()
        rootfs = _rootfs(podman)
        rt = shim(podman.d / "rt", sim_host.root, runtime=CRUN, name="crun")
        r = podman.run_rootfs(rootfs, ["sh", "-c", SHOW], env=["NVIDIA_VISIBLE_DEVICES=0"],
                              pre=["--runtime", rt], cgroups=False)
        assert r.returncode == 0, (mode, r.stderr)
        check_gpu0(r.stdout)


def test_podman_precreate_filter(podman, sim_host):
    """podman's hooks.d precreate stage with the filter `hook install
    --stage precreate` registers: no wrapper, plain runc."""
    hooks = podman.d / "hooks.d"
    r = subprocess.run([CLI, "hook", "install", "--stage", "precreate", "--dir", str(hooks),
                        "--driver-root", sim_host.root], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads((hooks / "gpusandbox-filter.json").read_text())
    assert doc["stages"] == ["precreate"] and doc["hook"]["args"][:2] == [PYTHON, "-I"]
    (podman.d / "img").mkdir()
    rootfs = _rootfs(podman)
    r = podman.run_rootfs(rootfs, ["sh", "-c", SHOW], env=["NVIDIA_VISIBLE_DEVICES=0"],
                          pre=["--runtime", RUNC, "--hooks-dir", str(hooks)])
    assert r.returncode == 0, r.stderr
    check_gpu0(r.stdout)


def test_podman_hooks_d_hook(podman, sim_host):
    """The OCI hook from podman's hooks.d (`hook install`), over runc: nodes
    and files; the device cgroup is the runtime's (EPERM as root; rootless
    podman on cgroup v1 has none)."""
    hooks = podman.d / "hooks.d"
    r = subprocess.run([CLI, "hook", "install", "--dir", str(hooks),
                        "--driver-root", sim_host.root], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (podman.d / "img").mkdir()
    rootfs = _rootfs(podman)
    r = podman.run_rootfs(rootfs, ["sh", "-c", SHOW], env=["NVIDIA_VISIBLE_DEVICES=0"],
                          pre=["--runtime", RUNC, "--hooks-dir", str(hooks)])
    assert r.returncode == 0, r.stderr
    why = "Operation not permitted" if podman.mode == "root" else "No such device or address"
    assert f"open: cat: /dev/nvidia0: {why}" in r.stdout, r.stdout
    assert "absent /dev/nvidia1" in r.stdout, r.stdout
    assert "ls: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n" in r.stdout, r.stdout


def test_filter_output_schema_valid_and_untouched_without_gpu(cli, sim_host, oci_dir):
    d = oci_dir
    cfg = runc_bundle(d, ["true"], env=["NVIDIA_VISIBLE_DEVICES=GPU-" + "0" * 8 + "-nope"])
    cfg["root"]["path"] = str(d / "rootfs")   # podman hands an absolute root
    env = dict(BASE_ENV, GPUSANDBOX_DRIVER_ROOT=sim_host.root)
    plain = json.dumps({**cfg, "process": {**cfg["process"], "env": ["PATH=/bin"]}}).encode()
    r = subprocess.run([CLI, "oci-filter"], input=plain, capture_output=True, env=env)
    assert r.returncode == 0 and r.stdout == plain, r.stderr
    r = subprocess.run([CLI, "oci-filter"], input=json.dumps(cfg).encode(),
                       capture_output=True, env=env)
    assert r.returncode == 125 and r.stdout == b""
    assert r.stderr.decode().startswith("gpusandbox: error: NVIDIA_VISIBLE_DEVICES"), r.stderr
    cfg["process"]["env"][-1] = "NVIDIA_VISIBLE_DEVICES=" + sim_host.gpus[1]["uuid"]
    r = subprocess.run([CLI, "oci-filter"], input=json.dumps(cfg).encode(),
                       capture_output=True, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert_schema_valid(out)
    assert sorted(x["minor"] for x in out["linux"]["resources"]["devices"]
                  if x.get("major") == 195 and x.get("allow")) == [1, 255]
    src = next(m["source"] for m in out["mounts"] if m["destination"] == "/etc/ld.so.cache")
    assert os.path.exists(src)
    # No runtime here to run the poststop hook: run it as runc's delete would.
    post = out["hooks"]["poststop"][-1]
    r = subprocess.run(post["args"], env=dict(e.split("=", 1) for e in post["env"]),
                       input=b"{}", capture_output=True)
    assert r.returncode == 0, r.stderr
    assert not os.path.exists(os.path.dirname(src))
