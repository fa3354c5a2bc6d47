"""A fresh node, in any order of first use (issue 22): every part that keeps
state in gpusandbox's runtime directories (gpusandbox/rundir.py) runs first
on an empty runtime root, then every other part runs after it; all succeed,
as root and as an unprivileged user.  Plus the repair of a mode an older
version left, and the refusal of a directory another user owns.

Each case runs in a mount namespace of its own (unshare, private
propagation) with fresh tmpfs mounts on /run and /tmp, so what other tests
or earlier runs left never decides the outcome; the images and the
simulated driver live outside /tmp for that reason.

Variants: "root"; "rootless" (a logind-style /run/user/<uid>, 0700, the
user's, and XDG_RUNTIME_DIR naming it); "rootless-tmp" (no runtime
directory: the base is /tmp/gpusandbox-<uid>)."""
import json
import os
import shutil
import subprocess
import tempfile

import pytest

from .conftest import BASE, CLI, VENV
from .oci_fixtures import PYTHON, make_rootfs

OCI = str(VENV / "bin" / "gpusandbox-oci")

# Run as root inside the new namespace: fresh /run and /tmp, the variant's
# runtime directory, an optional pre-planted base, then each part as the
# caller; one JSON line of results.
HARNESS = r"""
import json, os, subprocess, sys
variant, uid, gid, order, setup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    json.loads(sys.argv[4]), json.loads(sys.argv[5])
for d, mode in (("/run", "mode=755"), ("/tmp", "mode=1777")):
    subprocess.run(["mount", "-t", "tmpfs", "-o", mode, "tmpfs", d], check=True)
env = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8", "HOME": "/"}
if variant == "rootless":
    os.makedirs("/run/user/%d" % uid, 0o700)
    os.chown("/run/user/%d" % uid, uid, gid)
    env["XDG_RUNTIME_DIR"] = "/run/user/%d" % uid
for path, owner, mode in setup:
    os.mkdir(path, mode)
    os.chmod(path, mode)
    os.chown(path, owner, owner)
out = []
for name, argv, extra, stdin in order:
    if variant != "root":
        argv = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "--"] + argv
    r = subprocess.run(argv, input=(stdin or "").encode(), capture_output=True, cwd="/",
                       env=dict(env, **extra), timeout=120)
    out.append({"part": name, "rc": r.returncode, "out": r.stdout.decode()[-400:],
                "err": r.stderr.decode()[-1500:]})
def tree(top):
    got = {}
    for d, dirs, files in os.walk(top):
        for n in dirs:
            st = os.lstat(os.path.join(d, n))
            got[os.path.join(d, n)] = [st.st_uid, oct(st.st_mode & 0o7777)]
        dirs[:] = [n for n in dirs if n not in ("pipe", "shm", "log") and
                   not n.startswith(("c-", "gpu-"))]
    return got
print(json.dumps({"runs": out, "dirs": {**tree("/run"), **tree("/tmp")}}))
"""


@pytest.fixture(scope="module")
def world(cli, test_user):
    """An image, a bundle, a squashfs image and a simulated 1-GPU host, all
    outside /tmp (the cases hide /tmp under a tmpfs of their own)."""
    base = tempfile.mkdtemp(prefix="rundir-", dir=BASE)
    os.chmod(base, 0o755)
    rootfs = make_rootfs(base)
    sim = os.path.join(base, "host")
    r = subprocess.run([cli, "sim", "create", sim, "--gpus", "1"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    sqsh = os.path.join(base, "img.sqsh")
    if shutil.which("mksquashfs"):
        subprocess.run(["mksquashfs", str(rootfs), sqsh, "-noappend", "-quiet", "-no-progress",
                        "-noI", "-noD", "-noF", "-noX"], check=True, capture_output=True)
    bundles = {}
    for mode, user in (("root", None), ("user", test_user)):
        b = os.path.join(base, f"bundle-{mode}")
        os.mkdir(b, 0o755)
        conf = {"ociVersion": "1.0.2",
                "process": {"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0},
                            "env": ["PATH=/usr/bin:/bin"]},
                "root": {"path": str(rootfs), "readonly": True},
                "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
                "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")]}}
        if user is not None:
            conf["linux"]["namespaces"].append({"type": "user"})
            conf["linux"]["uidMappings"] = [{"containerID": 0, "hostID": user.pw_uid,
                                             "size": 1}]
            conf["linux"]["gidMappings"] = [{"containerID": 0, "hostID": user.pw_gid,
                                             "size": 1}]
        with open(os.path.join(b, "config.json"), "w") as f:
            json.dump(conf, f)
        bundles[mode] = b
    yield {"rootfs": str(rootfs), "sim": sim, "sqsh": sqsh, "bundles": bundles}
    subprocess.run([cli, "sim", "destroy", sim], capture_output=True)
    shutil.rmtree(base, ignore_errors=True)


