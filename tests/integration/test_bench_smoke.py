"""Smoke test of scripts/bench: it runs end to end with a few launches and
writes its table and results file.  No timing is asserted here; the numbers
belong to the benchmark itself (docs/bench.md)."""
import json
import os
import pwd
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "scripts", "bench")
GSBX = [os.path.join(os.path.dirname(sys.executable), "gpusandbox")]
ROWS = ("gsbx-rootless-gpu", "gsbx-rootless-none", "gsbx-rootless-plain",
        "gsbx-root-gpu", "gsbx-root-none", "gsbx-root-plain")
TARGET_KEYS = {"target", "value", "limit", "unit", "status"}

pytestmark = pytest.mark.root


def _user_exists(name):
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("scripts/bench runs as root (it creates its rootless user)")
    if not os.path.exists(GSBX[0]):
        pytest.skip(f"no gpusandbox command next to {sys.executable}")
    user_before = _user_exists("gsbench")
    out = tmp_path_factory.mktemp("bench") / "results.json"
    p = subprocess.run([BENCH, "--runs", "2", "--concurrency", "5", "--no-install",
                        "--no-images", "--no-oci",
                        "--gpusandbox", GSBX[0], "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    return {"proc": p, "json": out,
            "user_kept": _user_exists("gsbench") and not user_before}


def test_exits_zero_and_prints_the_table(bench):
    p = bench["proc"]
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert any(l.startswith("launcher") and "median" in l for l in lines), p.stdout
    for row in ROWS:
        assert any(l.startswith(row) for l in lines), f"{row} missing:\n{p.stdout}"
    assert "targets (issue 8):" in p.stdout
    assert "targets (issue 24, the lean launch path):" in p.stdout
    assert "exec into a running sandbox vs run of the same image" in p.stdout
    assert f"results: {bench['json']}" in p.stdout


def test_results_file_has_the_expected_keys(bench):
    assert bench["proc"].returncode == 0, bench["proc"].stderr[-3000:]
    doc = json.loads(bench["json"].read_text())
    for key in ("schema", "machine", "config", "binds", "launchers", "ratios",
                "concurrency", "discovery", "memory", "targets", "gpusandbox", "peers"):
        assert key in doc, key
    assert doc["config"]["runs"] == 2 and doc["config"]["concurrency"] == 5
    assert doc["binds"]["count"] > 0
    for name in ROWS:
        row = doc["launchers"][name]
        assert row["status"] == "ok", f"{name}: {row['reason']}"
        assert row["n"] == 2 and len(row["samples_ms"]) == 2
        assert row["min_ms"] <= row["median_ms"] <= row["max_ms"]
    for name, row in doc["launchers"].items():
        assert row["status"] in ("ok", "not run", "failed"), name
        if row["status"] != "ok":
            assert row["reason"], f"{name} has no reason for '{row['status']}'"
    assert {"median_ms", "ldcache_entries"} <= set(doc["discovery"])
    assert set(doc["memory"]) == {"rootless", "root"}
    for mode, m in doc["memory"].items():
        assert m["rss_mb"] > 0 and m["processes"], mode
        assert all(p["comm"] != "sleep" for p in m["processes"]), mode
    assert len(doc["targets"]) == 5 and len(doc["lean_targets"]) == 2
    # the live row (issue 28) is in the default set, per mode; like a launcher
    # row it may fail with a reason (GSBX may predate run -d): its own checks
    # are test_bench_live_smoke.py's
    for mode in ("rootless", "root"):
        live = doc["live"][mode]
        assert live["status"] == "ok" or live["reason"], live
        if live["status"] == "ok":
            assert live["exec"]["n"] == live["run"]["n"] == 2 and live["ratio"] > 0
    for t in doc["targets"] + doc["lean_targets"]:
        assert set(t) == TARGET_KEYS
        assert t["status"] in ("PASS", "MISS", "n/a")
    # issue 24's count: the launch's own modules, not the interpreter's
    beyond = doc["profile"]["importtime"]["beyond_startup"]
    assert "gpusandbox.stages.parent" in beyond and "encodings" not in beyond
    assert doc["lean_targets"][1]["value"] == len(beyond)


def test_cleans_up_after_itself(bench):
    assert bench["proc"].returncode == 0, bench["proc"].stderr[-3000:]
    # Only its own temp dir counts: another benchmark may run beside it.
    own = json.loads(bench["json"].read_text())["tmp"]
    assert own.startswith("/tmp/gsbx-bench-") and not os.path.exists(own), own
    assert not bench["user_kept"], "the benchmark user it created is still there"
