"""bin/gpusandbox-runtime reads the `runtime` setting in sh; gpusandbox.settings
reads it in Python (the wrapper module).  For each case (who calls: real
root, the test user, the test user as root of a user namespace; which files
exist, whose they are, their modes; which variables are set) both must pick
the same runtime, or both fail with the same error, and the sh entry must
not start Python when it picks one.

The system file is written into an overlay over /etc in a private mount
namespace: the host's /etc is never touched."""
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .oci_fixtures import PYTHON, WRAPPER

SYSTEM = "/etc/gpusandbox/oci.conf"
# Runs as the caller inside the namespace: the sh entry (under strace, for
# its execs), then the wrapper module, each passing `--version` to the runtime.
DRIVER = """#!/bin/sh
strace -f -qq -e trace=execve -o "$D/trace" "$WRAPPER" --version >"$D/sh.out" 2>"$D/sh.err"
echo $? >"$D/sh.rc"
"$PYTHON" -I -m gpusandbox.oci.wrapper --version >"$D/py.out" 2>"$D/py.err"
echo $? >"$D/py.rc"
"""


@pytest.fixture
def case(cli, test_user):
    d = Path(tempfile.mkdtemp(prefix="gsbx-test-settings-"))
    os.chmod(d, 0o755)
    for name in ("rt-system", "rt-user", "rt-named", "rt-env"):
        (d / name).write_text(f'#!/bin/sh\necho "{name} $*"\n')
        (d / name).chmod(0o755)
    (d / "driver").write_text(DRIVER)
    (d / "driver").chmod(0o755)
    home = d / "home"
    (home / ".config/gpusandbox").mkdir(parents=True)
    for p in (home, home / ".config", home / ".config/gpusandbox"):
        os.chown(p, test_user.pw_uid, test_user.pw_gid)
    (d / "upper/gpusandbox").mkdir(parents=True)
    (d / "work").mkdir()
    yield Case(d, test_user)
    shutil.rmtree(d, ignore_errors=True)


class Case:
    def __init__(self, d, user):
        self.d, self.user = d, user

    def file(self, where, text, mode=0o644, owner="root"):
        path = {"system": self.d / "upper/gpusandbox/oci.conf",
                "user": self.d / "home/.config/gpusandbox/oci.conf",
                "named": self.d / "named.conf"}[where]
        path.write_text(text.replace("@", str(self.d)))
        os.chmod(path, mode)
        uid = 0 if owner == "root" else self.user.pw_uid
        os.chown(path, uid, uid and self.user.pw_gid)
        return path

    def run(self, caller, env=None):
        out = self.d / "out"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        prefix = []
        if caller in ("user", "userns"):
            os.chown(out, self.user.pw_uid, self.user.pw_gid)
            prefix = ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                      "--clear-groups", "--"]
        if caller == "userns":
            prefix += ["unshare", "-U", "-r"]
        env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(self.d / "home"),
               "D": str(out), "WRAPPER": WRAPPER, "PYTHON": PYTHON,
               **{k: v.replace("@", str(self.d)) for k, v in (env or {}).items()}}
        r = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc && '
             'shift 2 && exec "$@"', "sh", str(self.d / "upper"), str(self.d / "work"),
             *prefix, str(self.d / "driver")], env=env, capture_output=True, text=True,
            timeout=120, cwd="/")
        assert r.returncode == 0, r.stderr
        got = {k: (out / k).read_text() for k in ("sh.out", "sh.err", "sh.rc", "py.out",
                                                  "py.err", "py.rc")}
        execs = [ln for ln in (out / "trace").read_text().splitlines() if "execve(" in ln]
        return got, execs


def _same(got):
    assert (got["sh.rc"], got["sh.out"], got["sh.err"]) == \
        (got["py.rc"], got["py.out"], got["py.err"]), got


