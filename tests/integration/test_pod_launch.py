"""The cost structure of a pod rank's launch (hpc/pod.py Member.clone): a rank
that joins a running pod creates no more processes than an isolated launch
(`--share none`): the launcher joins the pod's pid namespace itself and clones
the rank's init straight into it, with no helper process in between.  Counted
from strace's record of every process-creating call in the launch's tree, not
timed.  Root and rootless (the rootless launcher joins the pod's user
namespace first)."""
import os
import re
import shutil
import subprocess
import uuid

import pytest

from tests.integration.conftest import kill_quietly, wait_for

CREATE = re.compile(r"^\d+\s+(fork|vfork|clone|clone3)\(.*\)\s+=\s+\d+", re.M)


def _traced(runner, args, env, out):
    argv = runner.argv(args)
    at = argv.index(runner.cli)
    argv[at:at] = ["strace", "-f", "-qq", "-e", "trace=fork,vfork,clone,clone3",
                   "-e", "signal=none", "-o", out]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env=runner.env(env), cwd="/")


def test_joining_rank_creates_no_more_processes_than_isolated(runner, rootfs, shared_tmp):
    if not shutil.which("strace"):
        pytest.skip("strace not installed (apt-get install -y strace)")
    env = {"GPUSANDBOX_POD": "launch-" + uuid.uuid4().hex[:10]}
    logs = shared_tmp / "logs"
    logs.mkdir()
    os.chown(logs, runner.uid, runner.gid)
    first = runner.popen(["--share", "node", str(rootfs), "/bin/sh", "-c",
                          ": > /dev/shm/up; sleep 60"], env=env)
    try:
        # The first rank (and the pod's keeper) are up once its file is in the
        # pod's /dev/shm.
        probe = ["--share", "node", str(rootfs), "/bin/sh", "-c", "test -e /dev/shm/up"]
        assert wait_for(lambda: runner.run(probe, env=env).returncode == 0, 30), \
            first.stderr.read() if first.poll() is not None else "first rank not up"
        counts = {}
        for share in ("node", "none"):
            log = str(logs / f"strace-{share}")
            # Exit 0 only in the pod (its /dev/shm), 1 isolated.
            r = _traced(runner, ["--share", share, str(rootfs), "/bin/sh", "-c",
                                 "test -e /dev/shm/up"], env, log)
            assert r.returncode == (0 if share == "node" else 1), r.stderr
            with open(log) as f:
                counts[share] = len(CREATE.findall(f.read()))
        assert counts["none"] > 0, counts
        assert counts["node"] <= counts["none"], counts
    finally:
        kill_quietly(first)
