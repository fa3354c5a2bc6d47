"""Smoke test of scripts/bench --live-only (issue 28's live row): it starts a
detached sandbox rootless and as root, times `exec NAME /bin/true` against
`run IMAGE /bin/true` interleaved, prints both medians and their ratio,
writes its results file, and stops and removes the sandbox.  No timing is
asserted; the numbers belong to the benchmark (docs/bench.md)."""
import json
import os
import subprocess

import pytest

from .conftest import CLI, TEST_USER

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "scripts", "bench")

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def bench(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "live.json"
    # The test user exists already (scripts/test-users), so the bench neither
    # makes nor removes an account while other tests run.
    p = subprocess.run([BENCH, "--live-only", "--runs", "2", "--warmup", "1",
                        "--gpusandbox", CLI, "--user", TEST_USER, "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    return {"proc": p, "json": out}


def test_prints_both_medians_and_the_ratio(bench):
    p = bench["proc"]
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-2000:]
    for mode in ("rootless", "root"):
        line = [l for l in p.stdout.splitlines() if l.strip().startswith(mode + " ")]
        assert line, f"no {mode} row:\n{p.stdout}"
        assert "exec" in line[0] and " run " in line[0] and "ratio exec/run" in line[0]
    assert "load average" in p.stdout
    assert f"results: {bench['json']}" in p.stdout


def test_results_file(bench):
    assert bench["proc"].returncode == 0, bench["proc"].stderr[-3000:]
    doc = json.loads(bench["json"].read_text())
    assert doc["runs"] == 2 and doc["warmup"] == 1 and doc["load_before"]
    for mode in ("rootless", "root"):
        r = doc[mode]
        assert r["status"] == "ok", r
        # the same image and GPUs for the detached sandbox and the run row
        det, run = r["argv"]["detached"], r["argv"]["run"]
        assert det[det.index("-d") + 3:-2] == run[2:-1] and det[-2:] == ["sleep", "inf"]
        assert r["argv"]["exec"][1:] == ["exec", det[det.index("--name") + 1], "/bin/true"]
        for form in ("exec", "run"):
            assert r[form]["n"] == 2 and len(r[form]["samples_ms"]) == 2
            assert r[form]["min_ms"] <= r[form]["median_ms"] <= r[form]["max_ms"]
        assert r["ratio"] == round(r["exec"]["median_ms"] / r["run"]["median_ms"], 3)
        assert r["cleanup"] == "stopped and removed"


def test_leaves_nothing(bench):
    assert bench["proc"].returncode == 0, bench["proc"].stderr[-3000:]
    doc = json.loads(bench["json"].read_text())
    assert doc["tmp"].startswith("/tmp/gsbx-bench-") and not os.path.exists(doc["tmp"])
    # root's ps -a lists root's sandboxes and what it finds of other users'
    ps = subprocess.run([CLI, "ps", "-a", "--json"], capture_output=True, text=True)
    assert ps.returncode == 0, ps.stderr
    names = {doc[m]["argv"]["exec"][2] for m in ("rootless", "root")}
    assert not [r for r in json.loads(ps.stdout) if r["name"] in names]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        assert not any(n.encode() in argv for n in names), argv
