"""scripts/soak as CI runs it: 200 launches mixing root, rootless, GPU and
plain, a share of them SIGKILLed in setup or while running, and an audit that
finds nothing left (mounts, cgroups v1/v2, BPF programs, processes, temp
files, unexpected fds)."""
import os
import re
import subprocess

import pytest

from .conftest import REPO

pytestmark = pytest.mark.root


def test_soak_200_launches_leave_nothing(cli, test_user):
    r = subprocess.run([str(REPO / "scripts" / "soak"), "--launches", "200", "--concurrency", "4",
                        "--gpusandbox", cli], capture_output=True, text=True, timeout=900,
                       cwd="/")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    audit = re.search(r"^soak: audit (.*)$", r.stdout, re.M)
    assert audit, out[-4000:]
    counts = dict(kv.split("=") for kv in audit.group(1).split())
    assert set(counts) >= {"mounts", "cgroups", "bpf", "processes", "tempfiles", "fds",
                           "leftovers"}
    assert all(v == "0" for v in counts.values()), audit.group(0)
    launched = re.search(r"^soak: 200 launches in .*complete=(\d+) kill-running=(\d+) "
                         r"kill-setup=(\d+) kill-stage=(\d+)", r.stdout, re.M)
    assert launched and all(int(n) > 0 for n in launched.groups()), r.stdout
