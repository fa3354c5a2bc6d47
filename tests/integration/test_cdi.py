"""CDI out and in (issue 12), with real parts: the CDI reference
implementation (Debian's Go module, built here into a small validator),
podman 4.3 with runc, and the installed CLI on a simulated GPU host, as root
and as an unprivileged user."""
import hashlib
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from .conftest import BASE, SimHost

HERE = os.path.dirname(os.path.abspath(__file__))
GO_MODULE = ("/usr/share/gocode/src/github.com/container-orchestrated-devices/"
             "container-device-interface")
LIBDIR = "/usr/lib/x86_64-linux-gnu"
VERSION = "550.54.15"

PROBE = """
echo "nodes: $(ls /dev | grep nvidia | sort | tr '\\n' ' ')"
echo "libs: $(ls /usr/lib/x86_64-linux-gnu | grep -E 'nvidia|cuda' | sort | tr '\\n' ' ')"
python3 -c "
import ctypes, os
ctypes.CDLL('libcuda.so.1'); print('libcuda: loads')
for p in ('/dev/nvidia0', '/dev/nvidia1'):
    try: os.close(os.open(p, os.O_RDWR)); print(p + ': opened')
    except OSError as e: print(p + ': ' + e.strerror)
"
echo "params: $(head -1 /proc/driver/nvidia/params)"
"""


def probe(out):
    return dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)


