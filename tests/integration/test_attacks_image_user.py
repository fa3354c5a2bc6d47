"""An image's User never earns the host network (issue 23, item 4).

Under root a store image's (or a `pull -o` file's) User picks the command's
host uid.  In the host's network namespace that uid is what every daemon on
an abstract unix socket sees in SO_PEERCRED: a D-Bus session bus or an X11
server of that user would take the sandbox for its owner.  The stand-in
here is such a daemon, run by the attacker's account (gsbxatk), answering
its secret only to a peer with its own uid; the image names that uid.  Only
the caller's own uid (rootless) or one the caller names with --user keeps
the host's network by default; --net host is the explicit way in."""
import os
import shutil
import subprocess
import sys

import pytest

from .crossuser import ENV
from .test_images_local import _layout, gsbx, image_files, store  # noqa: F401

# Connects to the abstract socket named by argv[1] and prints the answer, or
# why it could not connect.  C, not Python: the store image is the small
# rootfs without an interpreter.
CLIENT_C = r"""
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t n = strlen(argv[1]);
    char buf[128];
    memcpy(a.sun_path + 1, argv[1], n);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(s, (struct sockaddr *)&a, offsetof(struct sockaddr_un, sun_path) + 1 + n)) {
        printf("connect %s\n", errno == ECONNREFUSED ? "ECONNREFUSED" : strerror(errno));
        return 0;
    }
    ssize_t r = read(s, buf, sizeof buf - 1);
    buf[r > 0 ? r : 0] = 0;
    fputs(buf, stdout);
    return 0;
}
"""

# The attacker's daemon: its secret to a peer of its own uid, nothing else.
DAEMON = r"""
import os, socket, struct, sys
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind("\0" + sys.argv[1])
srv.listen(8)
print("ready", flush=True)
while True:
    conn, _ = srv.accept()
    uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
    conn.sendall(b"secret-of-%d\n" % uid if uid == os.getuid() else b"denied uid=%d\n" % uid)
    conn.close()
"""


@pytest.fixture(scope="module")
def client(workdir_base):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (scripts/setup installs it)")
    src = workdir_base / "peercall.c"
    src.write_text(CLIENT_C)
    out = workdir_base / "peercall"
    subprocess.run(["gcc", "-O1", "-o", str(out), str(src)], check=True, capture_output=True)
    os.chmod(out, 0o755)
    return out


@pytest.fixture
def attacker_daemon(attack_user):
    """The abstract socket's name; the daemon runs as the attacker."""
    name = f"gsbx-test-session-bus-{os.getpid()}-{os.urandom(3).hex()}"
    proc = subprocess.Popen(["setpriv", f"--reuid={attack_user.pw_uid}",
                             f"--regid={attack_user.pw_gid}", "--clear-groups", "--",
                             sys.executable, "-c", DAEMON, name],
                            env=ENV, cwd="/", stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        yield name
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _image(shared_tmp, image_files, client, user):  # noqa: F811
    """An oci: reference of the small rootfs plus the client, with `user`."""
    return _layout(shared_tmp / "lay", image_files["base"],
                   [{"usr/": None, "usr/local/": None, "usr/local/bin/": None,
                     "usr/local/bin/peercall": client.read_bytes()}],
                   User=user, Entrypoint=["/usr/local/bin/peercall"])


def test_image_user_never_earns_the_host_network(runner, store, shared_tmp,  # noqa: F811
                                                 image_files, client, attacker_daemon,
                                                 attack_user):
    atk = f"{attack_user.pw_uid}:{attack_user.pw_gid}"
    ref = _image(shared_tmp, image_files, client, atk)
    r = gsbx(runner, store, ["run", ref, attacker_daemon])
    assert r.returncode == 0, r.stderr
    if runner.mode == "rootless":
        # The User is not applied: the caller's own uid, on the host's network.
        assert r.stdout == f"denied uid={runner.uid}\n", r.stdout
        return
    # Root: the image chose uid gsbxatk; the daemon of gsbxatk stays out of reach.
    assert r.stdout == "connect ECONNREFUSED\n", r.stdout
    assert r.stderr == ""
    r = gsbx(runner, store, ["run", "--verbose", ref, attacker_daemon])
    assert (f"network: private namespace, loopback only (the command's host uid "
            f"{attack_user.pw_uid} is the image's User") in r.stderr, r.stderr
    # The caller's explicit choices still reach the host's network.
    r = gsbx(runner, store, ["run", "--net", "host", ref, attacker_daemon])
    assert (r.returncode, r.stdout) == (0, f"secret-of-{attack_user.pw_uid}\n"), r.stderr
    r = gsbx(runner, store, ["run", "--user", atk, ref, attacker_daemon])
    assert (r.returncode, r.stdout) == (0, f"secret-of-{attack_user.pw_uid}\n"), r.stderr


def test_sqsh_image_user_gets_a_private_network(root_runner, shared_tmp, image_files,  # noqa: F811
                                                client, attacker_daemon, attack_user):
    """The same config carried in a `pull -o` file is worth the same."""
    if shutil.which("mksquashfs") is None:
        pytest.skip("mksquashfs is not installed (scripts/setup installs squashfs-tools)")
    st = shared_tmp / "store"
    ref = _image(shared_tmp, image_files, client, f"{attack_user.pw_uid}:{attack_user.pw_gid}")
    target = shared_tmp / "img.sqsh"
    r = gsbx(root_runner, st, ["pull", "-q", "-o", str(target), ref])
    assert r.returncode == 0, r.stderr
    r = gsbx(root_runner, st, ["run", "--no-require", str(target), attacker_daemon])
    assert (r.returncode, r.stdout, r.stderr) == (0, "connect ECONNREFUSED\n", ""), r
    # --verbose tells the reason of this identity, not of the uid 0 planned
    # before the file's config was read.
    r = gsbx(root_runner, st, ["run", "--no-require", "--verbose", str(target), attacker_daemon])
    nets = [ln for ln in r.stderr.splitlines() if ln.startswith("gpusandbox: network: ")]
    assert nets == [f"gpusandbox: network: private namespace, loopback only (the command's "
                    f"host uid {attack_user.pw_uid} is the image's User, not a uid you chose "
                    "with --user; --net host shares the host's)"], r.stderr
    r = gsbx(root_runner, st, ["run", "--no-require", "--net", "host", str(target),
                               attacker_daemon])
    assert (r.returncode, r.stdout) == (0, f"secret-of-{attack_user.pw_uid}\n"), r.stderr


def test_bundle_process_user_picks_no_host_uid(root_runner, small_rootfs, client,
                                               attacker_daemon, attack_user):
    """`run BUNDLE` takes env and cwd from config.json, never process.user:
    the command stays uid 0, with root's private network."""
    import json
    bundle = small_rootfs.parent / "bundle"
    bundle.mkdir()
    os.rename(small_rootfs, bundle / "rootfs")
    (bundle / "config.json").write_text(json.dumps({"process": {
        "user": {"uid": attack_user.pw_uid, "gid": attack_user.pw_gid}}}))
    r = root_runner.run(["-v", f"{client}:/peercall:ro", str(bundle), "sh", "-c",
                         f"id -u; /peercall {attacker_daemon}"])
    assert (r.returncode, r.stdout) == (0, "0\nconnect ECONNREFUSED\n"), r.stderr
