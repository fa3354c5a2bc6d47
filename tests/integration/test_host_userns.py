"""The host uid under real user namespaces: bin/gpusandbox-oci's sh host_ids
(reading the kernel's uid_map and the euid of /proc/self/status, as the
entry does) and linux/host.host_uid give the same uid for every map and
inside uid, root writing maps of its choosing (and neither takes the
namespace for the initial one)."""
import subprocess
import sys

import pytest

from tests.unit.test_host import sh_function

from .oci_fixtures import PYTHON

# Forks a child into a new user namespace, writes `map` as its uid_map from
# outside (root may map any range), then the child takes `uid` inside it
# (it holds every capability there until it execs) and runs argv.
ENTER = r"""
import ctypes, os, sys
umap, uid, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
r, w = os.pipe()
r2, w2 = os.pipe()
pid = os.fork()
if pid == 0:
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
        os._exit(99)
    os.write(w, b"u")
    os.read(r2, 1)
    os.setresuid(uid, uid, uid)
    os.execvp(argv[0], argv)
os.read(r, 1)
with open(f"/proc/{pid}/uid_map", "w") as f:
    f.write(umap)
os.write(w2, b"g")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""
SH = sh_function("gpusandbox-oci", "host_ids") + """
while read -r k r e rest; do [ "$k" = Uid: ] && break; done < /proc/self/status
host_ids "$e" /proc/self/uid_map
echo "sh $uid ${initial:-0}"
exec "$PY" -I -c 'from gpusandbox.linux import host; print("py", host.host_uid(), int(host.initial_userns()))'
"""


@pytest.mark.parametrize("umap, inside, host_uid", [
    ("0 100000 65536", 0, 100000),
    ("0 100000 65536", 5, 100005),
    ("0 0 1\n1 200000 1000", 0, 0),
    ("0 0 1\n1 200000 1000", 7, 200006),
    ("1000 1000 1", 1000, 1000),
    ("0 4242 1\n5 300000 10", 9, 300004),
])
def test_sh_and_python_host_uid_in_a_user_namespace(cli, umap, inside, host_uid):
    r = subprocess.run([sys.executable, "-c", ENTER, umap + "\n", str(inside), "sh", "-c", SH],
                       env={"PATH": "/usr/bin:/bin", "PY": PYTHON}, capture_output=True,
                       text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"sh {host_uid} 0\npy {host_uid} 0\n"


def test_facts_as_root_of_a_users_namespace(cli, test_user):
    """Rootless podman's runtime: uid 0 of a namespace mapping only the user.
    Not real root; its host uid is the user's; the host's root shows as the
    overflow uid, which the owner checks take for root's."""
    code = ("from gpusandbox.linux import host; "
            "print(host.real_root(), host.host_uid(), host.root_uids(), host.setgroups_denied())")
    r = subprocess.run(["setpriv", f"--reuid={test_user.pw_uid}", f"--regid={test_user.pw_gid}",
                        "--clear-groups", "--", "unshare", "-U", "-r", PYTHON, "-I", "-c", code],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    overflow = int(open("/proc/sys/kernel/overflowuid").read())
    assert r.stdout == f"False {test_user.pw_uid} (0, {overflow}) True\n"
