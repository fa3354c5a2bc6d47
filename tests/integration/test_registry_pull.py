"""docker:// end to end through the real CLI, root and rootless: pull and
run from Debian's docker-registry on 127.0.0.1 (anonymous and htpasswd with
an authfile), run pulling on a miss, and registry failures as one line,
exit 125, nothing left in the store."""
import base64
import json
import os
import signal
import subprocess
import time

import pytest

from .hostile_registry import Hostile
from .registry_fixture import images, registry, registry_auth  # noqa: F401
from .test_images_local import _leftovers, gsbx, image_files, store  # noqa: F401


@pytest.fixture(scope="session")
def pushed(registry, registry_auth, image_files):
    """The runnable image of test_images_local in both registries."""
    lay = image_files["layout"]
    return {"anon": registry.push(lay, "v1", "e2e/img"),
            "auth": registry_auth.push(lay, "v1", "e2e/img", creds=registry_auth.creds)}


def _authfile(tmp, registry_auth, runner):
    """An auth.json with the registry's credentials, the runner's own, 0600."""
    af = tmp / "auth.json"
    user, pw = registry_auth.creds
    af.write_text(json.dumps({"auths": {registry_auth.host: {
        "auth": base64.b64encode(f"{user}:{pw}".encode()).decode()}}}))
    os.chown(af, runner.uid, runner.gid)
    os.chmod(af, 0o600)
    return af


def test_pull_and_run_docker_ref(runner, store, registry, pushed):
    ref = f"docker://{registry.host}/e2e/img:v1"
    r = gsbx(runner, store, ["pull", "-q", ref])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == pushed["anon"]
    r = gsbx(runner, store, ["run", ref])
    assert (r.returncode, r.stdout) == (0, "cmd:yes:image:/srv/app\n"), r.stderr
    r = gsbx(runner, store, ["images", "--json"])
    assert [x["reference"] for x in json.loads(r.stdout)] == [f"{registry.host}/e2e/img:v1"]


def test_run_pulls_on_a_miss(runner, store, registry, pushed):
    ref = f"docker://{registry.host}/e2e/img@{pushed['anon']}"
    r = gsbx(runner, store, ["run", ref, "cat hello"])
    assert (r.returncode, r.stdout) == (0, "hello from the image\n"), r.stderr
    assert os.listdir(store / "images") == [pushed["anon"][7:]]


def test_pull_with_authfile(runner, store, registry_auth, pushed, shared_tmp):
    ref = f"docker://{registry_auth.host}/e2e/img:v1"
    r = gsbx(runner, store, ["pull", "-q", ref])
    assert r.returncode == 125 and r.stderr.count("\n") <= 2, r.stderr
    assert r.stderr.startswith("gpusandbox: error: ") and "authentication required" in r.stderr
    assert "--authfile" in r.stderr and _leftovers(store) == []
    af = _authfile(shared_tmp, registry_auth, runner)
    r = gsbx(runner, store, ["pull", "-q", "--authfile", str(af), ref])
    assert (r.returncode, r.stdout.strip()) == (0, pushed["auth"]), r.stderr



def test_run_pulls_with_registry_auth_file(runner, store, registry_auth, pushed, shared_tmp):
    """run has no --authfile: $REGISTRY_AUTH_FILE (or the user's auth.json)
    serves a pull on a miss."""
    af = _authfile(shared_tmp, registry_auth, runner)
    cmd = [runner.cli, "run", f"docker://{registry_auth.host}/e2e/img:v1", "cat hello"]
    if runner.mode == "rootless":
        cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
               "--clear-groups", "--"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/",
                       env=runner.env({"GPUSANDBOX_STORE": str(store),
                                       "REGISTRY_AUTH_FILE": str(af)}))
    assert (r.returncode, r.stdout) == (0, "hello from the image\n"), r.stderr


@pytest.mark.parametrize("scen,words", [
    ("wrongdigest", "does not match its digest"),
    ("denied", "access denied"),
    ("garbage", "not valid JSON"),
])
def test_registry_failure_one_line_nothing_left(runner, store, scen, words):
    h = Hostile()
    try:
        r = gsbx(runner, store, ["pull", "-q", f"docker://{h.host}/{scen}:latest"])
    finally:
        h.stop()
    assert r.returncode == 125, r.stderr
    assert r.stderr.startswith("gpusandbox: error: ") and words in r.stderr.splitlines()[0]
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) <= 2
    assert _leftovers(store) == []


def test_concurrent_cold_pulls_fetch_each_blob_once(runner, store, registry, pushed):
    """8 pulls at once on a cold store: all succeed, one image, and the
    registry served every blob once (the store's per-blob locks)."""
    ref = f"docker://{registry.host}/e2e/img:v1"
    since = registry.log_size()
    cmd = [runner.cli, "pull", "-q", ref]
    if runner.mode == "rootless":
        cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
               "--clear-groups", "--"] + cmd
    env = runner.env({"GPUSANDBOX_STORE": str(store)})
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd="/", env=env) for _ in range(8)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert {o.strip() for o, _ in outs} == {pushed["anon"]}
    # the registry logs a request after answering it: wait for the lines
    deadline = time.monotonic() + 20
    while len(gets := registry.blob_gets(since)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    # the config and both layers, each once
    assert len(gets) == 3 and set(gets.values()) == {1}, gets


def test_pull_killed_mid_layer_leaves_nothing_and_next_pull_completes(runner, store):
    h = Hostile()
    try:
        ref = f"docker://{h.host}/hang:latest"
        cmd = [runner.cli, "pull", "-q", ref]
        if runner.mode == "rootless":
            cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
                   "--clear-groups", "--"] + cmd
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/",
                             env=runner.env({"GPUSANDBOX_STORE": str(store)}))
        part = store / "tmp" / ("partial-sha256-" + h.image.layer_desc["digest"][7:])
        try:
            assert h.half_sent.wait(120), "the pull never reached the layer"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and \
                    (not part.exists() or part.stat().st_size < 1 << 20):
                time.sleep(0.05)
            os.kill(p.pid, signal.SIGKILL)
        finally:
            p.communicate(timeout=60)
            h.release.set()
        assert not [x for x in _leftovers(store) if x.startswith(("images/", "refs/"))]
        kept, n_seen = part.stat().st_size, len(h.seen)
        r = gsbx(runner, store, ["pull", "-q", ref])
        assert (r.returncode, r.stdout.strip()) == (0, h.image.digest), r.stderr
        # It asked for the rest; this server ignores Range (200, the whole
        # blob), which the pull took from byte 0 in that one response.
        asked = [hd.get("Range") for _, path, hd in h.seen[n_seen:]
                 if path.endswith("/blobs/" + h.image.layer_desc["digest"])]
        assert asked == [f"bytes={kept}-"], asked
        left = _leftovers(store)
        assert [x for x in left if x.startswith("images/")] == ["images/" + h.image.digest[7:]]
        assert not [x for x in left if x.startswith("tmp/")], left
    finally:
        h.release.set()
        h.stop()


@pytest.mark.parametrize("scen", ["cut-resume", "cut-restart", "expire", "redirect", "flaky"])
def test_registry_recoveries_through_the_cli(runner, store, scen):
    """A cut resumed or restarted, a token renewed in mid-pull, a redirect
    to blob storage, 5xx retried: the pull completes, verified."""
    h = Hostile()
    try:
        r = gsbx(runner, store, ["pull", "-q", f"docker://{h.host}/{scen}:latest"])
    finally:
        h.stop()
    assert (r.returncode, r.stdout.strip()) == (0, h.image.digest), r.stderr
