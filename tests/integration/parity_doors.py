"""The doors of the door parity test (test_door_parity.py): one workload,
launched through each front end gpusandbox has, returning the probe's report
(parity_probe.py) as the workload saw its sandbox.

The workload, the same through every door:
  image   a rootfs from scripts/mkrootfs (python3 for the probe) with the
          probe at /parity/probe.py, a user `parity` (4321:4321, HOME
          /home/parity, also in group `video` 4322) and an empty /data
  GPUs    0 and 1 of the session's simulated host
  bind    a host directory (holding `hello`) at /data, read-write
  env     PARITY=workload and SLURM_JOB_NAME=parity (a job variable: the one
          kind slurm-oci as root passes on)
  user    root mode: 4321:4321; rootless: the caller (run maps it to itself;
          podman is given the caller's ids, which its user namespace maps)
  seccomp each door's default
  net     the host's (run's default for a non-root command; podman --network host)

Each door function takes the World and the mode and returns the
CompletedProcess of the launch; the probe's JSON is its stdout's last line.
"""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from .conftest import CLI, REPO, VENV
from .oci_fixtures import BASE_ENV, RUNC, stop_pause_processes

OCI = str(VENV / "bin" / "gpusandbox-oci")
WRAPPER = str(VENV / "bin" / "gpusandbox-runtime")
PROBE = ["python3", "/parity/probe.py"]
ENV = {"PARITY": "workload", "SLURM_JOB_NAME": "parity"}
USER = (4321, 4321)
PASSWD = "parity:x:4321:4321:parity:/home/parity:/bin/sh\n"
GROUP = "parity:x:4321:\nvideo:x:4322:parity\n"
# podman's default nofile/nproc limits exceed this host's hard limits (runc
# refuses them too; tests/integration/oci_fixtures.py).
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


def make_image(root):
    """The workload's image at `root` (world-readable)."""
    subprocess.run([str(REPO / "scripts" / "mkrootfs"), str(root)], check=True,
                   capture_output=True)
    (root / "parity").mkdir()
    shutil.copy(Path(__file__).with_name("parity_probe.py"), root / "parity" / "probe.py")
    (root / "data").mkdir()
    (root / "home" / "parity").mkdir(parents=True)
    os.chown(root / "home" / "parity", *USER)
    with open(root / "etc" / "passwd", "a") as f:
        f.write(PASSWD)
    with open(root / "etc" / "group", "a") as f:
        f.write(GROUP)


