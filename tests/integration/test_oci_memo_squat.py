"""Rootless, the filter's state and the memo live in /tmp/gpusandbox-<host
uid>: a name another user can take first.  Taken (a directory of theirs
open to all, or a link to one), the filter still edits the config, puts
nothing there and reads nothing from there, discovers every time (no memo),
and its poststop hook leaves nothing behind.  Each case runs in a mount
namespace of its own with a fresh tmpfs on /tmp, so the real
/tmp/gpusandbox-<uid> of other tests is never touched.

Modes: the plain unprivileged user, and root of a user namespace of that
user's (rootless podman runs hooks that way).  Real root keeps its state in
/run/gpusandbox, which no other user can take: the "root" case checks that
a taken /tmp/gpusandbox-0 changes nothing for it (the memo still hits)."""
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from .conftest import BASE
from .oci_fixtures import PYTHON, make_rootfs
from .test_oci_memo import FILTER, HEAVY, _site

SQUATTER = 54321
# Run as root in the new mount namespace: a fresh /tmp (and /run, where
# real root's state goes), the name taken, then the filter twice as the
# caller with its poststop hooks run as the runtime's delete would; one
# JSON line of what happened.
HARNESS = r"""
import json, os, subprocess, sys
mode, uid, gid, how, base, root, python, site, code = sys.argv[1:]
uid, gid = int(uid), int(gid)
for d in ("/tmp", "/run"):
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777" if d == "/tmp" else "mode=755",
                    "tmpfs", d], check=True)
name = "/tmp/gpusandbox-%d" % (0 if mode == "root" else uid)
theirs = "/tmp/theirs"
os.mkdir(theirs)
os.chmod(theirs, 0o777)
os.chown(theirs, %(squatter)d, %(squatter)d)
if how == "dir":
    os.rename(theirs, name)
    theirs = name
else:
    os.symlink(theirs, name)
cfg = {"ociVersion": "1.0.2", "root": {"path": os.path.join(base, "rootfs")},
       "process": {"args": ["true"], "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]}}
argv = [python, "-I", "-S", "-c", code, site]
if mode != "root":
    argv = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "--"] + \
        (["unshare", "-r"] if mode == "userns" else []) + argv
runs = []
for _ in range(2):
    r = subprocess.run(argv, input=json.dumps(cfg).encode(), capture_output=True, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "GPUSANDBOX_DRIVER_ROOT": root})
    err = r.stderr.decode()
    out = json.loads(r.stdout) if r.returncode == 0 else None
    dirs = []
    for h in (out or {}).get("hooks", {}).get("poststop", []):
        dirs.append(h["args"][-1])
        subprocess.run([h["path"]] + h["args"][1:], input=b"{}")
    runs.append({"rc": r.returncode, "err": err[-2000:],
                 "modules": err.rsplit("MODULES ", 1)[1].split() if "MODULES " in err else [],
                 "mounts": [m["destination"] for m in (out or {}).get("mounts", [])],
                 "dirs": dirs})
print(json.dumps({"runs": runs, "tmp": sorted(os.listdir("/tmp")),
                  "theirs": sorted(os.listdir(theirs)),
                  "theirs_owner": os.lstat(theirs).st_uid}))
""".replace("%(squatter)d", str(SQUATTER))


@pytest.fixture(scope="module")
def sim_host(cli, test_user):
    # Outside /tmp: the harness hides /tmp under a tmpfs of its own.
    base = tempfile.mkdtemp(prefix="squat-", dir=BASE)
    os.chmod(base, 0o755)
    root = os.path.join(base, "host")
    make_rootfs(base, test_user)
    r = subprocess.run([cli, "sim", "create", root, "--gpus", "1"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    yield base, root
    subprocess.run([cli, "sim", "destroy", root], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def _run(mode, how, base, root, user):
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "--", PYTHON, "-I", "-c",
                        HARNESS, mode, str(user.pw_uid), str(user.pw_gid), how, base, root,
                        PYTHON, _site(), FILTER], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.parametrize("mode,how", [("rootless", "dir"), ("userns", "link"),
                                      ("root", "dir")])
def test_a_taken_tmp_name_is_never_used_nor_fails_the_create(mode, how, sim_host, test_user):
    base, root = sim_host
    got = _run(mode, how, base, root, test_user)
    first, second = got["runs"]
    for run in (first, second):
        assert run["rc"] == 0, run["err"]
        # the GPU edit was made: device node and driver library
        assert "/dev/nvidia0" in run["mounts"], run
        assert any(m.endswith("libcuda.so.550.54.15") for m in run["mounts"]), run
    # nothing of the caller's was put into the other user's directory
    assert got["theirs"] == [] and got["theirs_owner"] == SQUATTER, got
    if mode == "root":
        # /run/gpusandbox as ever: the second create is a memo hit
        assert "gpusandbox.gpu.discover" in first["modules"]
        assert not set(second["modules"]) & set(HEAVY), second["modules"]
        assert all(d.startswith("/run/gpusandbox/oci/c-") for d in first["dirs"]), first
        return
    # no memo: both creates discover
    assert "gpusandbox.gpu.discover" in first["modules"]
    assert "gpusandbox.gpu.discover" in second["modules"]
    # each create used a fresh directory of its own, which its poststop
    # hook removed: /tmp holds only what the other user made
    for run in (first, second):
        assert len(run["dirs"]) == 1, run
        assert run["dirs"][0].startswith(f"/tmp/gpusandbox-{test_user.pw_uid}."), run
    taken = [f"gpusandbox-{test_user.pw_uid}"] + (["theirs"] if how == "link" else [])
    assert got["tmp"] == sorted(taken), got
