"""The wrapper's and the filter's memo of GPU edits (gpusandbox/oci/memo.py),
root and rootless, on a simulated host of the test's own that it changes
under the memo: a create after a change never gets the old edits, and a
memoised create loads none of the heavy modules."""
import functools
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from .conftest import CLI, MODES
from .oci_fixtures import PYTHON, make_rootfs

@functools.lru_cache(maxsize=None)
def _site():
    """The installed package's directory, asked of the test venv once it exists
    (the session's `cli` fixture installs it, after collection)."""
    return subprocess.run([PYTHON, "-I", "-c", "import gpusandbox, os; print(os.path.dirname("
                           "os.path.dirname(gpusandbox.__file__)))"],
                          capture_output=True, text=True, check=True).stdout.strip()


# What a memoised create must not import: discovery and injection (the
# memo's point), and the stdlib modules whose imports cost more than the
# whole memoised edit.
HEAVY = ("gpusandbox.gpu.discover", "gpusandbox.gpu.inject", "gpusandbox.gpu.select",
         "gpusandbox.gpu.ldcache", "gpusandbox.linux.sys", "ctypes", "json", "re", "enum",
         "hashlib", "tempfile", "shutil", "argparse", "runpy", "site")
# The filter as hooks.d runs it (hook install's entry_args), reporting the
# modules it loaded.
REPORT = ("import sys,atexit;sys.path.insert(0,sys.argv.pop(1));"
          "atexit.register(lambda: sys.stderr.write('MODULES ' + ' '.join(sorted(sys.modules))"
          " + '\\n'));")
FILTER = REPORT + "from gpusandbox.oci.filter import cli;cli()"
# The wrapper as bin/gpusandbox-runtime runs it; its runtime is missing, so
# it returns (reporting) instead of exec'ing one, after the edit.
WRAPPER = REPORT + "from gpusandbox.oci.wrapper import main;sys.exit(main())"


@pytest.fixture(params=MODES)
def private_sim(request, cli, test_user):
    base = tempfile.mkdtemp(prefix="gsbx-test-memo-", dir="/tmp")
    os.chmod(base, 0o755)
    root = os.path.join(base, "host")
    owner = test_user if request.param == "rootless" else None
    make_rootfs(base, owner)
    yield request.param, base, root, owner
    subprocess.run([cli, "sim", "destroy", root], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def _sim(root, *args):
    r = subprocess.run([CLI, "sim", "create", root, "--gpus", "2", *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr


def _filter(mode, user, base, root, vis="all"):
    cfg = {"ociVersion": "1.0.2", "root": {"path": os.path.join(base, "rootfs")},
           "process": {"args": ["true"], "env": ["PATH=/bin", f"NVIDIA_VISIBLE_DEVICES={vis}"]}}
    argv = [PYTHON, "-I", "-S", "-c", FILTER, _site()]
    if mode == "rootless":
        argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                "--clear-groups", "--"] + argv
    r = subprocess.run(argv, input=json.dumps(cfg).encode(), capture_output=True, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "GPUSANDBOX_DRIVER_ROOT": root},
                       timeout=60)
    err = r.stderr.decode()
    modules = set(err.rsplit("MODULES ", 1)[1].split()) if "MODULES " in err else set()
    out = json.loads(r.stdout) if r.returncode == 0 else None
    if out:
        for h in out["hooks"]["poststop"]:     # the runtime's delete, done here
            subprocess.run([h["path"]] + h["args"][1:], input=b"{}")
    return r.returncode, err, out, modules


def _wrapper(mode, user, base, root):
    bundle = os.path.join(base, "bundle")
    os.makedirs(bundle, exist_ok=True)
    cfg = {"ociVersion": "1.0.2", "root": {"path": os.path.join(base, "rootfs")},
           "process": {"args": ["true"], "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]}}
    with open(os.path.join(bundle, "config.json"), "w") as f:
        json.dump(cfg, f)
    argv = [PYTHON, "-I", "-S", "-c", WRAPPER, _site(), "create", "--bundle", bundle, "w1"]
    if mode == "rootless":
        subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", bundle], check=True)
        argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                "--clear-groups", "--"] + argv
    r = subprocess.run(argv, capture_output=True, cwd="/", timeout=60,
                       env={"PATH": "/usr/bin:/bin", "GPUSANDBOX_DRIVER_ROOT": root,
                            "GPUSANDBOX_OCI_RUNTIME": "/nonexistent/crun"})
    err = r.stderr.decode()
    assert "cannot run /nonexistent/crun" in err, err
    with open(os.path.join(bundle, "config.json")) as f:
        return json.load(f), set(err.rsplit("MODULES ", 1)[1].split())


def _view(out):
    """What the edit injects, without the per-container directory names."""
    return ([(d["destination"], d["source"]) for d in out["mounts"]
             if d["destination"] != "/etc/ld.so.cache"],
            out["linux"]["resources"]["devices"], out["process"]["env"])


def test_memo_hit_is_lean_and_a_changed_host_is_seen(private_sim):
    mode, base, root, user = private_sim
    _sim(root)
    rc, err, first, mods = _filter(mode, user, base, root)
    assert rc == 0, err
    assert "gpusandbox.gpu.discover" in mods      # computed (and stored)
    nodes = {m["destination"] for m in first["mounts"] if m["destination"].startswith("/dev/")}
    assert {"/dev/nvidia0", "/dev/nvidia1"} <= nodes
    assert any(m["destination"].endswith("libcuda.so.550.54.15") for m in first["mounts"])

    rc, err, again, mods = _filter(mode, user, base, root)
    assert rc == 0, err
    assert _view(again) == _view(first)
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))
    # The wrapper's create takes the same entry (the same inputs).
    edited, mods = _wrapper(mode, user, base, root)
    assert _view(edited) == _view(first)
    assert not mods & set(HEAVY), sorted(mods & set(HEAVY))

    # A GPU gone (its /proc entry and node): the next create sees one GPU.
    gdir = os.path.join(root, "proc/driver/nvidia/gpus")
    bus = sorted(os.listdir(gdir))[1]
    shutil.rmtree(os.path.join(gdir, bus))
    os.unlink(os.path.join(root, "dev/nvidia1"))
    rc, err, fewer, mods = _filter(mode, user, base, root)
    assert rc == 0, err
    assert "gpusandbox.gpu.discover" in mods
    nodes = {m["destination"] for m in fewer["mounts"] if m["destination"].startswith("/dev/")}
    assert "/dev/nvidia0" in nodes and "/dev/nvidia1" not in nodes
    rc, err, _, _ = _filter(mode, user, base, root, vis="1")
    assert rc != 0 and "NVIDIA_VISIBLE_DEVICES" in err, err

    # A driver upgrade (the same root, new version): the new libraries only.
    subprocess.run([CLI, "sim", "destroy", root], check=True, capture_output=True)
    _sim(root, "--driver-version", "555.42.02")
    rc, err, upgraded, mods = _filter(mode, user, base, root)
    assert rc == 0, err
    libs = [m["destination"] for m in upgraded["mounts"] if ".so." in m["destination"]]
    assert any(p.endswith("libcuda.so.555.42.02") for p in libs), libs
    assert not any("550.54.15" in p for p in libs), libs
    # And the same again is a hit.
    rc, err, hit, mods = _filter(mode, user, base, root)
    assert rc == 0 and _view(hit) == _view(upgraded) and not mods & set(HEAVY), err
