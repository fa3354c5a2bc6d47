"""containerd 1.6 and docker 20.10 (Debian 12's packages) running containers
through gpusandbox: the runc shim (io.containerd.runc.v2) calling
gpusandbox-oci, and the wrapper gpusandbox-runtime over runc, registered by
`gpusandbox runtime configure`, on the simulated GPU host, as root.

The daemons are the test's own and never touch the host: containerd runs in
a mount and network namespace of its own (a tmpfs over /run for the shims'
sockets, one over /etc/docker for dockerd's key file), with its root, state
and socket under the test's directory; dockerd joins those namespaces with
its own data root, exec root and socket, no bridge and no iptables.  Their
cgroups go under a parent named for this test process, removed at the end;
their processes are stopped by pid.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest

from tests.unit import image_fixtures as fx

from .conftest import REPO, VENV, pids_with, wait_for

OCI = str(VENV / "bin" / "gpusandbox-oci")
WRAPPER = str(VENV / "bin" / "gpusandbox-runtime")
# Debian's own client, never another docker earlier on PATH.
DOCKER = "/usr/bin/docker"
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Every cgroup the engines make (runc's, through the wrapper) is under this.
CGROUP = f"gsbx-test-engines-{os.getpid()}"
# The engines' default places on the host, which the private daemons must
# leave as they were.
HOST_PATHS = ("/run/containerd", "/run/docker", "/run/docker.sock", "/etc/docker/key.json",
              "/var/lib/containerd", "/var/lib/docker", "/opt/containerd", "/etc/cni")
# Debian 12's /etc/containerd/config.toml as the package ships it: what an
# admin runs `gpusandbox runtime configure --runtime containerd` on.
DEBIAN_CONFIG = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""
# GPU 0 and 1 as the container sees them, the driver library (in the
# image's library directory, or in /run/gpusandbox/lib when the root is
# written through, as containerd's and docker's configs ask), and pid 1's
# name (the workload itself, under gpusandbox-oci as under runc).
SHOW = ("for n in 0 1; do if [ -e /dev/nvidia$n ]; then cat /dev/nvidia$n 2>&1 | "
        "sed 's/^/open: /'; else echo absent /dev/nvidia$n; fi; done; "
        "for f in /usr/lib/x86_64-linux-gnu/libcuda.so.1 /run/gpusandbox/lib/libcuda.so.1; do "
        "[ -e $f ] && echo lib: $f; done; "
        "echo \"init: $(cat /proc/1/comm)\"")

pytestmark = pytest.mark.skipif(
    not (shutil.which("containerd") and shutil.which("ctr")),
    reason="containerd is not installed (scripts/test installs it)")


def check_gpu(out, gpu, init):
    """Only GPU `gpu` is there and reachable (ENXIO: past the device
    filter, no driver behind the simulated node), with the driver's library."""
    other = 1 - gpu
    assert f"open: cat: /dev/nvidia{gpu}: No such device or address" in out, out
    assert f"absent /dev/nvidia{other}" in out, out
    assert "lib: " in out and "/libcuda.so.1\n" in out, out
    assert f"init: {init}\n" in out, out


def _images(d):
    """The test image as an oci-archive (ctr import) and a docker-archive
    (docker load): a small rootfs with a shell and coreutils."""
    root = d / "rootfs"
    subprocess.run([str(REPO / "scripts" / "mkrootfs"), str(root), "--no-python"], check=True,
                   capture_output=True)
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name in sorted(os.listdir(root)):
            tf.add(root / name, arcname=name)
    base = buf.getvalue()
    cfg = dict(Env=[f"PATH={ENV['PATH']}"], Cmd=["/bin/sh"])
    man, blobs = fx.build_image([base], gzip_layers=False, **cfg)
    fx.tar_dir(fx.write_layout(str(d / "layout"), [("1", man, blobs)]), str(d / "oci.tar"))
    fx.write_docker_archive(str(d / "docker.tar"), [(["gsbx/engines:1"], [base], cfg)])
    shutil.rmtree(root)
    return d / "oci.tar", d / "docker.tar"


def _stop(proc, timeout=20):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _remove_cgroups():
    """Our cgroup parent in every hierarchy, deepest first; returns what is
    still there."""
    left = []
    for top in [t for name in (CGROUP, CGROUP + "-docker")
                for t in Path("/sys/fs/cgroup").glob(f"*/{name}")]:
        for dirpath, _, _ in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                left.append(dirpath)
    return left


