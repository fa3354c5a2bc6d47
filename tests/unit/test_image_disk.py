"""Store disk use (issue 26): a pulled image is kept once, as its unpacked
layers (no compressed layer beside it unless pulled with keep_blobs); rmi
frees what only that image used at once, keeping a layer another image
lists; `images` shows SHARED/UNIQUE disk and `images --df` a summary.
Measured as `du` of the store before and after."""
import json
import os
import subprocess

import pytest

from gpusandbox.image import archive, store as storemod
from gpusandbox.image.cli import main_images
from gpusandbox.image.pull import pull
from gpusandbox.image.storegc import prune, rmi
from tests.unit import image_fixtures as fx

BIG = 3_000_000          # incompressible: its compressed layer is as big as its files


def du(path):
    """Bytes on disk under `path`, each inode once (GNU du)."""
    out = subprocess.run(["du", "-s", "-B1", str(path)], check=True, capture_output=True,
                         text=True).stdout
    return int(out.split()[0])


@pytest.fixture
def pair(tmp_path):
    """Images a and b sharing a BIG base layer, each with a BIG layer of its own."""
    base = {"bin/": None, "bin/sh": b"sh", "base": os.urandom(BIG)}
    out = []
    for tag in ("a", "b"):
        man, blobs = fx.build_image([base, {tag: os.urandom(BIG)}])
        out.append((tag, man, blobs))
    lay = fx.write_layout(str(tmp_path / "lay"), out)
    return lay, {tag: fx.sha(man) for tag, man, _ in out}


def _blob_names(st):
    return sorted(os.listdir(st.root + "/blobs/sha256"))


def test_a_pull_keeps_the_image_once(tmp_path, pair):
    lay, digs = pair
    st = storemod.Store(str(tmp_path / "s"))
    empty = du(st.root)
    pull(st, archive.OciLayoutSource(lay, "a"), ["a:1"])
    grown = du(st.root) - empty
    # Two BIG layers unpacked; their compressed copies (as big again) are gone.
    assert 2 * BIG <= grown < 2 * BIG * 1.2, grown
    rec = st.image_record(digs["a"])
    assert _blob_names(st) == sorted([digs["a"][7:], rec["config"][7:]])
    # Everything still works without the blobs: a re-pull (nothing fetched),
    # the image's files, and a pull of b fetching only its own layer.
    pull(st, archive.OciLayoutSource(lay, "a"), ["a:2"])
    assert open(st.bundle(digs["a"]) + "/rootfs/bin/sh").read() == "sh"
    pull(st, archive.OciLayoutSource(lay, "b"), ["b:1"])
    assert du(st.root) - empty < 3 * BIG * 1.2


def test_keep_blobs_keeps_them_until_rmi(tmp_path, pair):
    lay, digs = pair
    st = storemod.Store(str(tmp_path / "s"))
    pull(st, archive.OciLayoutSource(lay, "a"), ["a:1"])
    # Asked later: the image is there, its compressed layers come back.
    pull(st, archive.OciLayoutSource(lay, "a"), ["a:1"], keep_blobs=True)
    rec = st.image_record(digs["a"])
    assert st.keeps_blobs(digs["a"])
    assert set(d[7:] for d in rec["layers"]) <= set(_blob_names(st))
    # b shares a's base layer: b's pull does not take a's kept blob away.
    pull(st, archive.OciLayoutSource(lay, "b"), ["b:1"])
    assert set(d[7:] for d in rec["layers"]) <= set(_blob_names(st))
    assert prune(st)[:2] == (0, 0)
    rmi(st, ["a:1"])
    rec_b = st.image_record(digs["b"])
    assert _blob_names(st) == sorted([digs["b"][7:], rec_b["config"][7:]])


def test_rmi_frees_what_only_that_image_used(tmp_path, pair):
    lay, digs = pair
    st = storemod.Store(str(tmp_path / "s"))
    empty = du(st.root)
    pull(st, archive.OciLayoutSource(lay, "a"), ["a:1"])
    only_a = du(st.root)
    pull(st, archive.OciLayoutSource(lay, "b"), ["b:1"])
    both = du(st.root)
    assert both - only_a < BIG * 1.2         # b added only its own layer
    rmi(st, ["a:1"])
    after = du(st.root)
    # a's own layer is freed at once; the shared base stays for b.
    assert both - after >= BIG * 0.95, (both, after)
    assert after - empty >= 2 * BIG
    assert open(st.bundle(digs["b"]) + "/rootfs/base", "rb").read(1)
    assert len(os.listdir(st.root + "/layers")) == 2
    # prune has nothing left to free; rmi of b frees the rest.
    assert prune(st)[:2] == (0, 0)
    rmi(st, ["b:1"])
    assert du(st.root) - empty < 64 << 10
    assert _blob_names(st) == [] and os.listdir(st.root + "/layers") == []
    # and a pull after it all works as the first did
    pull(st, archive.OciLayoutSource(lay, "a"), ["a:1"])
    assert open(st.bundle(digs["a"]) + "/rootfs/bin/sh").read() == "sh"


def test_images_shows_shared_and_unique_disk_and_df(tmp_path, pair, capsys):
    lay, digs = pair
    st = storemod.Store(str(tmp_path / "s"))
    pull(st, archive.OciLayoutSource(lay, "a"), ["a:1"])
    pull(st, archive.OciLayoutSource(lay, "b"), [])          # unnamed: prune's
    assert main_images(["--store", st.root, "--json"]) == 0
    rows = {r["reference"]: r for r in json.loads(capsys.readouterr().out)}
    for r in rows.values():
        assert BIG <= r["shared_size"] < BIG * 1.1      # the base layer
        assert BIG <= r["unique_size"] < BIG * 1.1      # its own layer
    assert main_images(["--store", st.root]) == 0
    text = capsys.readouterr().out
    assert "SHARED" in text and "UNIQUE" in text and "3.0 MB" in text
    assert main_images(["--store", st.root, "--df", "--json"]) == 0
    (doc,) = json.loads(capsys.readouterr().out)
    rows = {r["type"]: r for r in doc["rows"]}
    assert rows["Images"]["total"] == 2
    total = sum(r["size"] for r in doc["rows"])
    assert abs(total - du(st.root)) < 256 << 10, (total, du(st.root))
    # the unnamed image's own layer is what prune would free
    assert BIG <= rows["Images"]["reclaimable"] < BIG * 1.1
    before = du(st.root)
    prune(st)
    assert before - du(st.root) >= BIG * 0.95
    assert main_images(["--store", st.root, "--df"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"Store {st.root}\nTYPE") and "RECLAIMABLE" in text
    assert "Total" in text
