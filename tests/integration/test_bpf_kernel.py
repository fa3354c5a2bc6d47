"""The cgroup layer against the real kernel (root only).

A child is cloned straight into the leaf (clone3 CLONE_INTO_CGROUP, as the
launcher does) and tries device nodes made with mknod in a temporary
directory; the same tries from outside the leaf are the control, so every
EPERM seen inside is the filter's doing."""
import errno
import json
import os
import subprocess
import sys
import time

import pytest

from gpusandbox.errors import CgroupError
from gpusandbox.linux import bpfdev, cgempty, cgroup
from gpusandbox.linux import sys as k

PREFIX = "gpsbtest"      # keeps these leaves apart from real launches'


def _cgroup2():
    try:
        return cgroup._cgroup2(cgroup._mounts("/proc"))
    except OSError:
        return None


def _bpf_ok():
    try:
        os.close(bpfdev.load(bpfdev.assemble(bpfdev.DEFAULT_RULES)))
        return True
    except OSError:
        return False


pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: bpf() and cgroupfs writes"),
    pytest.mark.skipif(_cgroup2() is None, reason="no cgroup2 mount on this host"),
]
needs_bpf = pytest.mark.skipif(os.geteuid() != 0 or not _bpf_ok(),
                               reason="the kernel refuses BPF_PROG_TYPE_CGROUP_DEVICE programs")
MOUNT = (_cgroup2() or ("/nonexistent",))[0]
GPU_RULES = [("c", 195, 0, "rw"), ("c", 195, 255, "rw")]


@pytest.fixture
def nodes(tmp_path):
    made = {}
    for name, kind, major, minor in (("gpu0", "c", 195, 0), ("gpu2", "c", 195, 2),
                                     ("loop0", "b", 7, 0)):
        mode = 0o600 | (0o020000 if kind == "c" else 0o060000)
        os.mknod(tmp_path / name, mode, os.makedev(major, minor))
        made[name] = str(tmp_path / name)
    made["null"] = "/dev/null"
    made["dir"] = str(tmp_path)
    yield made
    for name in ("gpu0", "gpu2", "loop0"):     # no device nodes left in pytest's tmp dirs
        os.unlink(made[name])


def _tries(nodes):
    """errno of each try (0 = success)."""
    out = {}
    for name in ("gpu0", "gpu2", "loop0", "null"):
        try:
            os.close(os.open(nodes[name], os.O_RDONLY | os.O_NONBLOCK))
            out[name] = 0
        except OSError as e:
            out[name] = e.errno
    for name, kind, dev in (("mknod_gpu3", 0o020000, os.makedev(195, 3)),
                            ("mknod_gpu0", 0o020000, os.makedev(195, 0)),
                            ("mknod_null", 0o020000, os.makedev(1, 3)),
                            ("mknod_sda", 0o060000, os.makedev(8, 0))):
        path = os.path.join(nodes["dir"], name)
        try:
            os.mknod(path, 0o600 | kind, dev)
            os.unlink(path)
            out[name] = 0
        except OSError as e:
            out[name] = e.errno
    return out


def _result(r, pid):
    """The child's JSON answer from pipe end r, once the child is reaped."""
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data)


def _tries_in(h, nodes):
    r, w = os.pipe()
    pid = k.clone_fork(0, h.dirfd)
    if pid == 0:
        try:
            os.close(r)
            os.write(w, json.dumps(_tries(nodes)).encode())
        finally:
            os._exit(0)
    os.close(w)
    return _result(r, pid)


