"""Shared pieces of the OCI hook / filter / wrapper tests: a rootfs per test,
runc bundles, a podman store per mode, the runtime-spec schema."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import REPO, VENV

SCHEMA_DIR = Path("/usr/share/gocode/src/github.com/opencontainers/runtime-spec/schema")
WRAPPER = str(VENV / "bin" / "gpusandbox-runtime")
PYTHON = str(VENV / "bin" / "python3")
RUNC = shutil.which("runc") or "/usr/sbin/runc"
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"}
SHOW = ("for n in /dev/nvidia0 /dev/nvidia1; do "
        "if [ -e $n ]; then cat $n 2>&1 | sed 's/^/open: /'; else echo absent $n; fi; done; "
        "ls /usr/lib/x86_64-linux-gnu/libcuda.so.1 /usr/bin/nvidia-smi 2>&1 | sed 's/^/ls: /'")


def validator():
    """A jsonschema validator for config.json from Debian's runtime-spec schema."""
    jsonschema = pytest.importorskip("jsonschema")
    if not (SCHEMA_DIR / "config-schema.json").exists():
        pytest.skip("golang-github-opencontainers-specs-dev is not installed (scripts/test)")
    schemas = {}
    for p in SCHEMA_DIR.glob("*.json"):
        schemas[p.name] = json.loads(p.read_text())
    base = f"file://{SCHEMA_DIR}/"
    top = dict(schemas["config-schema.json"], id=base + "config-schema.json")
    try:
        from referencing import Registry, Resource
        from referencing.jsonschema import DRAFT4
    except ImportError:   # jsonschema < 4.18
        resolver = jsonschema.RefResolver(base + "config-schema.json", top,
                                          store={base + n: s for n, s in schemas.items()})
        return jsonschema.Draft4Validator(top, resolver=resolver)
    reg = Registry().with_resources((base + n, Resource(contents=s, specification=DRAFT4))
                                    for n, s in schemas.items())
    return jsonschema.Draft4Validator(top, registry=reg)


def assert_schema_valid(cfg):
    errors = sorted(validator().iter_errors(cfg), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:5])


def make_rootfs(parent, owner=None):
    root = Path(parent) / "rootfs"
    subprocess.run([str(REPO / "scripts" / "mkrootfs"), str(root), "--no-python"],
                   check=True, capture_output=True)
    if owner is not None:
        subprocess.run(["chown", "-R", f"{owner.pw_uid}:{owner.pw_gid}", str(parent)], check=True)
    return root


def stop_pause_processes(d):
    """Stop the pause process rootless podman left for each store under d:
    the pid it recorded, only when that process is podman's and its HOME is
    that store (never one of another test's)."""
    for pidfile in Path(d).glob("**/tmp/pause.pid"):
        store = pidfile.parent.parent
        try:
            pid = int(pidfile.read_text().strip())
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except (OSError, ValueError):
            continue
        if comm.startswith("podman") and f"HOME={store}".encode() in env:
            try:
                os.kill(pid, 15)
            except ProcessLookupError:
                pass


_STORES = []


@pytest.fixture
def oci_dir():
    d = Path(tempfile.mkdtemp(prefix="gsbx-test-wrap-"))
    os.chmod(d, 0o755)
    yield d
    for s in [d] + _STORES:
        stop_pause_processes(s)
        subprocess.run(["umount", "-R", "-l", str(s)], capture_output=True)
        shutil.rmtree(s, ignore_errors=True)
    del _STORES[:]


def runc_bundle(d, args, env=(), hooks=None, extra=None):
    """A runc bundle at d (rootfs made there) running `args`, as root."""
    make_rootfs(d)
    subprocess.run([RUNC, "spec"], cwd=d, check=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["process"]["terminal"] = False
    cfg["process"]["args"] = list(args)
    cfg["process"]["env"] += list(env)
    cfg["root"]["readonly"] = False
    if hooks is not None:
        cfg["hooks"] = hooks
    cfg.update(extra or {})
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    return cfg


def runc_run(d, cid, timeout=60):
    state = d / "runc-state"
    try:
        return subprocess.run([RUNC, "--root", str(state), "run", "--bundle", str(d), cid],
                              capture_output=True, text=True, timeout=timeout, env=BASE_ENV,
                              stdin=subprocess.DEVNULL)
    finally:
        subprocess.run([RUNC, "--root", str(state), "delete", "-f", cid], capture_output=True)


# crun refuses hybrid cgroup layouts: it runs in a private mount namespace
# whose /sys/fs/cgroup is a cgroup2 mount; the host's mounts stay as they are.
CGROUP2_VIEW = ["unshare", "-m", "sh", "-c", "mount --make-rprivate / && "
                "mount -t cgroup2 none /sys/fs/cgroup && exec \"$@\"", "sh"]
CRUN = shutil.which("crun") or "/usr/bin/crun"


def shim(d, sim_root, target=WRAPPER, runtime=None, name="gpusandbox-runtime-sim", env=None):
    """An executable that gives `target` the simulated host, as an admin's
    /etc/gpusandbox/oci.conf would (podman passes the runtime no env)."""
    p = Path(d) / name
    p.parent.mkdir(exist_ok=True)
    rt = f"export GPUSANDBOX_OCI_RUNTIME={runtime}\n" if runtime else ""
    rt += "".join(f"export {k}={v}\n" for k, v in (env or {}).items())
    p.write_text(f"#!/bin/sh\nexport GPUSANDBOX_DRIVER_ROOT={sim_root}\n{rt}"
                 f"exec {target} \"$@\"\n")
    os.chmod(p, 0o755)
    return str(p)


class Podman:
    """podman with a private store, as root or as the test user."""

    def __init__(self, d, mode, user, view=False):
        self.d, self.mode, self.user, self.view = Path(d), mode, user, view
        # Under /tmp/gsbx-test-podman-*: the mounts podman makes there are
        # not the host's (conftest.host_mounts leaves them out for tests
        # running beside); the runroot path must stay under 50 characters.
        self.store = Path(tempfile.mkdtemp(prefix="gsbx-test-podman-", dir="/tmp"))
        _STORES.append(self.store)
        if mode == "rootless":
            os.chown(self.store, user.pw_uid, user.pw_gid)

    def argv(self, args):
        s = self.store
        cmd = ["podman", "--root", f"{s}/root", "--runroot", f"{s}/run", "--tmpdir", f"{s}/tmp",
               "--storage-driver", "vfs", "--events-backend", "none",
               "--cgroup-manager", "cgroupfs"] + list(args)
        if self.mode == "rootless":
            cmd = ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                   "--clear-groups", "--"] + cmd
        return (CGROUP2_VIEW if self.view else []) + cmd

    def env(self):
        env = dict(BASE_ENV, HOME=str(self.store))
        if self.mode == "rootless":
            env["XDG_RUNTIME_DIR"] = str(self.store / "xdg")
        return env

    def run_rootfs(self, rootfs, cmd, pre=(), env=(), timeout=120, cgroups=True,
                   annotations=()):
        args = list(pre) + ["run", "--rm", "--network", "host", "--ulimit", "nofile=1024:1024",
                            "--ulimit", "nproc=1024:1024"]
        for a in annotations:
            args += ["--annotation", a]
        if not cgroups:
            args += ["--cgroups", "disabled"]
        for e in env:
            args += ["-e", e]
        args += ["--rootfs", str(rootfs)] + list(cmd)
        return subprocess.run(self.argv(args), capture_output=True, text=True, timeout=timeout,
                              env=self.env(), cwd="/", stdin=subprocess.DEVNULL)
