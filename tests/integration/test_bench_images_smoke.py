"""Smoke test of scripts/bench's images section (--images-only, tiny sizes):
it starts the loopback registry, pushes its images, measures each part and
writes the table and results, and leaves nothing behind.  No timing is
asserted; the numbers belong to the benchmark (docs/bench.md)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "scripts", "bench")
GSBX = os.path.join(os.path.dirname(sys.executable), "gpusandbox")
TARGET_KEYS = {"target", "value", "limit", "unit", "status"}

pytestmark = pytest.mark.root


def _is_registry(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() == "docker-registry"
    except OSError:
        return False


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("scripts/bench runs as root")
    if not os.path.exists(GSBX):
        pytest.skip(f"no gpusandbox command next to {sys.executable}")
    for tool in ("/usr/bin/docker-registry", "skopeo", "umoci"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed (scripts/test installs it)")
    out = tmp_path_factory.mktemp("bench") / "results.json"
    p = subprocess.run([BENCH, "--images-only", "--image-size", "2M", "--entries", "1500",
                        "--image-reps", "1", "--runs", "1", "--gpusandbox", GSBX,
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    return {"proc": p, "json": out}


def test_prints_the_images_table_and_targets(bench):
    p = bench["proc"]
    assert p.returncode == 0, p.stderr[-3000:]
    assert "images: a 2 MiB 5-layer image" in p.stdout, p.stdout
    assert "image targets (issue 11):" in p.stdout
    # The launcher rows are left out by --images-only.
    assert not any(l.startswith("gsbx-rootless-gpu") for l in p.stdout.splitlines())


def test_results_hold_every_part(bench):
    assert bench["proc"].returncode == 0, bench["proc"].stderr[-3000:]
    doc = json.loads(bench["json"].read_text())
    assert "launchers" not in doc
    im = doc["images"]
    assert "error" not in im, im
    pull = im["pull"]
    for tool in ("gpusandbox", "skopeo+umoci"):
        assert "error" not in pull[tool], pull[tool]
        assert len(pull[tool]["samples_ms"]) == 1
    assert pull["ratios"]["skopeo+umoci"] > 0
    assert pull["gpusandbox_max_rss_mb"] > 0
    sec = im["second"]
    # The second image shares 4 of 5 layers: its config and new layer come
    # from the registry, nothing else; the store keeps its manifest and
    # config, not the new layer's compressed blob once it is unpacked.
    assert sec["new_layer_fetched"] and sec["shared_layers_fetched"] == 0, sec
    assert sec["blobs_fetched"] == 2 and sec["store_blobs_added"] == 2, sec
    assert sec["bytes_fetched"] >= sec["new_layer_bytes"]
    # Only the new layer is unpacked (the store keeps each layer once), as
    # root and rootless.
    for key in ("second", "second_rootless"):
        assert im[key]["layers_applied"] == 1 and im[key]["layer_dirs_added"] == 1, im[key]
        assert im[key]["shared_layers_fetched"] == 0, im[key]
    for key in ("cached_run", "cached_run_rootless"):
        cr = im[key]
        assert "error" not in cr, cr
        assert cr["n"] >= 10 and cr["image_median_ms"] > 0 and cr["dir_median_ms"] > 0
    co = im["concurrent"]
    assert co["n"] == 32 and co["failed"] == 0, co
    assert co["blobs"] == 6 and co["max_gets_per_blob"] == 1, co
    en = im["entries_pull"]
    assert en["error"] is None and en["entries"] == 1500 and en["max_rss_mb"] > 0, en
    assert len(im["targets"]) == 7   # the cached run and second image rootless too
    for t in im["targets"]:
        assert set(t) == TARGET_KEYS
        assert t["status"] in ("PASS", "MISS"), t


def test_leaves_nothing_behind(bench):
    assert bench["proc"].returncode == 0, bench["proc"].stderr[-3000:]
    # Only its own temp dir counts: another benchmark may run beside it.
    own = json.loads(bench["json"].read_text())["tmp"]
    assert own.startswith("/tmp/gsbx-bench-") and not os.path.exists(own), own
    pid = json.loads(bench["json"].read_text())["images"]["registry_pid"]
    assert pid > 0 and not _is_registry(pid), "the docker-registry it started still runs"
