"""scripts/mkrootfs as an unprivileged user: a user's PATH has no /sbin, where
ldconfig lives, and the image still gets its loader cache."""
import os
import subprocess

import pytest

from .conftest import REPO


def test_mkrootfs_as_a_user_without_sbin_on_path(shared_tmp, test_user):
    if os.geteuid() != 0:
        pytest.skip("switches to the unprivileged test user: needs root")
    os.chown(shared_tmp, test_user.pw_uid, test_user.pw_gid)
    root = shared_tmp / "root"
    r = subprocess.run(["setpriv", f"--reuid={test_user.pw_uid}", f"--regid={test_user.pw_gid}",
                        "--clear-groups", "--", str(REPO / "scripts" / "mkrootfs"), str(root),
                        "--no-python"],
                       env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(shared_tmp)},
                       capture_output=True, text=True, timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert (root / "etc" / "ld.so.cache").stat().st_size > 0