def _parts(w, variant):
    """(name, argv, extra env, stdin) of each part that keeps state."""
    filt = json.dumps({"ociVersion": "1.0.2", "root": {"path": w["rootfs"]},
                       "process": {"args": ["true"],
                                   "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]}})
    parts = [
        ("run", [CLI, "run", w["rootfs"], "true"], {}, None),
        ("pod", [CLI, "run", "--share", "node", w["rootfs"], "true"],
         {"GPUSANDBOX_POD": "matrix"}, None),
        ("mps", [CLI, "run", "--driver-root", w["sim"], "--gpus", "0", "--gpu-memory", "1G",
                 w["rootfs"], "true"], {}, None),
        ("filter", [CLI, "oci-filter"], {"GPUSANDBOX_DRIVER_ROOT": w["sim"]}, filt),
    ]
    if variant != "rootless-tmp":       # the OCI state root needs a runtime directory
        parts.append(("oci", [OCI, "run", "--bundle",
                              w["bundles"]["root" if variant == "root" else "user"], "m1"],
                      {}, None))
    if variant == "root" and os.path.exists(w["sqsh"]):
        parts.append(("nodeimage", [CLI, "run", w["sqsh"], "true"],
                      {"GPUSANDBOX_NODE_IMAGE": "1"}, None))
    return parts


def _run(variant, user, order, setup=()):
    """The parts in `order` in a fresh namespace, then the MPS daemon down."""
    uid, gid = (0, 0) if variant == "root" else (user.pw_uid, user.pw_gid)
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "--", PYTHON, "-I", "-c",
                        HARNESS, variant, str(uid), str(gid), json.dumps(order),
                        json.dumps(list(setup))], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def _down(w, variant, user):
    """The daemons the mps part started: stopped in the same layout (a
    namespace whose /run and /tmp are fresh again would not find them: the
    harness ends each case with `mps down` as its last part instead)."""
    return ("mps-down", [CLI, "mps", "down", "--driver-root", w["sim"], "--gpus", "0"], {}, None)


VARIANTS = ("root", "rootless", "rootless-tmp")
FIRSTS = ("run", "pod", "mps", "filter", "oci", "nodeimage")


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("first", FIRSTS)
def test_any_part_first_then_every_other(world, test_user, variant, first):
    parts = _parts(world, variant)
    names = [p[0] for p in parts]
    if first not in names:
        pytest.skip(f"{first} does not run in the {variant} variant (root only, or it needs "
                    "a runtime directory)")
    order = [p for p in parts if p[0] == first] + [p for p in parts if p[0] != first]
    got = _run(variant, test_user, order + [_down(world, variant, test_user)])
    for run in got["runs"]:
        assert run["rc"] == 0, run
    uid = 0 if variant == "root" else test_user.pw_uid
    base = {"root": "/run/gpusandbox", "rootless": f"/run/user/{uid}/gpusandbox",
            "rootless-tmp": f"/tmp/gpusandbox-{uid}"}[variant]
    dirs = got["dirs"]
    assert dirs[base] == [uid, "0o755" if variant == "root" else "0o700"], dirs
    for part in ("pods", "mps", "oci-memo"):
        assert dirs[f"{base}/{part}"] == [uid, "0o700"], dirs
    # nothing else of gpusandbox's in /tmp or /run
    ours = [d for d in dirs if "gpusandbox" in d.split("/")[-1] or d.startswith(base + "/")]
    assert all(d == base or d.startswith(base + "/") or d.endswith("gpusandbox-oci")
               or d.startswith(f"/run/user/{uid}/gpusandbox-oci") for d in ours), ours


@pytest.mark.parametrize("variant", ("root", "rootless-tmp"))
def test_an_old_mode_is_repaired_and_a_foreign_base_refused(world, test_user, attack_user,
                                                            variant):
    uid = 0 if variant == "root" else test_user.pw_uid
    base = "/run/gpusandbox" if variant == "root" else f"/tmp/gpusandbox-{uid}"
    parts = {p[0]: p for p in _parts(world, variant)}
    # an older version's mode: 0700 as root (pod mode wanted it), 0755 rootless
    old = 0o700 if variant == "root" else 0o755
    got = _run(variant, test_user, [parts["filter"], parts["pod"]], [(base, uid, old)])
    assert [r["rc"] for r in got["runs"]] == [0, 0], got["runs"]
    assert got["dirs"][base] == [uid, "0o755" if variant == "root" else "0o700"]
    # another user's directory (and for root: any non-root owner) is refused
    # by the parts that must meet there, with one line and a hint
    got = _run(variant, test_user, [parts["pod"], parts["run"]],
               [(base, attack_user.pw_uid, 0o700)])
    pod, run = got["runs"]
    if variant == "root":
        assert pod["rc"] == 125, pod
        lines = pod["err"].strip().splitlines()
        assert lines[0].startswith("gpusandbox: error: runtime directory /run/gpusandbox: "
                                   f"owned by uid {attack_user.pw_uid}"), lines
        assert lines[1] == "hint: remove /run/gpusandbox (as root) and run again", lines
    else:
        # the user has no home of its own to record a fresh name in
        assert pod["rc"] == 125, pod
        assert "XDG_RUNTIME_DIR" in pod["err"], pod
        assert got["dirs"][base] == [attack_user.pw_uid, "0o700"]
    assert run["rc"] == 0, run      # a plain run keeps no state there