# (caller, files {where: (text, mode, owner)}, env, expected runtime or error text)
CASES = {
    "root-env-first": ("root", {"system": ("runtime = @/rt-system\n", 0o644, "root")},
                       {"GPUSANDBOX_OCI_RUNTIME": "@/rt-env"}, "rt-env"),
    "root-system": ("root", {"system": ("  runtime\t=  @/rt-system   # crun\n", 0o644, "root")},
                    {}, "rt-system"),
    "root-ignores-its-home": ("root", {"system": ("runtime = @/rt-system\n", 0o644, "root"),
                                       "user": ("runtime = @/rt-user\n", 0o644, "root")},
                              {}, "rt-system"),
    "root-system-open-to-others": ("root", {"system": ("runtime = @/rt-system\n", 0o666, "root")},
                                   {}, "mode 0666 lets others write to it"),
    "root-system-of-a-user": ("root", {"system": ("runtime = @/rt-system\n", 0o644, "user")},
                              {}, "not by root or you (uid 0)"),
    "root-relative": ("root", {"system": ("runtime = crun\n", 0o644, "root")},
                      {}, "not an absolute path"),
    "named-file": ("root", {"named": ("runtime = @/rt-named\n", 0o644, "root"),
                            "system": ("runtime = @/rt-system\n", 0o644, "root")},
                   {"GPUSANDBOX_OCI_CONF": "@/named.conf"}, "rt-named"),
    "named-file-old-variable": ("root", {"named": ("runtime = @/rt-named\n", 0o644, "root")},
                                {"GPUSANDBOX_OCI_CONFIG": "@/named.conf"}, "rt-named"),
    "named-file-missing": ("root", {"system": ("runtime = @/rt-system\n", 0o644, "root")},
                           {"GPUSANDBOX_OCI_CONF": "@/none.conf"}, "runc"),
    "user-home-first": ("user", {"system": ("runtime = @/rt-system\n", 0o644, "root"),
                                 "user": ("runtime = @/rt-user\n", 0o644, "user")},
                        {}, "rt-user"),
    "user-home-names-none": ("user", {"system": ("runtime = @/rt-system\n", 0o644, "root"),
                                      "user": ("driver-root = /x\n", 0o644, "user")},
                             {}, "rt-system"),
    "user-home-of-root": ("user", {"user": ("runtime = @/rt-user\n", 0o644, "root")},
                          {}, "rt-user"),
    "user-home-group-writable": ("user", {"user": ("runtime = @/rt-user\n", 0o664, "user")},
                                 {}, "mode 0664 lets others write to it"),
    "user-home-unreadable": ("user", {"user": ("runtime = @/rt-user\n", 0o000, "root")},
                             {}, "Permission denied"),
    "user-system": ("user", {"system": ("runtime = @/rt-system\n", 0o644, "root")},
                    {}, "rt-system"),
    "userns-home-and-system": ("userns", {"user": ("runtime = @/rt-user\n", 0o644, "user")},
                               {}, "rt-user"),
    "userns-system-shows-overflow-uid": ("userns",
                                         {"system": ("runtime = @/rt-system\n", 0o644, "root")},
                                         {}, "rt-system"),
}


@pytest.mark.parametrize("name", CASES)
def test_sh_entry_reads_runtime_as_settings_does(case, name):
    caller, files, env, want = CASES[name]
    for where, (text, mode, owner) in files.items():
        case.file(where, text, mode, owner)
    got, execs = case.run(caller, env)
    _same(got)
    if want.startswith("rt-") or want == "runc":
        assert got["sh.rc"] == "0\n", got
        if want == "runc":
            assert "runc version" in got["sh.out"]
        else:
            assert got["sh.out"] == f"{want} --version\n"
        assert not [e for e in execs if "python" in e], execs
    else:
        assert got["sh.rc"] == "1\n"
        assert want in got["sh.err"], got["sh.err"]
        assert got["sh.err"].startswith("gpusandbox-runtime: error: "), got["sh.err"]
