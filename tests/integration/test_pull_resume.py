"""A pull cut off or killed mid-blob: the next pull (a new process) goes on
from the partial download with an HTTP Range request, verifies the whole
blob, restarts cleanly where the server ignores Range or the kept bytes are
wrong, and never reuses a partial file it did not write itself; root and
rootless, against the real registry and the hostile one."""
import json
import os
import signal
import subprocess
import time

from .hostile_registry import Hostile
from .registry_fixture import images, registry  # noqa: F401
from .test_images_local import _leftovers, gsbx, image_files, store  # noqa: F401


def _cmd(runner, args):
    cmd = [runner.cli] + list(args)
    if runner.mode == "rootless":
        cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
               "--clear-groups", "--"] + cmd
    return cmd


def _partials(store):
    tmp = store / "tmp"
    return {n: (tmp / n).stat().st_size for n in os.listdir(tmp)} if tmp.exists() else {}


def test_killed_pull_resumes_with_range(runner, store):
    h = Hostile()
    try:
        ref = f"docker://{h.host}/hang-resume:latest"
        layer = h.image.layer_desc["digest"]
        p = subprocess.Popen(_cmd(runner, ["pull", "-q", ref]), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd="/",
                             env=runner.env({"GPUSANDBOX_STORE": str(store)}))
        try:
            assert h.half_sent.wait(120), "the pull never reached the layer"
            # Kill once the first MiB is in the partial file.
            deadline = time.monotonic() + 60
            name = "partial-sha256-" + layer[7:]
            while _partials(store).get(name, 0) < 1 << 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(p.pid, signal.SIGKILL)
        finally:
            p.communicate(timeout=60)
            h.release.set()
        left = _leftovers(store)
        assert not [x for x in left if x.startswith(("images/", "refs/"))], left
        kept = _partials(store)[name]
        assert kept >= 1 << 20
        st = os.stat(store / "tmp" / name)
        assert (st.st_uid, st.st_mode & 0o777) == (runner.uid, 0o600)
        assert (os.stat(store / "tmp").st_mode & 0o777) == 0o700
        n_seen = len(h.seen)
        r = gsbx(runner, store, ["pull", "-q", ref])
        assert (r.returncode, r.stdout.strip()) == (0, h.image.digest), r.stderr
        asked = [hd.get("Range") for _, path, hd in h.seen[n_seen:]
                 if path.endswith(f"/blobs/{layer}")]
        # One request, for the rest only: the server answered 206.
        assert asked == [f"bytes={kept}-"], asked
        left = _leftovers(store)
        assert not [x for x in left if x.startswith("tmp/")], left
        # published whole, unpacked, then removed: the layer is the image's copy
        assert any(x.startswith("layers/") for x in left), left
        assert f"blobs/sha256/{layer[7:]}" not in left
    finally:
        h.release.set()
        h.stop()


def _layout_blobs(layout):
    """[descriptor] of the config and layers of the layout's one image."""
    idx = json.loads(open(os.path.join(layout, "index.json")).read())
    dig = idx["manifests"][0]["digest"]
    man = json.loads(open(os.path.join(layout, "blobs", "sha256", dig[7:])).read())
    return man["config"], man["layers"]


def test_partials_resumed_restarted_or_discarded_real_registry(runner, store, registry,
                                                              image_files):
    """Seeded partial files, as a killed pull leaves them, in a pull from
    Debian's docker-registry (which answers Range with 206): a good prefix
    is resumed; a wrong prefix fails the whole-blob digest and the blob is
    fetched again from byte 0; a file with other permissions or a longer
    one is never used."""
    lay = image_files["layout"]
    registry.push(lay, "v1", "resume/img")
    config, layers = _layout_blobs(lay)
    good, bad = sorted(layers, key=lambda d: -d["size"])[:2]
    blob = lambda d: open(os.path.join(lay, "blobs", "sha256", d["digest"][7:]), "rb").read()
    tmp = store / "tmp"
    os.makedirs(tmp, 0o700)
    for d in (store, tmp):
        os.chown(d, runner.uid, runner.gid)
        os.chmod(d, 0o700)
    seeds = {good["digest"]: (blob(good)[: good["size"] // 2], 0o600),
             bad["digest"]: (b"\xff" * (bad["size"] // 2), 0o600),
             config["digest"]: (blob(config)[:10], 0o644)}
    for dig, (data, mode) in seeds.items():
        path = tmp / ("partial-sha256-" + dig[7:])
        path.write_bytes(data)
        os.chown(path, runner.uid, runner.gid)
        os.chmod(path, mode)
    since = registry.log_size()
    ref = f"docker://{registry.host}/resume/img:v1"
    r = gsbx(runner, store, ["pull", "-q", ref])
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 20
    statuses = {}
    while time.monotonic() < deadline:
        statuses = {}
        for m in registry._blob_lines(since):
            statuses.setdefault(m.group(2), []).append(int(m.group(3)))
        if sum(map(len, statuses.values())) >= 4:
            break
        time.sleep(0.1)
    assert statuses[good["digest"]] == [206], statuses
    assert statuses[bad["digest"]] == [206, 200], statuses
    assert statuses[config["digest"]] == [200], statuses
    assert not [x for x in _leftovers(store) if x.startswith("tmp/")]
    r = gsbx(runner, store, ["run", ref])
    assert (r.returncode, r.stdout) == (0, "cmd:yes:image:/srv/app\n"), r.stderr