class World:
    """What the doors share: the image in each door's form, the simulated
    host, the bind source, the CDI specs, the registry, the test user."""

    def __init__(self, top, sim, user, registry=None):
        self.top, self.sim, self.user, self.registry = Path(top), sim, user, registry
        self.image = self.top / "image"
        self.bind = self.top / "bind"
        self.cdi = self.top / "cdi"
        self.sqsh = self.top / "image.sqsh"
        self.ref = None
        self._stores = []

    def build(self):
        make_image(self.image)
        self.bind.mkdir()
        (self.bind / "hello").write_text("hello from the bind\n")
        os.chmod(self.bind, 0o777)
        self.cdi.mkdir()
        r = subprocess.run([CLI, "cdi", "generate", "--driver-root", self.sim.root,
                            "--nvidia-cdi-hook-path", "", "--output", str(self.cdi)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        subprocess.run(["mksquashfs", str(self.image), str(self.sqsh), "-noappend", "-quiet",
                        "-no-progress"], check=True, capture_output=True)
        os.chmod(self.sqsh, 0o644)
        if self.registry is not None:
            self.ref = self._push()

    def _push(self):
        from tests.unit import image_fixtures as fx

        from .test_images_local import _rootfs_layer
        # The image's config carries no Env: docker's default PATH then
        # applies, as it does for run DIR (docker's rule for an image
        # without one).
        man, blobs = fx.build_image([_rootfs_layer(str(self.image))])
        lay = fx.write_layout(str(self.top / "layout"), [("v1", man, blobs)])
        self.registry.push(lay, "v1", "parity/img")
        return f"docker://{self.registry.host}/parity/img:v1"

    # -- helpers -------------------------------------------------------------
    def as_mode(self, mode, argv):
        if mode == "rootless":
            return ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                    "--clear-groups", "--"] + argv
        return argv

    def launch(self, mode, argv, env=None, timeout=120):
        env = dict(BASE_ENV, HOME="/", **(env or {}))
        return subprocess.run(self.as_mode(mode, argv), capture_output=True, text=True,
                              timeout=timeout, env=env, cwd="/", stdin=subprocess.DEVNULL)

    def user_args(self, mode):
        """The workload's user as run's options: real root only (rootless
        run maps the caller to itself)."""
        return ["--user", "%d:%d" % USER] if mode == "root" else []

    def podman_user(self, mode):
        return "%d:%d" % (USER if mode == "root" else (self.user.pw_uid, self.user.pw_gid))

    def private_dir(self, mode, name):
        d = Path(tempfile.mkdtemp(prefix=f"gsbx-test-podman-{name}-", dir="/tmp"))
        self._stores.append(d)
        os.chmod(d, 0o755)
        if mode == "rootless":
            os.chown(d, self.user.pw_uid, self.user.pw_gid)
        return d

    def rootfs_copy(self, mode, d):
        """podman writes its mount points into a --rootfs: a copy of the image
        of its own, the user's when rootless."""
        copy = d / "rootfs"
        subprocess.run(["cp", "-a", str(self.image), str(copy)], check=True)
        if mode == "rootless":
            subprocess.run(["chown", "-R", f"{self.user.pw_uid}:{self.user.pw_gid}", str(copy)],
                           check=True)
            os.chown(copy / "home" / "parity", *USER)
        return copy

    def shim(self, d, target, name, runtime=None):
        """An executable giving `target` the simulated host, as an admin's
        oci.conf would (podman passes the runtime no environment)."""
        p = d / name
        rt = f"export GPUSANDBOX_OCI_RUNTIME={runtime}\n" if runtime else ""
        p.write_text(f"#!/bin/sh\nexport GPUSANDBOX_DRIVER_ROOT={self.sim.root}\n{rt}"
                     f"exec {target} \"$@\"\n")
        os.chmod(p, 0o755)
        return str(p)

    def podman(self, mode, d, args, timeout=180):
        store = d / "store"
        store.mkdir(exist_ok=True)
        if mode == "rootless":
            os.chown(store, self.user.pw_uid, self.user.pw_gid)
        cmd = ["podman", "--root", f"{store}/root", "--runroot", f"{store}/run", "--tmpdir",
               f"{store}/tmp", "--storage-driver", "vfs", "--events-backend", "none",
               "--cgroup-manager", "cgroupfs"] + list(args)
        env = dict(BASE_ENV, HOME=str(store))
        if mode == "rootless":
            env["XDG_RUNTIME_DIR"] = str(store / "xdg")
            if not (store / "xdg").exists():
                (store / "xdg").mkdir(mode=0o700)
                os.chown(store / "xdg", self.user.pw_uid, self.user.pw_gid)
        return subprocess.run(self.as_mode(mode, cmd), capture_output=True, text=True,
                              timeout=timeout, env=env, cwd="/", stdin=subprocess.DEVNULL)

    def podman_run_args(self, mode, rootfs, gpu_env=True):
        args = ["--network", "host", "--log-driver", "none", *ULIMITS,
                "-v", f"{self.bind}:/data", "--user", self.podman_user(mode)]
        for k, v in ENV.items():
            args += ["-e", f"{k}={v}"]
        if gpu_env:
            args += ["-e", "NVIDIA_VISIBLE_DEVICES=0,1"]
        return args + ["--rootfs", str(rootfs)]

    def cleanup(self):
        for d in self._stores:
            stop_pause_processes(d)
            subprocess.run(["umount", "-R", "-l", str(d)], capture_output=True)
            shutil.rmtree(d, ignore_errors=True)
        self._stores.clear()


# -- the doors ---------------------------------------------------------------

def _run(w, mode, image, extra=(), env=None):
    argv = [CLI, "run", "--driver-root", w.sim.root, *extra, "-v", f"{w.bind}:/data",
            *w.user_args(mode)]
    for k, v in ENV.items():
        argv += ["-e", f"{k}={v}"]
    return w.launch(mode, argv + [str(image), "--", *PROBE], env=env)


def run_dir(w, mode):
    return _run(w, mode, w.image, ["--gpus", "0,1"])


def run_docker(w, mode):
    store = w.private_dir(mode, "store")
    return _run(w, mode, w.ref, ["--gpus", "0,1"],
                env={"GPUSANDBOX_STORE": str(store / "store")})


def run_sqsh(w, mode):
    return _run(w, mode, w.sqsh, ["--gpus", "0,1"])


def run_cdi(w, mode):
    return _run(w, mode, w.image, ["--device", "nvidia.com/gpu=0",
                                   "--device", "nvidia.com/gpu=1"],
                env={"GPUSANDBOX_CDI_SPEC_DIRS": str(w.cdi)})


def podman_oci(w, mode):
    d = w.private_dir(mode, "oci")
    rt = w.shim(d, OCI, "gpusandbox-oci")
    return w.podman(mode, d, ["--runtime", rt, "run", "--rm",
                              *w.podman_run_args(mode, w.rootfs_copy(mode, d)), *PROBE])


def podman_wrapper(w, mode):
    d = w.private_dir(mode, "wrap")
    rt = w.shim(d, WRAPPER, "gpusandbox-runtime")
    return w.podman(mode, d, ["--runtime", rt, "run", "--rm",
                              *w.podman_run_args(mode, w.rootfs_copy(mode, d)), *PROBE])


def _hooks(w, d, *opts):
    hooks = d / "hooks.d"
    r = subprocess.run([CLI, "hook", "install", "--dir", str(hooks), *opts,
                        "--driver-root", w.sim.root], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return hooks


def podman_filter(w, mode):
    d = w.private_dir(mode, "filter")
    hooks = _hooks(w, d, "--stage", "precreate")
    return w.podman(mode, d, ["--runtime", RUNC, "--hooks-dir", str(hooks), "run", "--rm",
                              *w.podman_run_args(mode, w.rootfs_copy(mode, d)), *PROBE])


def podman_hook(w, mode):
    d = w.private_dir(mode, "hook")
    hooks = _hooks(w, d)
    return w.podman(mode, d, ["--runtime", RUNC, "--hooks-dir", str(hooks), "run", "--rm",
                              *w.podman_run_args(mode, w.rootfs_copy(mode, d)), *PROBE])


def oci_exec(w, mode):
    """`gpusandbox-oci exec` (podman exec) into a container gpusandbox-oci
    created for the same workload, its command a sleep."""
    d = w.private_dir(mode, "exec")
    rt = w.shim(d, OCI, "gpusandbox-oci")
    name = f"parity-{os.getpid()}"
    r = w.podman(mode, d, ["--runtime", rt, "run", "-d", "--name", name,
                           *w.podman_run_args(mode, w.rootfs_copy(mode, d)), "sleep", "300"])
    if r.returncode:
        return r
    try:
        return w.podman(mode, d, ["--runtime", rt, "exec", name, *PROBE])
    finally:
        w.podman(mode, d, ["--runtime", rt, "rm", "-f", "-t", "0", name])


def slurm_oci(w, mode):
    """`gpusandbox slurm-oci run` on a step bundle as slurmstepd writes it for
    --container=DIR (docs/slurm-testbed.md): the bundle's config.json with
    root.path set to the image, process.args the task's command and the
    task's environment appended to process.env; RunTimeRun's options are the
    workload's run options.  Root: a site's wrapper; rootless: the job's user,
    as Slurm runs it by default."""
    d = w.private_dir(mode, "slurm")
    step = d / "step"
    step.mkdir()
    env = ["PATH=/usr/local/bin:/usr/bin:/bin"] + [f"{k}={v}" for k, v in ENV.items()]
    (step / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.0", "root": {"path": str(w.image)},
        "process": {"args": PROBE, "env": env, "cwd": "/"}}))
    if mode == "rootless":
        subprocess.run(["chown", "-R", f"{w.user.pw_uid}:{w.user.pw_gid}", str(step)],
                       check=True)
    argv = [CLI, "slurm-oci", "run", "--gpus", "0,1", "--driver-root", w.sim.root,
            "-v", f"{w.bind}:/data", *w.user_args(mode), str(step)]
    return w.launch(mode, argv)


# door name -> (launcher, the modes it runs in here, why a mode is left out)
DOORS = {
    "run-dir": (run_dir, ("root", "rootless"), None),
    "run-docker": (run_docker, ("root", "rootless"), None),
    "run-sqsh": (run_sqsh, ("root", "rootless"), None),
    "run-cdi": (run_cdi, ("root", "rootless"), None),
    "podman-oci": (podman_oci, ("root", "rootless"), None),
    "podman-wrapper": (podman_wrapper, ("root",),
                       "the wrapper execs runc, which cannot run rootless on this hybrid cgroup "
                       "host (test_oci_wrapper.py runs it over crun in a cgroup2 view instead)"),
    "podman-filter": (podman_filter, ("root", "rootless"), None),
    "podman-hook": (podman_hook, ("root", "rootless"), None),
    "oci-exec": (oci_exec, ("root", "rootless"), None),
    "slurm-oci": (slurm_oci, ("root", "rootless"), None),
}


def report_of(proc):
    """The probe's report from a launch's output."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout[-2000:],
                                            proc.stderr[-3000:])
    return json.loads(lines[-1])
