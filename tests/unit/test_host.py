"""gpusandbox/linux/host.py: the host facts every part shares, and the sh
entry's copy of two of them (bin/gpusandbox-oci's host_ids) held to it."""
import os
import subprocess
from pathlib import Path

import pytest

from gpusandbox.linux import host
from gpusandbox.linux import sys as k

REPO = Path(__file__).resolve().parents[2]


def sh_function(script, name):
    """The text of sh function `name` of bin/SCRIPT (from `name() {` to the
    first line that is `}`)."""
    text = (REPO / "bin" / script).read_text()
    start = text.index(f"\n{name}() {{\n") + 1
    return text[start:text.index("\n}\n", start) + 3]


# uid_map contents as the kernel writes them (right-aligned columns).
MAPS = {
    "identity": "0 0 4294967295",
    "rootless podman": "0 {uid} 1\n1 100000 65536",
    "one id": "0 {uid} 1",
    "caller in the second range": "1 2000 10\n0 3000 1",
    "not covered": "1 2000 10",
    "padded": "{0:>10} {1:>10} {2:>10}".format(0, 4242, 1),
    "unreadable": None,
}


@pytest.mark.parametrize("name", MAPS)
def test_the_sh_host_ids_are_host_uid_and_initial_userns(tmp_path, name):
    (tmp_path / "self").mkdir()
    if MAPS[name] is not None:
        (tmp_path / "self" / "uid_map").write_text(
            MAPS[name].format(uid=os.geteuid() + 1000) + "\n")
    expect = f"{host.host_uid(str(tmp_path))} {'1' if host.initial_userns(str(tmp_path)) else ''}"
    code = sh_function("gpusandbox-oci", "host_ids") + \
        f'host_ids {os.geteuid()} {tmp_path}/self/uid_map; echo "$uid $initial"\n'
    out = subprocess.run(["sh", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == expect + "\n"
    if name == "unreadable":
        assert host.host_uid(str(tmp_path)) == os.geteuid()


def test_host_uid_cases(tmp_path):
    assert host.map_id(0, [["1", "2000", "10"], ["0", "3000", "1"]]) == 3000
    assert host.map_id(5, [["1", "2000", "10"]]) == 2004
    assert host.map_id(11, [["1", "2000", "10"]]) is None
    assert host.map_id(0, [["x", "y", "z"], ["0", "7", "1"]]) == 7


def test_one_namespace_table():
    assert k.CLONE_NEWNS == host.NS_FLAGS["mount"] == 0x00020000
    assert k.CLONE_NEWUSER == host.NS_FLAGS["user"] == 0x10000000
    # User first (its capabilities serve the other joins), mount last (it
    # changes root and cwd).
    assert [t for t, _, _ in host.NAMESPACES][0] == "user"
    assert [t for t, _, _ in host.NAMESPACES][-1] == "mount"
    assert set(host.NS_PROC.values()) <= set(os.listdir("/proc/self/ns"))


def test_open_ns_skips_the_callers_own_and_join_ns_orders(monkeypatch):
    assert host.open_ns("self") == []
    fds = host.open_ns(os.getpid(), ("mount", "user"), skip_own=False)
    try:
        assert [t for t, _ in fds] == ["mount", "user"]
        calls = []
        monkeypatch.setattr(k, "syscall", lambda *a: calls.append(a))
        host.join_ns(fds)
        assert calls == [("setns", fds[1][1], k.CLONE_NEWUSER), ("setns", fds[0][1], k.CLONE_NEWNS)]

        def refuse(name, fd, flag):
            raise OSError(1, "Operation not permitted")
        monkeypatch.setattr(k, "syscall", refuse)
        with pytest.raises(host.NamespaceError) as e:
            host.join_ns(fds)
        assert (e.value.ns, e.value.errno) == ("user", 1)
    finally:
        host.close_ns(fds)
    with pytest.raises(host.NamespaceError) as e:
        host.open_ns(999999999, ("ipc",))
    assert e.value.ns == "ipc"


def test_setgroups_and_gid_map_facts():
    assert host.setgroups_denied(999999999) is False
    assert host.gid_mapped(os.getegid())
