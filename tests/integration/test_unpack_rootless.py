"""The hostile-layer corpus (tests/unit/unpack_corpus.py) run by the installed
package as the real unprivileged user and as root: rootless, device nodes
are skipped, everything belongs to the caller, directories stay writable to
it, and no layer reaches the canary beside the root."""
import json
import os
import shutil
import subprocess

import pytest

from tests.integration.conftest import MODES, REPO, VENV
from tests.unit import unpack_corpus


@pytest.mark.parametrize("mode", MODES)
def test_corpus(cli, test_user, shared_tmp, mode):
    uid, gid = (0, 0) if mode == "root" else (test_user.pw_uid, test_user.pw_gid)
    work = shared_tmp / "work"
    work.mkdir()
    os.chown(work, uid, gid)
    script = shared_tmp / "unpack_corpus.py"
    shutil.copy(REPO / "tests" / "unit" / "unpack_corpus.py", script)
    os.chmod(script, 0o644)
    argv = [str(VENV / "bin" / "python"), str(script), str(work)]
    if mode == "rootless":
        argv = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"] + argv
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"})
    assert r.returncode == 0, r.stderr[-3000:]
    results = json.loads(r.stdout)
    assert sorted(results) == sorted(c[0] for c in unpack_corpus.CASES)
    assert {k: v for k, v in results.items() if v} == {}
    assert os.listdir(work) == []
