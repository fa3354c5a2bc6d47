"""Store disk use through the real CLI (issue 26), root and rootless: `du`
of the store before and after pull, rmi and prune, against Debian's
docker-registry and a local oci-archive.  A pulled image is kept once (no
compressed layer beside its unpacked tree unless `pull --keep-blobs`),
`rmi` frees what only that image used at once and keeps a layer another
image lists, and the image still runs, re-pulls and exports (`pull -o`)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .registry_fixture import images, registry  # noqa: F401
from .test_images_local import gsbx, image_files, store  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
import image_fixtures as fx  # noqa: E402

BIG = 2_000_000


def du(path):
    out = subprocess.run(["du", "-s", "-B1", str(path)], check=True, capture_output=True,
                         text=True).stdout
    return int(out.split()[0])


@pytest.fixture(scope="module")
def pair(registry, image_files, workdir_base):
    """Images a (in the registry) and b (an oci-archive) sharing a base layer
    and a BIG incompressible layer; each has a BIG layer of its own."""
    shared = {"opt/": None, "opt/shared": os.urandom(BIG)}
    out = {}
    for name in ("a", "b"):
        man, blobs = fx.build_image([image_files["base"], shared,
                                     {f"opt/{name}": os.urandom(BIG)}],
                                    Entrypoint=["/bin/sh", "-c"], Cmd=["true"])
        lay = fx.write_layout(str(workdir_base / f"disk-{name}"), [("t", man, blobs)])
        subprocess.run(["chmod", "-R", "a+rX", lay], check=True)
        if name == "a":
            registry.push(lay, "t", "disk/a")
            out[name] = f"docker://{registry.host}/disk/a:t"
        else:
            tar = str(workdir_base / "disk-b.tar")
            fx.tar_dir(lay, tar)
            os.chmod(tar, 0o644)
            out[name] = f"oci-archive:{tar}:t"
    return out


def _ok(r):
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_pull_rmi_prune_disk_use(runner, store, pair):
    a, b = pair["a"], pair["b"]
    _ok(gsbx(runner, store, ["images"]))
    _ok(gsbx(runner, store, ["pull", "-q", a]))
    one = du(store)
    blobs = os.listdir(store / "blobs" / "sha256")
    assert len(blobs) == 2, blobs                       # the manifest and the config
    # the layers unpacked once; their compressed copies (as big) are gone:
    # the store is its layers, plus the image's directories and small files
    assert du(store / "blobs") < 64 << 10
    assert du(store / "layers") >= 2 * BIG
    assert one - du(store / "layers") < 2 << 20, (one, du(store / "layers"))
    _ok(gsbx(runner, store, ["pull", "-q", b]))
    two = du(store)
    assert two - one < BIG * 1.3                        # b added only its own layer

    r = _ok(gsbx(runner, store, ["images", "--json"]))
    rows = {x["reference"]: x for x in json.loads(r)}
    assert all(x["shared_size"] >= BIG and x["unique_size"] >= BIG for x in rows.values())
    text = _ok(gsbx(runner, store, ["images"]))
    assert "SHARED" in text.splitlines()[0] and "UNIQUE" in text.splitlines()[0]
    df = _ok(gsbx(runner, store, ["images", "--df"]))
    assert "RECLAIMABLE" in df and "Images" in df

    # everything that needed the blobs works without them
    assert gsbx(runner, store, ["run", a, "test -s /opt/shared && test -s /opt/a"]) \
        .returncode == 0
    _ok(gsbx(runner, store, ["pull", "-q", a]))         # a re-pull fetches nothing
    if shutil.which("mksquashfs"):
        out = store.parent / "a.sqsh"            # the runner's own directory
        _ok(gsbx(runner, store, ["pull", "-q", a, "-o", str(out)]))
        assert out.stat().st_size > BIG

    # rmi frees a's own layer at once; the shared layers stay for b
    _ok(gsbx(runner, store, ["rmi", a.partition("://")[2]]))
    after = du(store)
    assert two - after >= BIG * 0.95, (two, after)
    assert gsbx(runner, store, ["run", b, "test -s /opt/shared && test -s /opt/b"]) \
        .returncode == 0
    assert "0 images, 0 blobs" in _ok(gsbx(runner, store, ["prune"]))
    _ok(gsbx(runner, store, ["rmi", b]))
    assert du(store) < 256 << 10
    assert os.listdir(store / "layers") == [] and os.listdir(store / "blobs" / "sha256") == []


def test_keep_blobs(runner, store, pair):
    a = pair["a"]
    _ok(gsbx(runner, store, ["pull", "-q", "--keep-blobs", a]))
    blobs = os.listdir(store / "blobs" / "sha256")
    assert len(blobs) == 2 + 3, blobs                   # manifest, config, 3 layers
    assert du(store / "blobs") >= 2 * BIG
    assert "0 images, 0 blobs" in _ok(gsbx(runner, store, ["prune"]))
    _ok(gsbx(runner, store, ["rmi", a.partition("://")[2]]))
    assert os.listdir(store / "blobs" / "sha256") == []
