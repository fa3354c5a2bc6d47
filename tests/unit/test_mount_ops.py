"""Mounts as data (edits.MountOp, gpusandbox/edits.py): every door's mount requests become
one ordered list of MountOps in the plan, which one executor applies
(stages/mountexec.py, the init's and the OCI hook's).  The executor is run
here against a recording double of the kernel's mount calls: what it
clones on the host side, and what it attaches where, in which order."""
import json
import os
import stat

import pytest

from gpusandbox import edits
from gpusandbox import plan as planmod
from gpusandbox.cli import parse_run_args
from gpusandbox.edits import ContainerEdits, DeviceNode, File, Mount, Symlink, Tmpfs
from gpusandbox.oci import config as oc
from gpusandbox.spec import Bind
from gpusandbox.spec import Tmpfs as SpecTmpfs
from gpusandbox.stages import mountexec
from gpusandbox.stages.mountexec import KERNEL
from gpusandbox.stages.mountexec import Kernel as RealKernel


def _edits(tmp_path):
    e = ContainerEdits()
    e.tmpfs.append(Tmpfs("/proc/driver/nvidia"))
    e.device_nodes.append(DeviceNode("/dev/nvidia0", "/dev/null", 1, 3))
    e.mounts.append(Mount(str(tmp_path), "/usr/lib/x/libcuda.so.1"))
    e.mounts.append(Mount(str(tmp_path), "/run/nvidia-persistenced", ("rw", "nosuid")))
    e.symlinks += [Symlink("/usr/lib/x/libcuda.so", "libcuda.so.1"),
                   Symlink("/run/gpusandbox/lib/a.so", "a.so.1")]
    e.files.append(File("/etc/ld.so.cache", b"cache"))
    return e


def test_edits_become_ops_in_the_documented_order(tmp_path):
    ops = edits.from_edits(_edits(tmp_path))
    assert [(o.op, o.path) for o in ops] == [
        ("fs", "/proc/driver/nvidia"), ("node", "/dev/nvidia0"),
        ("bind", "/usr/lib/x/libcuda.so.1"), ("bind", "/run/nvidia-persistenced"),
        ("symlink", "/usr/lib/x/libcuda.so"), ("symlink", "/run/gpusandbox/lib/a.so"),
        ("file", "/etc/ld.so.cache"), ("seal", "/proc/driver/nvidia")]
    lib, sock = ops[2], ops[3]
    assert (lib.ro, lib.nosuid, lib.nodev, lib.kind, lib.recursive) == \
        (True, True, True, "dir", False)
    assert (sock.ro, sock.nosuid, sock.nodev) == (False, True, False)
    assert all(o.create for o in ops)


def test_a_kept_image_gets_nothing_created_outside_our_filesystems(tmp_path):
    """--rw, the host's root (plan.keep_image): targets outside /proc, /sys,
    /dev, /tmp and /run must exist; links there are left out."""
    ops = edits.from_edits(_edits(tmp_path), keep_image=True)
    assert {o.path: o.create for o in ops if o.op != "symlink"} == {
        "/proc/driver/nvidia": True, "/dev/nvidia0": True, "/usr/lib/x/libcuda.so.1": False,
        "/run/nvidia-persistenced": True, "/etc/ld.so.cache": False}
    assert [o.path for o in ops if o.op == "symlink"] == ["/run/gpusandbox/lib/a.so"]


def test_binds_keep_their_order_and_are_nosuid_nodev(tmp_path):
    ops = edits.from_binds([Bind(str(tmp_path), "/a", False, "dir"),
                               SpecTmpfs("/a/t", size=4096, mode=0o700),
                               Bind(str(tmp_path), "/b", True, "dir")])
    assert [(o.op, o.path, o.ro, o.nosuid, o.nodev) for o in ops] == [
        ("bind", "/a", True, True, True), ("fs", "/a/t", False, True, True),
        ("bind", "/b", False, True, True)]
    assert ops[0].recursive and ops[1].data == ("source=tmpfs", "mode=700", "size=4096")


def test_run_plans_one_list_edits_then_binds(tmp_path):
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    src = tmp_path / "data"
    src.mkdir()
    p = planmod.build(parse_run_args(["-v", f"{src}:/data", "--mount",
                                      "type=tmpfs,dst=/scratch", str(root), "true"]), {})
    assert [(o.op, o.path) for o in p.mounts] == [("bind", "/data"), ("fs", "/scratch")]
    assert ("/data", "dir") in p.points and ("/scratch", "dir") in p.points
    assert p.run_tmpfs is None and not any(o.op == "sysfs" for o in p.mounts)


