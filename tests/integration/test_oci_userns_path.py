"""gpusandbox-oci joins a user namespace given by path (issue 25, runc's
rule: a namespace with a path is joined, never made): the container's ids
are that namespace's maps; the config may repeat them, never differ.  Root
through the runtime CLI with a holder made by `unshare -U` whose maps root
writes; rootless, a user may join only a namespace it may enter.  Podman
as root with `--userns ns:/proc/PID/ns/user` of such a holder."""
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from .test_oci_ns import _as, _bundle, _conf, _oci, work  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


class Holder:
    """`unshare -U` holding a user namespace (and, with `more`, other
    namespaces made inside it), its maps written by root."""

    def __init__(self, maps=((0, 100000, 65536),), more=(), as_user=None):
        argv = ["unshare", "-U", *more, "sh", "-c", "read x; echo in; exec sleep 60"]
        if as_user is not None:
            argv = _as("rootless", as_user, argv)
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        if maps:
            time.sleep(0.2)
            line = "".join(f"{a} {b} {c}\n" for a, b, c in maps)
            for kind in ("uid", "gid"):
                with open(f"/proc/{self.pid}/{kind}_map", "w") as f:
                    f.write(line)
        self.p.stdin.write("go\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline() == "in\n"

    @property
    def pid(self):
        return self.p.pid

    def ns(self, t="user"):
        return f"/proc/{self.pid}/ns/{t}"

    def close(self):
        self.p.kill()
        self.p.wait()


@pytest.fixture
def holder():
    h = Holder()
    yield h
    h.close()


def _userns_conf(rootfs, script, path, **linux):
    conf = _conf(rootfs, script, ("pid", "ipc", "uts", "mount", "network"), **linux)
    conf["linux"]["namespaces"].append({"type": "user", "path": path})
    return conf


@pytest.mark.parametrize("readonly", [True, False])
def test_join_user_namespace_by_path(work, rootfs, holder, readonly):
    """The workload runs in the holder's user namespace (same inode), as its
    uid 0, which is host 100000: its maps are the holder's; the namespaces
    made for it (pid, mount, ...) belong to that user namespace, so the
    init could mount its root there."""
    script = ("readlink /proc/self/ns/user; id -u; cat /proc/self/uid_map; "
              "touch /dev/x && echo wrote")
    conf = _userns_conf(rootfs, script, holder.ns())
    conf["root"]["readonly"] = readonly
    name = f"join-user-{readonly}"
    b = _bundle(work, name, conf)
    os.chmod(b, 0o700)
    r = _oci(b, "run", "--bundle", str(b), name)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert out[0] == os.readlink(holder.ns())
    assert out[1:5] == ["0", "0", "100000", "65536"]
    assert out[-1] == "wrote"
    assert not os.listdir(b / "state")


def test_create_start_in_joined_user_namespace(work, rootfs, holder):
    """create/start/state/delete: the init is the runtime's caller's to
    wait for (create's own child until it exits), in the holder's user
    namespace, its processes host 100000."""
    name = "join-user-create"
    conf = _userns_conf(rootfs, "exec sleep 60", holder.ns())
    b = _bundle(work, name, conf)
    with open(b / "err", "w") as err:
        r = subprocess.run(["setsid", *_oci_argv(b), "create", "--bundle", str(b), name],
                           stdout=err, stderr=err, timeout=60, cwd="/",
                           stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (b / "err").read_text()
    try:
        st = json.loads(_oci(b, "state", name).stdout)
        assert st["status"] == "created"
        pid = st["pid"]
        assert os.readlink(f"/proc/{pid}/ns/user") == os.readlink(holder.ns())
        assert _oci(b, "start", name).returncode == 0
        status = open(f"/proc/{pid}/status").read()
        uid_line = [ln for ln in status.splitlines() if ln.startswith("Uid:")][0]
        assert uid_line.split()[1:] == ["100000"] * 4
    finally:
        r = _oci(b, "delete", "--force", name)
        assert r.returncode == 0, r.stderr


def _oci_argv(b):
    from .test_oci_ns import _rt
    return _rt(b)


def test_join_user_and_pid_namespaces_of_a_holder(work, rootfs):
    """A pid namespace owned by the joined user namespace (a pod's): both by
    path; the container sees the holder's sleep as its pid 1."""
    h = Holder(more=("--pid", "--fork", "--mount-proc"))
    try:
        inner = int(subprocess.run(["pgrep", "-P", str(h.pid)], capture_output=True,
                                   text=True).stdout.split()[0])
        conf = _userns_conf(rootfs, "cat /proc/1/comm; readlink /proc/self/ns/pid",
                            f"/proc/{inner}/ns/user")
        conf["linux"]["namespaces"] = [n for n in conf["linux"]["namespaces"]
                                       if n["type"] != "pid"]
        conf["linux"]["namespaces"].append({"type": "pid", "path": f"/proc/{inner}/ns/pid"})
        b = _bundle(work, "join-user-pid", conf)
        r = _oci(b, "run", "--bundle", str(b), "join-user-pid")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["sleep", os.readlink(f"/proc/{inner}/ns/pid")]
    finally:
        h.close()


def test_config_maps_of_a_joined_namespace_are_not_used(work, rootfs, holder):
    """The namespace's maps are the container's: a config that names others
    (podman --userns ns:PATH sends 0 0 1) changes nothing, as with runc."""
    rows = [{"containerID": 0, "hostID": 0, "size": 1}]
    conf = _userns_conf(rootfs, "id -u; cat /proc/self/uid_map", holder.ns(),
                        uidMappings=rows, gidMappings=rows)
    b = _bundle(work, "join-user-maps-ignored", conf)
    r = _oci(b, "run", "--bundle", str(b), "join-user-maps-ignored")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0", "100000", "65536"]


def test_join_user_namespace_without_maps(work, rootfs):
    h = Holder(maps=())
    try:
        conf = _userns_conf(rootfs, "true", h.ns())
        b = _bundle(work, "join-user-nomaps", conf)
        r = _oci(b, "run", "--bundle", str(b), "join-user-nomaps")
        assert r.returncode != 0
        assert "has no uid map yet" in r.stderr, r.stderr
        assert not os.listdir(b / "state")
    finally:
        h.close()


def test_rootless_joins_its_own_namespace_not_roots(work, rootfs, test_user, holder):
    """Rootless: a user may join a user namespace it made (it holds every
    capability there) and never one of root's (the holder's here): that one
    is refused with one line before anything is made."""
    conf = _userns_conf(rootfs, "true", holder.ns())
    b = _bundle(work, "join-user-rootless-root", conf, "rootless", test_user)
    r = _oci(b, "run", "--bundle", str(b), "join-user-rootless-root", mode="rootless",
             user=test_user)
    assert r.returncode != 0
    # (root's /proc/PID/ns is not even open to the user.)
    assert f"the user namespace {holder.ns()}: Permission denied" in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1
    assert not os.path.exists(b / "state") or not os.listdir(b / "state")
    own = Holder(maps=((0, test_user.pw_uid, 1),), as_user=test_user)
    try:
        conf = _userns_conf(rootfs, "readlink /proc/self/ns/user; id -u", own.ns())
        b = _bundle(work, "join-user-rootless-own", conf, "rootless", test_user)
        r = _oci(b, "run", "--bundle", str(b), "join-user-rootless-own", mode="rootless",
                 user=test_user)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [os.readlink(own.ns()), "0"]
    finally:
        own.close()


def test_exec_joins_a_host_namespace_of_a_userns_container(work, rootfs):
    """A container with a user namespace of its own whose network namespace
    is one root made outside it, by path (a pod's, crun's
    exec-root-netns-with-userns): `exec` joins that namespace before the
    container's user namespace, with its own capabilities (runc's two
    passes); joined after it, the kernel refuses (EPERM: the container's
    root holds no capability over a namespace of the host's user namespace)."""
    name = "userns-hostnet"
    holder = subprocess.Popen(["unshare", "--net", "sh", "-c", "echo in; exec sleep 60"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "in\n"
    net = f"/proc/{holder.pid}/ns/net"
    rows = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    conf = _conf(rootfs, "exec sleep 60", ("pid", "ipc", "uts", "mount", "user"),
                 uidMappings=rows, gidMappings=rows)
    conf["linux"]["namespaces"].append({"type": "network", "path": net})
    b = _bundle(work, name, conf)
    try:
        with open(b / "err", "w") as err:
            r = subprocess.run([*_oci_argv(b), "create", "--bundle", str(b), name], stdout=err,
                               stderr=err, timeout=60, cwd="/", stdin=subprocess.DEVNULL)
        assert r.returncode == 0, (b / "err").read_text()
        assert _oci(b, "start", name).returncode == 0
        r = _oci(b, "exec", name, "readlink", "/proc/self/ns/net")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == os.readlink(net)
    finally:
        _oci(b, "delete", "--force", name)
        holder.kill()
        holder.wait()


@pytest.fixture
def root_podman(cli, rootfs, test_user):
    """Root podman with a store of its own (test_oci_ns.Podman)."""
    from .test_oci_ns import Podman, with_image
    if not shutil.which("podman") or not shutil.which("conmon"):
        pytest.skip("podman and conmon are not installed")
    home = Path(tempfile.mkdtemp(prefix="gsbx-test-podman-userns-", dir="/tmp"))
    os.chmod(home, 0o755)
    tar = home / "rootfs.tar"
    # Without /tmp: podman's --tmpfs /tmp needs its mount point made in
    # podman's overlay root, a directory of host root's.
    subprocess.run(["tar", "-C", str(rootfs), "--exclude", "./tmp", "-cf", str(tar), "."],
                   check=True)
    pm = Podman("root", test_user, home, f"localhost/gsbx-userns-{os.getpid()}:1")
    yield from with_image(pm, tar, home)


@pytest.mark.parametrize("readonly", [False, True])
def test_podman_userns_ns_path(root_podman, holder, readonly):
    """podman as root, `--userns ns:/proc/PID/ns/user` of a holder mapping
    0 to host 100000: podman's overlay root (owned by host root, which the
    namespace does not map) gets its mount points and the workload runs as
    the namespace's 0, host 100000, able to write its /tmp."""
    from .test_oci_ns import RUN
    r = root_podman("run", "--rm", *RUN, *(["--read-only"] if readonly else []),
                    "--tmpfs", "/tmp",
                    "--userns", f"ns:{holder.ns()}", root_podman.image, "sh", "-c",
                    "readlink /proc/self/ns/user; id -u; cat /proc/self/uid_map; "
                    "touch /tmp/x && echo wrote")
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert out[0] == os.readlink(holder.ns())
    assert out[1:5] == ["0", "0", "100000", "65536"] and out[-1] == "wrote", r.stdout


def test_podman_userns_ns_path_exec_and_update(root_podman, holder):
    """The same container detached: `podman exec` enters the joined user
    namespace (its root, host 100000), and `podman update` changes its
    memory limit."""
    from .test_oci_ns import RUN
    pm = root_podman
    r = pm("run", "-d", *RUN, "--tmpfs", "/tmp", "--memory", "64m", "--userns",
           f"ns:{holder.ns()}", pm.image, "sleep", "60")
    assert r.returncode == 0, r.stderr
    cid = r.stdout.strip()
    try:
        mem = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
        if not os.path.exists("/sys/fs/cgroup/memory/memory.limit_in_bytes"):
            mem = "/sys/fs/cgroup/memory.max"       # a cgroup2-only host
        r = pm("exec", cid, "sh", "-c", f"readlink /proc/self/ns/user; id -u; cat {mem}; "
               "touch /tmp/y && echo wrote")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [os.readlink(holder.ns()), "0", str(64 << 20), "wrote"]
        assert pm("update", "--memory", "128m", cid).returncode == 0
        r = pm("exec", cid, "cat", mem)
        assert r.stdout.split() == [str(128 << 20)], r.stderr
    finally:
        assert pm("rm", "-f", "-t", "0", cid).returncode == 0