@pytest.fixture(scope="session")
def validator():
    """The reference's ReadSpec/InjectDevices as a program, built once per
    source (GOPATH mode over Debian's packaged sources: no network)."""
    go = shutil.which("go")
    if not go or not os.path.isdir(GO_MODULE):
        pytest.skip("golang-go and golang-github-container-orchestrated-devices-"
                    "container-device-interface-dev are not installed (scripts/test installs them)")
    src = os.path.join(HERE, "cdi_validator", "main.go")
    with open(src, "rb") as f:
        tag = hashlib.sha256(f.read()).hexdigest()[:12]
    out = BASE / f"cdi-validate-{tag}"
    if not out.exists():
        BASE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(src, tmp)
            env = {"PATH": os.environ["PATH"], "HOME": tmp, "GOPATH": "/usr/share/gocode",
                   "GO111MODULE": "off", "GOCACHE": os.path.join(tmp, "cache"),
                   "GOFLAGS": ""}
            r = subprocess.run([go, "build", "-o", f"{out}.tmp", "main.go"], cwd=tmp, env=env,
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr
            os.rename(f"{out}.tmp", out)
    return str(out)


def make_sim(cli, *opts, root=None):
    base = root or tempfile.mkdtemp(prefix="gsbx-test-cdisim-", dir="/tmp")
    os.chmod(base, 0o755)
    host = os.path.join(base, "host")
    if os.path.exists(host):
        subprocess.run([cli, "sim", "destroy", host], capture_output=True)
    r = subprocess.run([cli, "sim", "create", host, "--json", *opts], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return SimHost(host, json.loads(r.stdout))


@pytest.fixture(scope="module")
def cdi_sim(cli):
    sim = make_sim(cli, "--gpus", "2", "--mig", "1:1:0")
    yield sim
    subprocess.run([cli, "sim", "destroy", sim.root], capture_output=True)
    shutil.rmtree(os.path.dirname(sim.root), ignore_errors=True)


def cdi(cli, *args, env=None):
    return subprocess.run([cli, "cdi", *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], **(env or {})})


def test_generated_specs_pass_the_reference(cli, cdi_sim, validator, shared_tmp):
    d = shared_tmp / "specs"
    d.mkdir()
    variants = {
        "default.yaml": [],
        "hooks.json": ["--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook",
                       "--device-name-strategy", "index", "--device-name-strategy", "uuid",
                       "--device-name-strategy", "type-index"],
        "pinned.yaml": ["--cdi-version", "0.5.0", "--vendor", "example.com", "--class", "acc"],
    }
    for name, opts in variants.items():
        r = cdi(cli, "generate", "--driver-root", cdi_sim.root, "--output", str(d / name),
                "--nvidia-cdi-hook-path", "", *opts)
        assert r.returncode == 0, r.stderr
        assert os.stat(d / name).st_mode & 0o777 == 0o644
        v = subprocess.run([validator, str(d / name)], capture_output=True, text=True)
        assert v.returncode == 0, v.stderr
        text = (d / name).read_text()
        doc = json.loads(text) if name.endswith(".json") else __import__("yaml").safe_load(text)
        assert doc["cdiVersion"] == "0.5.0"      # "0" and hostPath need 0.5.0, nothing more
        assert v.stdout.split() == [f"{doc['kind']}={x['name']}" for x in doc["devices"]]
    names = [ln.split("=", 1)[1] for ln in subprocess.run(
        [validator, str(d / "hooks.json")], capture_output=True, text=True).stdout.split()]
    g = cdi_sim.gpus
    assert names[:3] == ["0", g[0]["uuid"], "gpu0"] and "1:1" in names and "mig1:1" in names
    assert names[-1] == "all"
    # A directory as --output: the file is named for the kind, written whole.
    d = shared_tmp / "dir"
    d.mkdir()
    r = cdi(cli, "generate", "--driver-root", cdi_sim.root, "--output", str(d))
    assert r.returncode == 0 and os.listdir(d) == ["nvidia-gpu.yaml"], r.stderr
    # A pin below what the content needs is refused, in one line.
    r = cdi(cli, "generate", "--driver-root", cdi_sim.root, "--cdi-version", "0.4.0")
    assert r.returncode == 125 and r.stdout == ""
    assert r.stderr.startswith("gpusandbox: error: --cdi-version 0.4.0: the spec needs 0.5.0")
    # The reference applies the spec's edits as gpusandbox does: nodes, mounts, hooks.
    inj = subprocess.run([validator, "-dirs", str(d), "-inject", "nvidia.com/gpu=0"],
                         capture_output=True, text=True)
    assert inj.returncode == 0, inj.stderr
    oci = json.loads(inj.stdout)
    assert sorted(x["path"] for x in oci["linux"]["devices"]) == [
        "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"]
    assert f"{LIBDIR}/libcuda.so.{VERSION}" in [m["destination"] for m in oci["mounts"]]


def test_edits_apply_in_the_references_order(validator, shared_tmp):
    """Two specs, three devices, keys and paths named twice: the edits
    gpusandbox makes are the ones the reference's InjectDevices makes."""
    from gpusandbox.oci.cdi import resolve
    d = shared_tmp / "order"
    d.mkdir()
    f1, f2 = shared_tmp / "f1", shared_tmp / "f2"
    f1.write_text("1")
    f2.mkdir()
    a = {"cdiVersion": "0.5.0", "kind": "a.com/xx",
         "containerEdits": {"env": ["K=specA", "S=a"],
                            "mounts": [{"hostPath": str(f1), "containerPath": "/m/z"}]},
         "devices": [
             {"name": "d1", "containerEdits": {
                 "env": ["K=d1"], "deviceNodes": [{"path": "/dev/cdi-a", "hostPath": "/dev/null"}],
                 "mounts": [{"hostPath": str(f2), "containerPath": "/m"},
                            {"hostPath": str(f1), "containerPath": "/m/b", "options": ["ro"]}]}},
             {"name": "d2", "containerEdits": {
                 "env": ["K=d2"], "deviceNodes": [{"path": "/dev/cdi-a", "hostPath": "/dev/zero"}],
                 "mounts": [{"hostPath": str(f2), "containerPath": "/m/z"}]}}]}
    b = {"cdiVersion": "0.5.0", "kind": "b.com/yy",
         "containerEdits": {"env": ["K=specB"],
                            "mounts": [{"hostPath": str(f1), "containerPath": "/a/b"}]},
         "devices": [{"name": "e1", "containerEdits": {
             "env": ["T=1"], "deviceNodes": [{"path": "/dev/cdi-b", "hostPath": "/dev/full"}]}}]}
    (d / "a.json").write_text(json.dumps(a))
    (d / "b.yaml").write_text(json.dumps(b))
    names = ["b.com/yy=e1", "a.com/xx=d1", "a.com/xx=d2"]
    r = subprocess.run([validator, "-dirs", str(d), "-inject", *names], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    ref = json.loads(r.stdout)
    ours = resolve(names, spec_dirs=[str(d)]).edits
    assert ours.env == dict(e.split("=", 1) for e in ref["process"]["env"]) == {
        "K": "d2", "S": "a", "T": "1"}
    assert [(m.path, m.host_path) for m in ours.mounts] == [
        (m["destination"], m["source"]) for m in ref["mounts"]]
    assert [(n.path, n.major, n.minor) for n in ours.device_nodes] == [
        (x["path"], x["major"], x["minor"]) for x in ref["linux"]["devices"]]


def toolkit_spec(sim, libs, dev_links, env_value):
    """A spec shaped like `nvidia-ctk cdi generate` output (YAML, index and
    uuid names, the driver's files at their own paths, createContainer hooks
    of nvidia-cdi-hook), pointing at the simulated host."""
    import yaml
    hook = "/usr/bin/nvidia-cdi-hook"
    host_lib = os.path.join(sim.root, LIBDIR.lstrip("/"))
    links = []
    for name in dev_links:
        links += ["--link", f"{name}.1::{LIBDIR}/{name}"]

    def node(n):
        return {"path": f"/dev/{n}", "hostPath": os.path.join(sim.root, "dev", n)}

    def h(*args):
        return {"hookName": "createContainer", "path": hook, "args": ["nvidia-cdi-hook", *args],
                "env": ["NVIDIA_CTK_DEBUG=false"]}
    doc = {
        "cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
        "devices": [{"name": "0", "containerEdits": {"deviceNodes": [node("nvidia0")]}},
                    {"name": sim.gpus[0]["uuid"],
                     "containerEdits": {"deviceNodes": [node("nvidia0")]}}],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void", f"CDI_PROBE={env_value}"],
            "deviceNodes": [node("nvidiactl"), node("nvidia-uvm"), node("nvidia-uvm-tools")],
            "mounts": [{"hostPath": f"{host_lib}/{n}", "containerPath": f"{LIBDIR}/{n}",
                        "options": ["ro", "nosuid", "nodev", "bind"]} for n in libs],
            "hooks": [h("create-symlinks", *links), h("update-ldcache", "--folder", LIBDIR),
                      h("disable-device-node-modification"), h("update-application-profile")],
        },
    }
    return "---\n" + yaml.safe_dump(doc)


def test_toolkit_spec_runs_like_gpus(runner, cdi_sim, rootfs, shared_tmp):
    base = runner.run(["--driver-root", cdi_sim.root, "--gpus", "0", str(rootfs), "sh", "-c",
                       PROBE])
    assert base.returncode == 0, base.stderr
    want = probe(base.stdout)
    libs = [n for n in want["libs"].split() if n.endswith(f".so.{VERSION}")]
    # The toolkit links the development names (libcuda.so) of the libraries
    # that have one; ldconfig (update-ldcache) makes the SONAME links.
    dev_links = [n for n in want["libs"].split() if n.endswith(".so")]
    specs = shared_tmp / "cdi"
    specs.mkdir()
    (specs / "nvidia.yaml").write_text(toolkit_spec(cdi_sim, libs, dev_links, "from-spec"))
    r = runner.run(["--device", "nvidia.com/gpu=0", str(rootfs), "sh", "-c",
                    PROBE + 'echo "env: $CDI_PROBE $NVIDIA_VISIBLE_DEVICES"'],
                   env={"GPUSANDBOX_CDI_SPEC_DIRS": str(specs)})
    assert r.returncode == 0, r.stderr
    got = probe(r.stdout)
    for key in ("nodes", "libs", "libcuda", "/dev/nvidia0", "/dev/nvidia1", "params"):
        assert got[key] == want[key], (key, got[key], want[key])
    assert got["/dev/nvidia0"] == "No such device or address"   # through the device filter
    assert got["params"] == "ModifyDeviceFiles: 0"
    assert got["env"] == "from-spec void"
    warns = [ln for ln in r.stderr.splitlines() if "update-application-profile" in ln]
    assert len(warns) == 1 and warns[0].startswith("gpusandbox: warning: CDI hook"), r.stderr
    # gpusandbox's own spec, with its NVIDIA-shaped hooks, round-trips too.
    own = shared_tmp / "own"
    own.mkdir()
    assert cdi(runner.cli, "generate", "--driver-root", cdi_sim.root, "--output", str(own),
               "--nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook").returncode == 0
    r = runner.run(["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=" +
                    cdi_sim.gpus[0]["uuid"], str(rootfs), "sh", "-c", PROBE],
                   env={"GPUSANDBOX_CDI_SPEC_DIRS": str(own)})
    assert r.returncode == 0 and r.stderr == "", r.stderr
    got = probe(r.stdout)
    for key in ("nodes", "libs", "libcuda", "/dev/nvidia0", "/dev/nvidia1", "params"):
        assert got[key] == want[key], (key, got[key], want[key])


def test_bad_specs_fail_before_launch(root_runner, cdi_sim, rootfs, shared_tmp):
    etc, run = shared_tmp / "etc", shared_tmp / "run"
    etc.mkdir()
    run.mkdir()
    dev = {"path": "/dev/nvidia0", "hostPath": os.path.join(cdi_sim.root, "dev", "nvidia0")}
    one = {"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
           "devices": [{"name": "0", "containerEdits": {"deviceNodes": [dev]}}]}
    (run / "a.json").write_text(json.dumps(one))
    (run / "b.json").write_text(json.dumps(one))
    wrong = dict(one, devices=[{"name": "1", "containerEdits": {
        "deviceNodes": [dict(dev, major=1, minor=3)]}}])
    (etc / "wrong.json").write_text(json.dumps(wrong))
    env = {"GPUSANDBOX_CDI_SPEC_DIRS": f"{etc}:{run}"}
    cases = {"nvidia.com/gpu=0": ("a.json", "b.json"), "nvidia.com/gpu=1": ("1:3",),
             "nvidia.com/gpu=7": ("no spec in",), "nvidia.com/gpu=": ("invalid CDI device",)}
    for name, words in cases.items():
        r = root_runner.run(["--device", name, str(rootfs), "true"], env=env)
        assert r.returncode == 125, (name, r.stderr)
        lines = r.stderr.splitlines()
        assert lines[0].startswith("gpusandbox: error: ") and len(lines) <= 2, r.stderr
        assert all(w in lines[0] for w in words), (name, r.stderr)


def test_list_and_check_find_a_stale_spec(cli, shared_tmp):
    sim = make_sim(cli, "--gpus", "2", "--mig", "1:1:0")
    base = os.path.dirname(sim.root)
    try:
        specs = shared_tmp / "specs"
        specs.mkdir()
        env = {"GPUSANDBOX_CDI_SPEC_DIRS": str(specs)}
        assert cdi(cli, "generate", "--driver-root", sim.root, "--output",
                   str(specs)).returncode == 0
        r = cdi(cli, "list", env=env)
        assert r.returncode == 0 and r.stderr == ""
        assert [ln.split("\t")[0] for ln in r.stdout.splitlines()][:2] == [
            "nvidia.com/gpu=0", "nvidia.com/gpu=1"]
        r = cdi(cli, "check", "--driver-root", sim.root, env=env)
        assert r.returncode == 0 and "up to date (6 devices)" in r.stdout, r.stdout + r.stderr
        # A driver upgrade and a MIG change later:
        make_sim(cli, "--gpus", "2", "--driver-version", "560.35.03", root=base)
        r = cdi(cli, "check", "--driver-root", sim.root, env=env)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"libcuda.so.{VERSION} is of driver {VERSION}, the host runs 560.35.03" in r.stdout
        assert "nvidia.com/gpu=1:1: no such device on this host any more" in r.stdout
        assert r.stdout.splitlines()[-1].startswith("hint: regenerate it")
    finally:
        subprocess.run([cli, "sim", "destroy", sim.root], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


PODMAN_LS = ('ls /dev | grep nvidia | sort | tr "\\n" " "; echo; '
             'ls /usr/lib/x86_64-linux-gnu | grep -E "nvidia|cuda" | sort | tr "\\n" " "; echo; '
             'python3 -c "import ctypes; ctypes.CDLL(\'libnvidia-ml.so.1\'); print(\'loads\')"')


def podman_argv(store, rootfs, runtime="runc"):
    # runc: crun 1.8.1 refuses this host's hybrid cgroups; the ulimits: podman's
    # defaults exceed the hard limits here (setrlimit fails in the runtime).
    return ["podman", "--root", f"{store}/root", "--runroot", f"{store}/run",
            "--tmpdir", f"{store}/tmp", "--storage-driver", "vfs", "--events-backend", "none",
            "--cgroup-manager", "cgroupfs", "--runtime", runtime, "run", "--rm",
            "--network", "host", "--log-driver", "none", "--ulimit", "nofile=1024:1024",
            "--ulimit", "nproc=1024:1024", "--device", "nvidia.com/gpu=0",
            "--rootfs", rootfs, "sh", "-c", PODMAN_LS]


@pytest.mark.parametrize("runtime", ["runc", "gpusandbox-oci"])
@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_podman_runs_a_generated_spec(mode, runtime, cli, cdi_sim, rootfs):
    """podman's own CDI support reads the spec; runc, or gpusandbox as the
    OCI runtime (issue 13), runs what podman made of it."""
    if runtime == "gpusandbox-oci":
        runtime = os.path.join(os.path.dirname(cli), "gpusandbox-oci")
    for tool in ("podman", "runc", "unshare"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed (scripts/test installs podman)")
    from .conftest import Runner, _ensure_user
    user = _ensure_user()
    runner = Runner(cli, mode, user)
    base = runner.run(["--driver-root", cdi_sim.root, "--gpus", "0", str(rootfs), "sh", "-c",
                       PODMAN_LS])
    assert base.returncode == 0, base.stderr
    tmp = tempfile.mkdtemp(prefix="gsbx-test-cdipod-", dir="/tmp")
    os.chmod(tmp, 0o755)
    try:
        spec_dir, store, image = f"{tmp}/cdi", f"{tmp}/store", f"{tmp}/rootfs"
        os.mkdir(spec_dir)
        os.mkdir(store)
        # podman writes its mount points into a --rootfs: a copy the user owns.
        subprocess.run(["cp", "-a", str(rootfs), image], check=True)
        inner = [cli, "cdi", "generate", "--driver-root", cdi_sim.root, "--dev-root", "/dev",
                 "--nvidia-cdi-hook-path", "", "--output", "/run/cdi/"]
        pod = podman_argv(store, image, runtime)
        if mode == "rootless":
            subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", image, store],
                           check=True)
            pod = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                   "--clear-groups", "--", "env", "-i", "PATH=/usr/bin:/bin", f"HOME={store}",
                   f"XDG_RUNTIME_DIR={store}/xdg", "sh", "-c",
                   'mkdir -m 700 -p "$XDG_RUNTIME_DIR" && exec "$@"', "sh"] + pod
        script = " ".join(map(_q, inner)) + " >/dev/null && exec " + " ".join(map(_q, pod))
        r = subprocess.run(["unshare", "-m", "--propagation", "slave", "/usr/bin/python3",
                            os.path.join(HERE, "cdi_devns.py"), f"{cdi_sim.root}/dev", spec_dir,
                            "--", "sh", "-c", script],
                           capture_output=True, text=True, timeout=240)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == base.stdout.splitlines()
        nodes, libs, loads = r.stdout.splitlines()
        assert nodes == "nvidia-uvm nvidia-uvm-tools nvidia0 nvidiactl " and loads == "loads"
        # No hook binary on this host: the SONAME and .so names are the
        # library bound again (run makes links), found without a loader cache.
        assert f"libcuda.so.1 libcuda.so.{VERSION}" in libs
    finally:
        try:
            with open(f"{tmp}/store/tmp/pause.pid") as f:
                os.kill(int(f.read().strip()), 9)   # rootless podman's pause process
        except (OSError, ValueError):
            pass
        shutil.rmtree(tmp, ignore_errors=True)


def _q(s):
    import shlex
    return shlex.quote(str(s))