def _oci(tmp_path, mounts, **linux):
    (tmp_path / "rootfs" / "bin").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    conf = {"ociVersion": "1.0.2", "process": {"args": ["sh"], "cwd": "/"},
            "root": {"path": "rootfs"}, "mounts": mounts,
            "linux": dict({"namespaces": [{"type": t} for t in ("pid", "mount", "user")],
                           "uidMappings": [{"containerID": 0, "hostID": 0, "size": 1}],
                           "gidMappings": [{"containerID": 0, "hostID": 0, "size": 1}]},
                          **linux)}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    spec = oc.load(str(tmp_path), {})
    return planmod.build(spec, spec.oci.plan_env)


MQ = {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"}
SYS = {"destination": "/sys", "type": "sysfs", "source": "sysfs"}


def test_an_oci_configs_mounts_in_its_order_with_sys_where_it_lists_it(tmp_path):
    p = _oci(tmp_path, [MQ, SYS, {"destination": "/src", "type": "bind", "source": "src",
                                  "options": ["rbind", "ro"]},
                        {"destination": "/run", "type": "tmpfs", "source": "tmpfs",
                         "options": ["nosuid", "size=64k"]}])
    assert [(o.op, o.path) for o in p.mounts] == [
        ("fs", "/dev/mqueue"), ("sysfs", "/sys"), ("bind", "/src")]
    # The config's /run tmpfs is the init's own /run, with its options.
    assert p.run_tmpfs.data == ("source=tmpfs", "size=64k") and p.run_tmpfs.nosuid
    assert (p.sysctl, p.domainname, p.hooks, p.hook_state) == ([], None, {}, None)


def test_sys_goes_first_when_a_mount_before_it_is_under_it(tmp_path):
    p = _oci(tmp_path, [{"destination": "/sys/x", "type": "bind", "source": "src"}, SYS])
    assert [(o.op, o.path) for o in p.mounts] == [("bind", "/sys/x")]


# --- the executor, against a recording double of the kernel's mount calls ----------

class Kernel(RealKernel):
    """The kernel interface (mountexec.Kernel) with its mount calls recorded
    and every detached mount a descriptor of the test's root; files are the
    real kernel's, in that root."""

    def __init__(self, root):
        self.calls = []
        self.root = root

    def _fd(self, what):
        self.calls.append(what)
        return os.open(self.root, os.O_PATH | os.O_CLOEXEC)

    def clone_tree(self, source, recursive=True, dirfd=-100):
        return self._fd(("clone", source, recursive))

    def clone_source(self, path, ident=None):
        return self._fd(("clone-checked", path, ident))

    def open_host_node(self, path, major, minor):
        return self._fd(("node", path, major, minor))

    def new_fs(self, fstype, options, attrs):
        return self._fd(("new", fstype, tuple(options), attrs))

    def open_target(self, rootfd, path, kind="dir", create=True, strict=False):
        d = os.path.join(self.root, path.lstrip("/"))
        os.makedirs(d, exist_ok=True)
        return os.open(d, os.O_PATH | os.O_CLOEXEC)

    def restrict(self, fd, ro=True, nosuid=True, nodev=True, noexec=False, recursive=True):
        self.calls.append(("restrict", ro, nosuid, nodev, noexec, recursive))

    def attach(self, fd, target, what):
        os.close(fd)
        os.close(target)
        self.calls.append(("attach", what))

    def mount_setattr(self, fd, attrs, recursive):
        self.calls.append(("setattr", attrs, recursive))


def test_the_executor_clones_host_sources_first_then_applies_in_order(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    kern = Kernel(str(root))
    ops = edits.from_edits(_edits(tmp_path)) + \
        edits.from_binds([Bind(str(tmp_path), "/data", True, "dir")])
    ops.insert(3, edits.MountOp("sysfs", "/sys"))
    fds = mountexec.open_sources(ops, kern)
    # Host side: only binds and nodes, each cloned (the edits' non-recursively).
    assert kern.calls == [("node", "/dev/null", 1, 3), ("clone", "", False),
                          ("clone", str(tmp_path), False), ("clone", str(tmp_path), False),
                          ("clone", str(tmp_path), True)]
    assert [fd is not None for fd in fds] == [False, True, True, False, True, False, False,
                                              False, False, True]
    kern.calls.clear()
    sysfs = []
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    mountexec.apply(ops, rootfd, fds, lambda: sysfs.append(len(kern.calls)), kern)
    attached = [c[1] for c in kern.calls if c[0] == "attach"]
    assert attached == [
        "mounting tmpfs at /proc/driver/nvidia", "binding device /dev/null",
        f"binding {tmp_path} at /usr/lib/x/libcuda.so.1",
        f"binding {tmp_path} at /run/nvidia-persistenced",
        "placing /etc/ld.so.cache", f"binding {tmp_path} at /data"]
    # /sys where the op list has it: after the first library, before the socket.
    assert sysfs == [kern.calls.index(("attach", attached[2])) + 1]
    # The links, made in the root; the mask sealed read-only after its content.
    assert os.readlink(root / "usr/lib/x/libcuda.so") == "libcuda.so.1"
    assert os.readlink(root / "run/gpusandbox/lib/a.so") == "a.so.1"
    assert kern.calls[-3][0] == "setattr" and kern.calls[-3][1:] == (1, False)
    # The generated file went through one staging tmpfs, read-only.
    assert ("new", "tmpfs", ("mode=0755", "size=16m"), 14) in kern.calls
    assert ("restrict", True, True, True, True, True) in kern.calls
    # -v: nosuid, nodev, recursive.
    assert kern.calls[-2] == ("restrict", False, True, True, False, True)


def test_a_symlink_already_right_is_kept_and_a_wrong_one_replaced(tmp_path):
    """The real kernel: no mount is made for links."""
    root = tmp_path / "root"
    (root / "l").mkdir(parents=True)
    os.symlink("right", root / "l" / "a")
    os.symlink("wrong", root / "l" / "b")
    (root / "l" / "c").write_text("a file of the image")
    ops = [edits.MountOp("symlink", f"/l/{n}", "file", target="right") for n in "abc"]
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    before = os.lstat(root / "l" / "a").st_ino
    mountexec.apply(ops, rootfd, mountexec.open_sources(ops, KERNEL), kern=KERNEL)
    assert [os.readlink(root / "l" / n) for n in "abc"] == ["right"] * 3
    assert os.lstat(root / "l" / "a").st_ino == before


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs CAP_MKNOD")
def test_mknod_replaces_what_is_there_and_sets_owner_and_mode(tmp_path):
    root = tmp_path / "root"
    (root / "dev").mkdir(parents=True)
    (root / "dev" / "zz").write_text("not a node")
    ops = edits.devices([("/dev/zz", stat.S_IFCHR, 1, 5, 0o640, 7, 8)])
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    mountexec.apply(ops, rootfd, mountexec.open_sources(ops))
    st = os.lstat(root / "dev" / "zz")
    assert (stat.S_ISCHR(st.st_mode), st.st_rdev, stat.S_IMODE(st.st_mode), st.st_uid,
            st.st_gid) == (True, os.makedev(1, 5), 0o640, 7, 8)


def test_a_run_of_links_in_one_directory_resolves_it_once_a_mount_between_again(tmp_path):
    """A driver's sonames are a run of links in one directory: it is
    resolved in the root once for the run.  A mount made between two links
    may cover that directory: the next link resolves it again, and lands on
    what is mounted there."""
    root = tmp_path / "root"
    root.mkdir()
    opened = []

    class Counting(Kernel):
        def open_target(self, rootfd, path, kind="dir", create=True, strict=False):
            opened.append(path)
            return super().open_target(rootfd, path, kind, create, strict)
    kern = Counting(str(root))
    ops = [edits.MountOp("symlink", f"/l/{n}", "file", target=n + ".1") for n in "abc"]
    ops += [edits.MountOp("fs", "/m", "dir", fstype="tmpfs", data=()),
            edits.MountOp("symlink", "/l/d", "file", target="d.1"),
            edits.MountOp("symlink", "/k/e", "file", target="e.1")]
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        mountexec.apply(ops, rootfd, mountexec.open_sources(ops, kern), kern=kern)
    finally:
        os.close(rootfd)
    assert opened == ["/l", "/m", "/l", "/k"]
    assert [os.readlink(root / "l" / n) for n in "abcd"] == ["a.1", "b.1", "c.1", "d.1"]
    assert os.readlink(root / "k" / "e") == "e.1"
