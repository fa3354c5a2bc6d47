"""Errors a user can cause, as the user sees them (the CLI run as a
process): one line (plus a hint), the documented exit code, no traceback,
no internal names; SIGINT/SIGTERM at several points of a pull end with
130/143, leave no half-written store entry, and the next pull resumes."""
import os
import signal
import socket
import subprocess
import time

import pytest

from tests.unit import image_fixtures as fx

from .hostile_registry import Hostile
from .test_images_local import _leftovers, gsbx, store  # noqa: F401


def _one_error(r, code):
    """One `gpusandbox: error:` line (and at most a hint), exit `code`."""
    err = r.stderr if isinstance(r.stderr, str) else r.stderr.decode()
    assert r.returncode == code, (r.returncode, err)
    assert "Traceback" not in err and "/proc/self/fd" not in err, err
    lines = [x for x in err.splitlines() if x and not x.startswith("gpusandbox: paused at")]
    assert lines and lines[0].startswith("gpusandbox: error: "), err
    assert not lines[0].startswith("gpusandbox: error: gpusandbox"), err
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), err
    for internal in ("HTTPConnectionPool", "urllib3", "ImageError", "OSError", "Errno"):
        assert internal not in err, err
    return lines[0]


def _layout(where, tags, big=False):
    base = {"bin/": None, "etc/": None, "etc/hello": b"hi\n"}
    imgs = []
    for n, t in enumerate(tags):
        layer = dict(base, **{f"etc/v{n}": str(n).encode()})
        if big:
            layer["big"] = os.urandom(3 << 20)
        m, b = fx.build_image([layer])
        imgs.append((t, m, b))
    lay = fx.write_layout(str(where), imgs)
    subprocess.run(["chmod", "-R", "a+rX", lay], check=True)
    return lay


def test_layout_with_two_tags_and_no_tag_lists_them(runner, store, shared_tmp):
    lay = _layout(shared_tmp / "two", ["a", "b"])
    line = _one_error(gsbx(runner, store, ["pull", f"oci:{lay}"]), 125)
    assert "tags: a, b" in line and "none" not in line, line
    assert not [x for x in _leftovers(store) if not x.startswith("tmp/")]


def test_unreadable_index_names_its_path(runner, store, shared_tmp):
    if runner.mode == "root":
        pytest.skip("root reads a 0600 file")
    lay = _layout(shared_tmp / "umoci", ["v1"])
    os.chmod(os.path.join(lay, "index.json"), 0o600)     # as umoci writes it
    line = _one_error(gsbx(runner, store, ["pull", f"oci:{lay}"]), 125)
    assert f"Permission denied: {lay}/index.json" in line, line


@pytest.mark.parametrize("cmd", [["pull"], ["images", "--bogus"], ["inspect"], ["rmi"]])
def test_usage_errors_have_one_prefix(cli, cmd):
    r = subprocess.run([cli] + cmd, capture_output=True, text=True, cwd="/")
    line = _one_error(r, 125)
    assert line.startswith(f"gpusandbox: error: {cmd[0]}: "), line


@pytest.mark.slow
def test_unreachable_registry_names_host_and_cause(cli, shared_tmp):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                 # nothing listens there now
    r = subprocess.run([cli, "pull", "--store", str(shared_tmp / "st"),
                        f"docker://127.0.0.1:{port}/x/y:1"],
                       capture_output=True, text=True, cwd="/", timeout=120)
    line = _one_error(r, 125)
    assert line == f"gpusandbox: error: cannot reach registry 127.0.0.1:{port}: " \
                   "connection refused (nothing listens on that port)", line


def test_full_store_names_store_and_space(cli, shared_tmp):
    """A 1 MiB tmpfs store (in a private mount namespace) and a 3 MiB image."""
    lay = _layout(shared_tmp / "big", ["v1"], big=True)
    small = shared_tmp / "small"
    small.mkdir()
    sh = (f'mount -t tmpfs -o size=1m tmpfs {small} && '
          f'"$0" pull --store {small}/store oci:{lay}; rc=$?; '
          f'find {small}/store/images {small}/store/tmp {small}/store/layers -mindepth 1; '
          'exit $rc')
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", sh, cli],
                       capture_output=True, text=True, cwd="/", timeout=120)
    err = r.stderr
    line = _one_error(subprocess.CompletedProcess(r.args, r.returncode, "", err), 125)
    assert f"the image store {small}/store is full: no space left on device: " in line, line
    assert "free, and the image needs at least 3." in line, line
    assert r.stdout.strip() == "", r.stdout    # nothing published, no staging left


