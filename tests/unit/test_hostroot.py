"""The host's root as the image: which homes are hidden and which host
sockets are covered (gpusandbox/hostroot.py), without privileges."""
import os
import shutil
import socket
import tempfile

import pytest

from gpusandbox import hostroot


def test_homes_parents_first_and_only_real_homes():
    if not (os.path.isdir("/home") and os.path.isdir("/root")):
        pytest.skip("this host has no /home or /root")
    home = "/home/gsbx-unit-no-such-user"      # made inside the /home tmpfs
    got = hostroot.hidden_homes(home, "/root")
    assert got == [("/home", False), ("/root", False), (home, True)]
    # `/`, top-level system directories, homes the host lacks outside a
    # hidden one, and homes on the sandbox's own filesystems are not hidden.
    for odd in ("/", "/nonexistent", "/var", "/var/lib/gsbx-no-such-home", "/tmp/x", "/run/u"):
        assert [p for p, _ in hostroot.hidden_homes(odd, None)] == ["/home", "/root"], odd


@pytest.fixture
def sock_dir():
    d = tempfile.mkdtemp(prefix="gsbx-unit-sock-", dir="/var/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_host_sockets_from_the_kernel_table_and_ssh_auth_sock(sock_dir, tmp_path):
    socks = []
    for name in ("bound", "agent"):
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.path.join(sock_dir, name))
        socks.append(s)
    plain = os.path.join(sock_dir, "plain")
    open(plain, "w").close()
    table = tmp_path / "unix"
    table.write_text(
        "Num       RefCount Protocol Flags    Type St Inode Path\n"
        f"0000: 00000002 00000000 00010000 0001 01 1 {sock_dir}/bound\n"
        "0000: 00000002 00000000 00010000 0001 01 2 @abstract\n"
        "0000: 00000002 00000000 00010000 0001 01 3 /run/under-fresh-run\n"
        f"0000: 00000002 00000000 00010000 0001 01 4 {sock_dir}/gone\n"
        f"0000: 00000002 00000000 00010000 0001 01 5 {plain}\n"
        "0000: 00000002 00000000 00010000 0001 01 6\n")
    try:
        got = hostroot.host_sockets([], {"SSH_AUTH_SOCK": f"{sock_dir}/agent"}, str(table))
        assert got == sorted([f"{sock_dir}/agent", f"{sock_dir}/bound"])
        # Under a hidden home: already out of sight.
        assert hostroot.host_sockets([sock_dir], {}, str(table)) == []
    finally:
        for s in socks:
            s.close()
