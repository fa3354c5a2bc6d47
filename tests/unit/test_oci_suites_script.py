"""scripts/oci-suites (issue 13): its arguments and the TAP it reads. The
suites themselves run by hand (minutes each), never from pytest."""
import importlib.machinery
import importlib.util
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "oci-suites")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def mod():
    loader = importlib.machinery.SourceFileLoader("oci_suites", SCRIPT)
    spec = importlib.util.spec_from_loader("oci_suites", loader)
    m = importlib.util.module_from_spec(spec)
    loader.exec_module(m)
    return m


def test_help_and_bad_arguments(tmp_path):
    h = run("--help")
    assert h.returncode == 0 and "--runtime" in h.stdout and "--crun-src" in h.stdout
    for args, what in (((), "--runtime"),
                       (("--runtime", str(tmp_path / "nope")), "not an executable file"),
                       (("--runtime", "/bin/true", "--suite", "crun", "--crun-src", str(tmp_path)),
                        "not a crun source tree"),
                       (("--runtime", "/bin/true", "--suite", "runtime-tools",
                         "--runtime-tools", str(tmp_path)), "not a runtime-tools source tree"),
                       (("--runtime", "/bin/true", "--mode", "sideways"), "--mode")):
        r = run(*args)
        assert r.returncode == 125, (args, r.stderr)
        first = r.stderr.splitlines()[0]
        assert first.startswith("oci-suites: error: ") and what in first, r.stderr
    assert not list(tmp_path.iterdir())


def test_tap_from_both_suites(mod):
    # runtime-tools (tap-go): a failure's YAML block or the comments after it,
    # a directive skip, an error before any case ran
    rt = ("TAP version 13\nok 1 - has hostname\nnot ok 2 - memory limit\n  ---\n"
          "  error: memory.limit_in_bytes missing\n  ...\nok 3 # SKIP needs pid namespace\n"
          "not ok 4 - get hugetlb cgroup data\n# subsystem hugetlb not found\n1..4\n")
    cases = mod.parse_tap(rt, "validation/linux_cgroups_memory/linux_cgroups_memory.t", False, 1,
                          diag_after=True)
    assert [(c["status"], c["name"]) for c in cases] == [
        ("passed", "has hostname"), ("failed", "memory limit"), ("skipped", "#3"),
        ("failed", "get hugetlb cgroup data")]
    assert "memory.limit_in_bytes" in cases[1]["reason"]
    assert cases[1]["class"] == "cgroup-v1-needed"
    assert cases[2]["reason"] == "needs pid namespace"
    assert cases[3]["reason"] == "subsystem hugetlb not found"
    assert cases[3]["class"] == "cgroup-controller-absent"
    early = mod.parse_tap("TAP version 13\n  ---\n  {\n  \"error\": \"hooks out of order\"\n  }\n  ...\n1..0\n",
                          "validation/hooks/hooks.t", False, 0, diag_after=True)
    assert [(c["status"], c["name"]) for c in early] == [("failed", "(whole file)")]
    assert "hooks out of order" in early[0]["reason"]
    # nothing printed: a pass for a negative check only
    assert mod.parse_tap("", "validation/process_rlimits_fail/process_rlimits_fail.t", False, 0,
                         diag_after=True)[0]["status"] == "passed"
    assert mod.parse_tap("", "validation/default/default.t", False, 0,
                         diag_after=True)[0]["status"] == "failed"
    # crun: timings after the name, a reasoned skip, diagnostics before the result
    cr = ("1..3\nok 1 - cwd # 0.120s\nok 2 - cgroup-v2 #SKIP requires cgroup v2 # 0.001s\n"
          "# Output: runc: flag provided but not defined: -keep\nnot ok 3 - keep # 0.2s\n"
          "# Test 'keep' failed with return code -1\n")
    cases = mod.parse_tap(cr, "tests/test_x.py", False, 1)
    assert [(c["status"], c["name"]) for c in cases] == [
        ("passed", "cwd"), ("skipped", "cgroup-v2"), ("failed", "keep")]
    assert cases[1]["class"] == "cgroup-v2-needed"
    assert cases[2]["class"] == "runtime-cli" and "-keep" in cases[2]["reason"]
    # a file that skips whole, and one cut off by the timeout
    assert mod.parse_tap("1..0 # SKIP no seccomp\n", "f", False, 0)[0]["reason"] == "no seccomp"
    cut = mod.parse_tap("1..4\nok 1 - a # 1s\n# waiting\n", "f", True, "timeout")
    assert cut[-1]["status"] == "failed" and cut[-1]["class"] == "timeout"