def _popen(runner, store, args, extra=None):
    env = {"GPUSANDBOX_STORE": str(store)}
    env.update(extra or {})
    cmd = [runner.cli] + list(args)
    if runner.mode == "rootless":
        cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
               "--clear-groups", "--"] + cmd
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd="/", env=runner.env(env))


def _interrupt(p, sig):
    os.kill(p.pid, sig)
    out, err = p.communicate(timeout=60)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def _size(path):
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _no_half_entries(store):
    left = _leftovers(store)
    assert not [x for x in left if x.startswith(("images/", "refs/", "layers/"))], left
    # only a partial download may stay in tmp/, never a staging tree
    assert all(x.startswith("tmp/partial-") for x in left if x.startswith("tmp/")), left


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_mid_blob_then_resume(runner, store, sig):
    h = Hostile()
    try:
        ref = f"docker://{h.host}/hang-resume:latest"
        p = _popen(runner, store, ["pull", "-q", ref])
        try:
            assert h.half_sent.wait(120), "the pull never reached the layer"
            name = "partial-sha256-" + h.image.layer_desc["digest"][7:]
            deadline = time.monotonic() + 60
            # once the first MiB is in the partial file (written, not buffered)
            while _size(store / "tmp" / name) < 1 << 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            r = _interrupt(p, sig)
        finally:
            h.release.set()
        line = _one_error(r, 128 + sig)
        assert line == f"gpusandbox: error: pull interrupted by {signal.Signals(sig).name}"
        assert "goes on from where it stopped" in r.stderr
        _no_half_entries(store)
        assert (store / "tmp" / name).stat().st_size > 0
        r = gsbx(runner, store, ["pull", "-q", ref])
        assert (r.returncode, r.stdout.strip()) == (0, h.image.digest), r.stderr
        layer = h.image.layer_desc["digest"]
        assert any(hd.get("Range") for _, path, hd in h.seen if path.endswith(layer))
    finally:
        h.stop()


def test_interrupt_at_manifest(runner, store):
    h = Hostile()
    try:
        p = _popen(runner, store, ["pull", "-q", f"docker://{h.host}/hang-manifest:latest"])
        try:
            assert h.manifest_asked.wait(120)
            r = _interrupt(p, signal.SIGINT)
        finally:
            h.release.set()
        _one_error(r, 130)
        _no_half_entries(store)
    finally:
        h.stop()


def test_interrupt_during_unpack_leaves_no_staging(runner, store, shared_tmp):
    lay = _layout(shared_tmp / "unpack", ["v1"])
    p = _popen(runner, store, ["pull", "-q", f"oci:{lay}:v1"],
               {"GPUSANDBOX_TEST_PAUSE": "pull-unpack"})
    assert p.stderr.readline().strip() == "gpusandbox: paused at pull-unpack"
    assert [n for n in os.listdir(store / "tmp") if not n.startswith("partial-")]
    r = _interrupt(p, signal.SIGINT)
    _one_error(r, 130)
    _no_half_entries(store)
    r = gsbx(runner, store, ["pull", "-q", f"oci:{lay}:v1"])
    assert r.returncode == 0, r.stderr


def test_interrupt_during_squashfs_export(runner, store, shared_tmp):
    """`pull -o`: SIGINT while mksquashfs runs (a stand-in that stalls):
    130, the image stays in the store, no file or temp dir at the target."""
    lay = _layout(shared_tmp / "sq", ["v1"])
    bindir = shared_tmp / "bin"
    bindir.mkdir()
    marker = shared_tmp / "mksquashfs-started"
    stub = bindir / "mksquashfs"
    stub.write_text(f"#!/bin/sh\ntouch {marker}\nexec sleep 600\n")
    stub.chmod(0o755)
    outdir = shared_tmp / "out"
    outdir.mkdir()
    os.chown(outdir, runner.uid, runner.gid)
    env = {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
    p = _popen(runner, store, ["pull", "-q", "-o", str(outdir / "x.sqsh"), f"oci:{lay}:v1"], env)
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), p.stderr.read() if p.poll() is not None else "still running"
    r = _interrupt(p, signal.SIGINT)
    line = _one_error(r, 130)
    assert line == f"gpusandbox: error: pull -o {outdir}/x.sqsh interrupted by SIGINT", line
    assert os.listdir(outdir) == []
    assert [x for x in _leftovers(store) if x.startswith("images/")]