class Containerd:
    def __init__(self, d, proc, sock, conf):
        self.d, self.proc, self.sock, self.conf = d, proc, str(sock), conf

    def ctr(self, *args, timeout=60, check=True):
        r = subprocess.run(["ctr", "-a", self.sock] + list(args), capture_output=True,
                           text=True, timeout=timeout, env=ENV, stdin=subprocess.DEVNULL)
        if check:
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r

    def run_args(self, binary, cid):
        """`ctr run` options for the runc shim with `binary` as its runtime."""
        return ["--fifo-dir", str(self.d / "fifo"), "--runtime", "io.containerd.runc.v2",
                "--runc-binary", binary, "--runc-root", str(self.d / "runtime"),
                "--cgroup", f"/{CGROUP}/{cid}"]


@pytest.fixture(scope="module")
def containerd(cli, sim_host):
    if os.geteuid() != 0:
        pytest.skip("the engines run as root")
    d = Path(tempfile.mkdtemp(prefix="gsbx-test-engines-", dir="/tmp"))
    os.chmod(d, 0o755)
    proc = None
    host_paths = {p: os.path.lexists(p) for p in HOST_PATHS}
    try:
        oci_tar, docker_tar = _images(d)
        (d / "fifo").mkdir()
        sock = d / "containerd.sock"
        conf = d / "containerd.toml"
        # The packaged file plus what keeps this instance to the test's
        # directory (and off plugins that would reach /opt or need modules).
        private = (f'root = "{d}/root"\nstate = "{d}/state"\n'
                   'disabled_plugins = ["io.containerd.internal.v1.opt", '
                   '"io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", '
                   '"io.containerd.snapshotter.v1.devmapper", '
                   '"io.containerd.snapshotter.v1.aufs", '
                   '"io.containerd.tracing.processor.v1.otlp"]\n\n'
                   f'[grpc]\n  address = "{sock}"\n\n[ttrpc]\n  address = "{sock}.ttrpc"\n')
        # The CRI plugin makes its CNI config directory when missing: the
        # test's own.
        conf.write_text(DEBIAN_CONFIG.replace("version = 2\n", "version = 2\n" + private, 1)
                        .replace('"/etc/cni/net.d"', f'"{d}/cni"'))
        for name, path in (("gpusandbox", OCI), ("gpusandbox-runtime", WRAPPER)):
            r = subprocess.run([cli, "runtime", "configure", "--runtime", "containerd",
                                "--config", str(conf), "--name", name, "--path", path],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        # The shims' socket directory (/run/containerd/s) and dockerd's key
        # file (/etc/docker/key.json) are fixed paths: private tmpfs there.
        script = ("mount -t tmpfs -o mode=0755 gsbx-test /run && "
                  "{ [ ! -d /etc/docker ] || mount -t tmpfs -o mode=0755 gsbx-test /etc/docker; } "
                  "&& exec containerd --config \"$1\"")
        with open(d / "containerd.log", "w") as log:
            # The runtimes' driver root: the shim hands containerd's
            # environment to the runtime it calls.
            proc = subprocess.Popen(["unshare", "-m", "-n", "--propagation", "private",
                                     "sh", "-c", script, "sh", str(conf)], cwd=d,
                                    env=dict(ENV, GPUSANDBOX_DRIVER_ROOT=sim_host.root),
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        ctd = Containerd(d, proc, sock, conf)
        up = wait_for(lambda: proc.poll() is not None or
                      ctd.ctr("version", check=False).returncode == 0, timeout=30)
        assert up and proc.poll() is None, (d / "containerd.log").read_text()[-3000:]
        ctd.ctr("images", "import", "--base-name", "docker.io/gsbx/engines", str(oci_tar))
        ctd.docker_tar = docker_tar
        # The configuration containerd loaded from the file (defaults merged).
        r = subprocess.run(["containerd", "--config", str(conf), "config", "dump"],
                           capture_output=True, text=True, timeout=60, env=ENV)
        assert r.returncode == 0, r.stderr
        ctd.runtimes = tomllib.loads(r.stdout)["plugins"]["io.containerd.grpc.v1.cri"][
            "containerd"]["runtimes"]
        yield ctd
    finally:
        if proc is not None:
            _teardown(d, proc)
        with open("/proc/self/mountinfo") as f:
            leaked = str(d) in f.read()
        shutil.rmtree(d, ignore_errors=True)
    assert not leaked, "a mount of the engines reached the host's namespace"
    assert not pids_with(str(d)), "a process of the engines was left behind"
    assert {p: os.path.lexists(p) for p in HOST_PATHS} == host_paths, \
        "the engines wrote to the host's default paths"
    assert not _remove_cgroups(), "a cgroup of the engines was left behind"


def _teardown(d, proc):
    sock = str(d / "containerd.sock")
    if proc.poll() is None:
        ctr = ["ctr", "-a", sock]
        for ns in subprocess.run(ctr + ["namespaces", "ls", "-q"], capture_output=True,
                                 text=True, timeout=30).stdout.split():
            for cid in subprocess.run(ctr + ["-n", ns, "containers", "ls", "-q"],
                                      capture_output=True, text=True, timeout=30).stdout.split():
                subprocess.run(ctr + ["-n", ns, "tasks", "rm", "-f", cid], capture_output=True,
                               timeout=30)
                subprocess.run(ctr + ["-n", ns, "containers", "rm", cid], capture_output=True,
                               timeout=30)
    _stop(proc)
    # Shims (their command line names our socket) and containers' processes
    # (a created container's init keeps create's command line, which names our dir)
    # that outlived the clean stop: ours by their marker, killed by pid.
    for pid in pids_with(str(d)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not pids_with(str(d)), timeout=10)
    _remove_cgroups()


def test_containerd_loads_the_configured_runtimes(containerd):
    """The file `runtime configure` wrote over Debian's packaged config is
    containerd's: its CRI plugin loads (it refuses a runtimes table without
    the default runtime) and holds both runtimes with their BinaryName."""
    plugins = containerd.ctr("plugins", "ls").stdout
    cri = [ln.split() for ln in plugins.splitlines() if ln.split()[:2] == ["io.containerd.grpc.v1",
                                                                          "cri"]]
    assert cri and cri[0][-1] == "ok", plugins
    rts = containerd.runtimes
    assert rts["gpusandbox"]["runtime_type"] == "io.containerd.runc.v2"
    assert rts["gpusandbox"]["options"]["BinaryName"] == OCI
    assert rts["gpusandbox-runtime"]["options"]["BinaryName"] == WRAPPER


def _binary(containerd, name):
    """The BinaryName containerd loaded from the configured file for the
    runtime `name`: what the CRI plugin hands the runc shim."""
    return containerd.runtimes[name]["options"]["BinaryName"]


def test_ctr_run_through_gpusandbox_oci(containerd):
    """ctr run --rm: the shim runs gpusandbox-oci (create, start, state,
    delete); GPU 1 from NVIDIA_VISIBLE_DEVICES with its libraries on the
    written-through root; the exit code comes back; nothing of the
    container is left."""
    cid = f"gsbx-{os.getpid()}-oci"
    r = containerd.ctr("run", "--rm", *containerd.run_args(_binary(containerd, "gpusandbox"), cid),
                       "--env", "NVIDIA_VISIBLE_DEVICES=1", "docker.io/gsbx/engines:1", cid,
                       "sh", "-c", SHOW + "; grep ' /run ' /proc/self/mountinfo; exit 7",
                       check=False)
    assert r.returncode == 7, (r.stdout, r.stderr)
    check_gpu(r.stdout, 1, "sh")
    # containerd's default spec mounts a tmpfs at /run: it is the init's own
    # (with the spec's size), not one over the injected driver files.
    run = [ln for ln in r.stdout.splitlines() if " /run " in ln]
    assert len(run) == 1 and "size=65536k" in run[0], r.stdout
    assert cid not in containerd.ctr("containers", "ls", "-q").stdout.split()
    assert not (containerd.d / "runtime" / "default" / cid).exists()
    assert wait_for(lambda: not pids_with(cid)), "the shim or the container is still there"


def test_ctr_task_lifecycle(containerd):
    """ctr run -d, task exec (the shim's `exec --process --detach
    --pid-file`), pause and resume, kill, delete: the exec's and the
    workload's exit codes come back, the state and the cgroup leaf go."""
    cid = f"gsbx-{os.getpid()}-life"
    ctr = containerd.ctr
    ctr("run", "-d", *containerd.run_args(_binary(containerd, "gpusandbox"), cid),
        "docker.io/gsbx/engines:1", cid, "sh", "-c",
        'trap "exit 42" TERM; while :; do sleep 0.1; done')
    try:
        st = json.loads((containerd.d / "runtime" / "default" / cid / "state.json").read_text())
        leaf = st["cgroup"]
        assert os.path.isdir(leaf), st
        r = ctr("tasks", "exec", "--fifo-dir", str(containerd.d / "fifo"), "--exec-id", "e1",
                cid, "sh", "-c", "echo in-exec; cat /proc/1/comm; exit 6", check=False)
        assert (r.returncode, r.stdout) == (6, "in-exec\nsh\n"), r.stderr
        ctr("tasks", "pause", cid)
        assert " PAUSED" in ctr("tasks", "ls").stdout
        ctr("tasks", "resume", cid)
        assert " RUNNING" in ctr("tasks", "ls").stdout
        ctr("tasks", "kill", "-s", "TERM", cid)
        assert wait_for(lambda: " STOPPED" in ctr("tasks", "ls").stdout)
        r = ctr("tasks", "rm", cid)
        assert "exit code 42" in r.stderr, r.stderr
    finally:
        ctr("tasks", "rm", "-f", cid, check=False)
        ctr("containers", "rm", cid, check=False)
    assert not (containerd.d / "runtime" / "default" / cid).exists()
    assert not os.path.exists(leaf), "the container's cgroup leaf is still there"
    assert wait_for(lambda: not pids_with(cid))


def test_ctr_run_through_the_wrapper(containerd):
    """The wrapper as the shim's BinaryName: runc runs the container (the
    workload is pid 1) with GPU 0 that the wrapper wrote into config.json."""
    cid = f"gsbx-{os.getpid()}-wrap"
    r = containerd.ctr("run", "--rm",
                       *containerd.run_args(_binary(containerd, "gpusandbox-runtime"), cid),
                       "--env", "NVIDIA_VISIBLE_DEVICES=0", "docker.io/gsbx/engines:1", cid,
                       "sh", "-c", SHOW + "; exit 3", check=False)
    assert r.returncode == 3, (r.stdout, r.stderr)
    check_gpu(r.stdout, 0, "sh")
    assert wait_for(lambda: not pids_with(cid))


class Docker:
    def __init__(self, d):
        self.d = d
        self.env = dict(ENV, DOCKER_HOST=f"unix://{d}/docker.sock", HOME=str(d))

    def __call__(self, *args, timeout=60, check=True, input=None):
        r = subprocess.run([DOCKER] + list(args), capture_output=True, text=True,
                           timeout=timeout, env=self.env, cwd="/", input=input,
                           stdin=subprocess.DEVNULL if input is None else None)
        if check:
            assert r.returncode == 0, (args, r.stdout, r.stderr)
        return r


@pytest.fixture(scope="module")
def docker(cli, containerd):
    if not (shutil.which("dockerd") and os.path.exists(DOCKER)):
        pytest.skip("docker.io is not installed (scripts/test installs it)")
    d = containerd.d / "docker"
    d.mkdir()
    conf = d / "daemon.json"
    for args in (["--name", "gpusandbox", "--path", OCI], ["--name", "gpusandbox-runtime"]):
        # The second: the wrapper found next to the CLI, under its own name.
        r = subprocess.run([cli, "runtime", "configure", "--runtime", "docker", "--config",
                            str(conf)] + args, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    with open(d / "dockerd.log", "w") as log:
        # In containerd's namespaces: dockerd's overlay mounts must be the
        # ones the shim sees, and its networking is that private namespace.
        proc = subprocess.Popen(
            ["nsenter", "-t", str(containerd.proc.pid), "-m", "-n", "dockerd",
             "--config-file", str(conf), "--data-root", str(d / "data"),
             "--exec-root", str(d / "exec"), "-H", f"unix://{d}/docker.sock",
             "--pidfile", str(d / "dockerd.pid"), "--containerd", containerd.sock,
             "--bridge=none", "--iptables=false", "--ip-masq=false", "--ip6tables=false",
             "--userland-proxy=false", "--cgroup-parent", f"/{CGROUP}-docker"],
            cwd=d, env=ENV, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        dk = Docker(d)
        up = wait_for(lambda: proc.poll() is not None or
                      dk("version", check=False).returncode == 0, timeout=60)
        assert up and proc.poll() is None, (d / "dockerd.log").read_text()[-3000:]
        dk("load", "-i", str(containerd.docker_tar), timeout=120)
        yield dk
    finally:
        _stop(proc)


def test_docker_run(docker):
    """docker run --rm with the runtimes daemon.json registers: GPU 1
    through gpusandbox-oci and GPU 0 through the wrapper over runc, exit
    codes; a terminal (-t) through the console socket; stdin (-i)."""
    rts = json.loads(docker("info", "--format", "{{json .Runtimes}}").stdout)
    assert rts["gpusandbox"]["path"] == OCI and rts["gpusandbox-runtime"]["path"] == WRAPPER
    r = docker("run", "--rm", "--runtime", "gpusandbox", "--network", "none", "-e",
               "NVIDIA_VISIBLE_DEVICES=1", "gsbx/engines:1", "sh", "-c", SHOW + "; exit 5",
               check=False)
    assert r.returncode == 5, (r.stdout, r.stderr)
    check_gpu(r.stdout, 1, "sh")
    r = docker("run", "--rm", "--runtime", "gpusandbox-runtime", "--network", "none", "-e",
               "NVIDIA_VISIBLE_DEVICES=0", "gsbx/engines:1", "sh", "-c", SHOW, check=False)
    assert r.returncode == 0, (r.stdout, r.stderr)
    check_gpu(r.stdout, 0, "sh")
    r = docker("run", "--rm", "-t", "--runtime", "gpusandbox", "--network", "none",
               "gsbx/engines:1", "sh", "-c", "tty; exit 9", check=False)
    assert (r.returncode, r.stdout.strip()) == (9, "/dev/pts/0"), r.stderr
    r = docker("run", "--rm", "-i", "--runtime", "gpusandbox", "--network", "none",
               "gsbx/engines:1", "sh", "-c", "tr a-z A-Z; exit 4", input="piped in\n",
               check=False)
    assert (r.returncode, r.stdout) == (4, "PIPED IN\n"), r.stderr
    assert docker("ps", "-aq").stdout == ""


def test_docker_lifecycle(docker):
    """run -d, exec (exit code, env, -t), pause and unpause, stop (the
    workload's own exit status), logs, rm: the runtime's state and the
    container's cgroup leaf are gone after rm."""
    name = f"gsbx-{os.getpid()}-life"
    cid = docker("run", "-d", "--name", name, "--runtime", "gpusandbox", "--network", "none",
                 "gsbx/engines:1", "sh", "-c",
                 'trap "exit 42" TERM; echo started; while :; do sleep 0.1; done').stdout.strip()
    try:
        states = list((docker.d / "exec").glob(f"**/{cid}/state.json"))
        assert len(states) == 1, list((docker.d / "exec").rglob("*"))
        leaf = json.loads(states[0].read_text())["cgroup"]
        assert os.path.isdir(leaf), leaf
        r = docker("exec", "-e", "FOO=bar", cid, "sh", "-c", "echo $FOO; cat /proc/1/comm; exit 6",
                   check=False)
        assert (r.returncode, r.stdout) == (6, "bar\nsh\n"), r.stderr
        r = docker("exec", "-t", cid, "tty")
        assert r.stdout.startswith("/dev/pts/"), r.stdout
        docker("pause", cid)
        assert docker("inspect", "-f", "{{.State.Status}}", cid).stdout == "paused\n"
        docker("unpause", cid)
        assert docker("inspect", "-f", "{{.State.Status}}", cid).stdout == "running\n"
        docker("stop", "-t", "20", cid)
        assert docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout == "42\n"
        assert docker("logs", cid).stdout == "started\n"
        docker("rm", cid)
    finally:
        docker("rm", "-f", cid, check=False)
    assert not states[0].parent.exists()
    assert not os.path.exists(leaf), "the container's cgroup leaf is still there"
    assert wait_for(lambda: not pids_with(cid))