def _tries_joined(h, nodes):
    """Fork, let the parent join the child (v1 has no CLONE_INTO_CGROUP),
    then try the nodes."""
    go_r, go_w = os.pipe()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.close(go_w)
            os.read(go_r, 1)
            os.write(w, json.dumps(_tries(nodes)).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.close(go_r)
    h.join(pid)
    os.write(go_w, b"x")
    os.close(go_w)
    return _result(r, pid)


def _mycgroup(name):
    path = os.path.join(MOUNT, name)
    os.mkdir(path)
    return path


@needs_bpf
def test_filter_in_the_kernel(nodes):
    outside = _tries(nodes)
    assert outside == {"gpu0": errno.ENXIO, "gpu2": errno.ENXIO, "loop0": 0, "null": 0,
                       "mknod_gpu3": 0, "mknod_gpu0": 0, "mknod_null": 0, "mknod_sda": 0}
    h = cgroup.prepare(device_rules=GPU_RULES, name_prefix=PREFIX)
    try:
        assert h.filter == "bpf" and h.dirfd >= 0 and os.path.dirname(h.path) != ""
        assert f"device filter: BPF program id {h.prog_id} attached" in h.notes[-1]
        assert bpfdev.query(h._fd)[1] == [h.prog_id]
        assert h.prog_id in bpfdev.query(h._fd, effective=True)[1]
        inside = _tries_in(h, nodes)
        assert inside == {"gpu0": errno.ENXIO,      # allowed: reaches the (absent) driver
                          "gpu2": errno.EPERM,      # another GPU
                          "loop0": errno.EPERM,     # every block device
                          "null": 0,
                          "mknod_gpu3": errno.EPERM,
                          "mknod_gpu0": errno.EPERM,   # its rule grants rw, not m
                          "mknod_null": 0,          # default nodes carry 'm'
                          "mknod_sda": errno.EPERM}
    finally:
        h.teardown()
    assert not os.path.exists(h.path) and h.notes[-1].startswith("device filter")
    deadline = time.monotonic() + 2
    while bpfdev.prog_alive(h.prog_id) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not bpfdev.prog_alive(h.prog_id), "program still loaded after teardown"


@needs_bpf
def test_a_parents_program_still_applies(nodes):
    parent = _mycgroup(f"{PREFIX}parent-{os.getpid()}")
    deny_null = bpfdev.load(bpfdev.assemble([("c", 1, 5, "rwm"), ("c", 195, None, "rw"),
                                             ("b", None, None, "rw")]))
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        bpfdev.attach(pfd, deny_null, bpfdev.BPF_F_ALLOW_MULTI)
        h = cgroup.prepare(parent=parent, device_rules=GPU_RULES, name_prefix=PREFIX)
        try:
            inside = _tries_in(h, nodes)
            # ours would allow /dev/null; the parent's denies it, and both must allow
            assert inside["null"] == errno.EPERM and inside["gpu0"] == errno.ENXIO
            assert inside["loop0"] == errno.EPERM
        finally:
            h.teardown()
        bpfdev.detach(pfd, deny_null)
        # An OVERRIDE program above would be silently replaced by ours: refused.
        bpfdev.attach(pfd, deny_null, bpfdev.BPF_F_ALLOW_OVERRIDE)
        with pytest.raises(CgroupError) as e:
            cgroup.prepare(parent=parent, name_prefix=PREFIX)
        assert "would disable its device program" in e.value.what
        assert [n for n in os.listdir(parent) if n.startswith(PREFIX)] == []
        bpfdev.detach(pfd, deny_null)
    finally:
        os.close(pfd)
        os.close(deny_null)
        os.rmdir(parent)


@needs_bpf
def test_kernel_releases_the_program_of_a_removed_cgroup():
    path = _mycgroup(f"{PREFIX}-release-{os.getpid()}")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    prog = bpfdev.load(bpfdev.assemble(bpfdev.DEFAULT_RULES))
    ident = bpfdev.prog_id(prog)
    bpfdev.attach(fd, prog)
    os.close(prog)
    os.close(fd)
    assert bpfdev.prog_alive(ident)       # the attachment holds it
    os.rmdir(path)
    deadline = time.monotonic() + 5
    while bpfdev.prog_alive(ident) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not bpfdev.prog_alive(ident)


@needs_bpf
def test_license_need_not_be_gpl():
    assert bpfdev.LICENSE != b"GPL"
    fd = bpfdev.load(bpfdev.assemble(list(bpfdev.DEFAULT_RULES) + GPU_RULES))
    os.close(fd)


@needs_bpf
def test_verifier_log_reaches_the_error(monkeypatch):
    # No exit at the end: the verifier refuses it and says why.
    bad = [(bpfdev.MOV64_K, 0, 0, 0, 1)]
    monkeypatch.setattr(bpfdev, "assemble", lambda rules: bad)
    with pytest.raises(CgroupError) as e:
        cgroup.prepare(name_prefix=PREFIX)
    assert "refused the BPF program" in e.value.what and "verifier log:" in e.value.hint
    assert "processed" in e.value.log or "jump" in e.value.log or "exit" in e.value.log
    assert [n for n in os.listdir(MOUNT) if n.startswith(f"{PREFIX}-{os.getpid()}-")] == []


def test_v1_devices_fallback_without_cgroup2(tmp_path, nodes):
    """A proc view with no cgroup2 mount: the real v1 devices hierarchy
    carries the same rule list."""
    mounts = cgroup._mounts("/proc")
    v1 = [m for m in mounts if m[2] == "cgroup" and "devices" in m[3]]
    own = next((p for c, p in cgroup._own_cgroups("/proc").items() if "devices" in c.split(",")), None)
    if not v1 or own is None:
        pytest.skip("no cgroup v1 devices hierarchy on this host")
    fake = tmp_path / "proc"
    (fake / "self").mkdir(parents=True)
    lines = [ln for ln in open("/proc/self/mountinfo") if " - cgroup2 " not in ln]
    (fake / "self" / "mountinfo").write_text("".join(lines))
    (fake / "self" / "cgroup").write_text(f"5:devices:{own}\n")
    for name in ("status", "uid_map"):
        (fake / "self" / name).write_text(open(f"/proc/self/{name}").read())
    h = cgroup.prepare(device_rules=GPU_RULES, name_prefix=f"{PREFIX}v{os.getpid()}", proc=str(fake))
    try:
        assert h.filter == "v1" and h.dirfd == -1 and h.path.startswith(v1[0][0])
        assert "c 195:0 rw" in open(f"{h.path}/devices.list").read().splitlines()
        inside = _tries_joined(h, nodes)
        assert inside["gpu0"] == errno.ENXIO and inside["null"] == 0
        assert inside["gpu2"] == errno.EPERM and inside["loop0"] == errno.EPERM
        assert inside["mknod_sda"] == errno.EPERM and inside["mknod_gpu0"] == errno.EPERM
    finally:
        h.teardown()
    assert not os.path.exists(h.path)


def _sleeper_in(h):
    p = subprocess.Popen(["sleep", "100"])
    h.join(p.pid)
    assert str(p.pid) in open(f"{h.path}/cgroup.procs").read().split()
    return p


def test_teardown_kills_and_removes():
    h = cgroup.prepare(name_prefix=PREFIX)
    p = _sleeper_in(h)
    h.teardown()
    assert p.wait(timeout=5) == -9 and not os.path.exists(h.path)


def test_kill_without_cgroup_kill_file():
    h = cgroup.prepare(name_prefix=PREFIX)
    try:
        p = _sleeper_in(h)
        cgempty._kill_listed(h.path)
        assert p.wait(timeout=5) == -9
    finally:
        h.teardown()
    assert not os.path.exists(h.path)


def test_stale_leaves_are_cleaned_by_the_next_prepare():
    prefix = f"{PREFIX}s{os.getpid()}"           # no other test process cleans these
    gone = subprocess.Popen(["true"])
    gone.wait()                                   # a launcher pid that is dead now
    stale = _mycgroup(f"{prefix}-{gone.pid}-abcd")
    busy = _mycgroup(f"{prefix}-{gone.pid}-beef")
    foreign = _mycgroup(f"{prefix}x-{gone.pid}-abcd")
    sleeper = subprocess.Popen(["sleep", "100"])
    try:
        with open(f"{busy}/cgroup.procs", "w") as f:
            f.write(str(sleeper.pid))
        h = cgroup.prepare(name_prefix=prefix)
        h.teardown()
        assert not os.path.exists(stale) and f"cgroup: removed stale {stale}" in h.notes
        assert os.path.exists(busy) and os.path.exists(foreign)
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in (stale, busy, foreign):
            for _ in range(100):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def test_limits_on_this_host_go_to_v1_leaves():
    """A controller bound to cgroup v1 gets a v1 leaf (under a parent of the
    test's, never the cgroups the test runner sits in); the leaf goes with
    teardown."""
    bound = cgroup._v1_bound("/proc")
    if "memory" not in bound or not os.path.isdir("/sys/fs/cgroup/memory"):
        pytest.skip("the memory controller is not bound to cgroup v1 at /sys/fs/cgroup/memory")
    name = f"{PREFIX}-parent-{os.getpid()}"
    made = [os.path.join(d, name) for d in (MOUNT, "/sys/fs/cgroup/memory")]
    for d in made:
        os.mkdir(d)
    try:
        h = cgroup.prepare(parent=f"/{name}", limits=cgroup.Limits(memory="512m"),
                           name_prefix=PREFIX)
        try:
            assert h.v1 == [f"/sys/fs/cgroup/memory/{name}/{os.path.basename(h.path)}"]
            with open(f"{h.v1[0]}/memory.limit_in_bytes") as f:
                assert f.read().strip() == str(512 << 20)
        finally:
            h.teardown()
        assert not [n for d in made for n in os.listdir(d) if n.startswith(PREFIX)]
    finally:
        for d in made:
            os.rmdir(d)


_ROOTLESS = """
import json, os
from gpusandbox.errors import CgroupError
from gpusandbox.linux import cgroup
h = cgroup.prepare(name_prefix=%r)
out = {"path": h.path, "dirfd": h.dirfd, "filter": h.filter, "notes": h.notes}
h.teardown()
try:
    cgroup.prepare(limits=cgroup.Limits(pids="10"), name_prefix=%r)
except CgroupError as e:
    out["error"] = [e.line(), e.code]
print(json.dumps(out))
""" % (PREFIX, PREFIX)


def test_rootless_on_an_undelegated_hierarchy():
    parent = cgroup._resolve_parent(MOUNT, _cgroup2()[1], cgroup._own_cgroups("/proc")[""], None)
    if os.stat(f"{parent}/cgroup.procs").st_uid == 65534:
        pytest.skip("the launcher's cgroup is delegated to nobody here")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", _ROOTLESS], cwd=root, user=65534, group=65534,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["path"] is None and out["dirfd"] == -1 and out["filter"] is None
    assert out["notes"][0].startswith("cgroup: none (") and "not writable by uid 65534" in out["notes"][0]
    assert out["notes"][1].startswith("device filter: not applied (rootless")
    assert out["error"][1] == 125 and "--pids-limit" in out["error"][0]
