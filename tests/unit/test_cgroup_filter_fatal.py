"""The device filter is a boundary, not a limit: every failure to put it in
force under root fails the launch, --best-effort-limits or not.

Runs the real _attach_bpf on the fake cgroup tree of test_cgroup, with the
bpf() calls replaced by a recorder that can fail at each step."""
import errno
import os

import pytest

from gpusandbox.errors import CgroupError
from gpusandbox.linux import bpfdev, cgroup
from gpusandbox.linux.cgroup import Limits

from .test_cgroup import FULL_CAPS, Fake


class Bpf:
    """bpf() as the kernel would answer, with one chosen failure."""

    def __init__(self, monkeypatch, parent, fail=None, above=()):
        self.parent = parent
        self.fail = fail
        self.above = list(above)      # program ids effective on the parent
        self.attached = []
        self.detached = []
        self.loaded_fds = []
        monkeypatch.setattr(bpfdev, "load", self.load)
        monkeypatch.setattr(bpfdev, "prog_id", lambda fd: 77)
        monkeypatch.setattr(bpfdev, "attach", self.attach)
        monkeypatch.setattr(bpfdev, "detach", lambda c, p: self.detached.append(p))
        monkeypatch.setattr(bpfdev, "query", self.query)

    def load(self, insns):
        if self.fail == "load":
            raise bpfdev.LoadError(errno.EINVAL, "0: (b7) r0 = 0\ninvalid insn\n")
        fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)   # a real fd for close()
        self.loaded_fds.append(fd)
        return fd

    def attach(self, cgfd, progfd, flags=bpfdev.BPF_F_ALLOW_MULTI):
        if self.fail == "attach":
            raise OSError(errno.EPERM, "BPF_PROG_ATTACH failed")
        self.attached.append(flags)

    def query(self, fd, effective=False):
        if self.fail == "not-in-force":
            return 0, []
        if os.readlink(f"/proc/self/fd/{fd}") == self.parent:
            return 0, list(self.above)        # the parent: what was in force before ours
        if not effective:
            return 0, [77]
        # An ancestor program attached with BPF_F_ALLOW_OVERRIDE yields to ours.
        return 0, [77] + ([] if self.fail == "override" else list(self.above))


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    f = Fake(tmp_path, monkeypatch)
    monkeypatch.setattr(cgroup, "_attach_bpf", _REAL_ATTACH)   # the Fake stubs it out
    f.set_proc(caps=FULL_CAPS)
    return f


_REAL_ATTACH = cgroup._attach_bpf


def _prepare(fake, **kw):
    return cgroup.prepare(proc=str(fake.proc), device_rules=[("c", 195, 0, "rw")], **kw)


def test_the_real_attach_path_works_on_the_fake(root, monkeypatch):
    bpf = Bpf(monkeypatch, str(root.cg))
    h = _prepare(root)
    assert h.filter == "bpf" and bpf.attached == [bpfdev.BPF_F_ALLOW_MULTI]
    h.teardown()
    assert bpf.detached and not os.path.exists(h.path)


@pytest.mark.parametrize("fail,what", [
    ("load", "device filter: the kernel refused the BPF program"),
    ("attach", "device filter: cannot attach to"),
    ("override", "would disable its device program(s) [5]"),
    ("not-in-force", "is not in force"),
])
@pytest.mark.parametrize("best_effort", [False, True])
def test_filter_failures_are_fatal_even_best_effort(root, monkeypatch, fail, what, best_effort):
    Bpf(monkeypatch, str(root.cg), fail=fail, above=[5])
    root.cgdir(root.cg, controllers="memory pids cpu", subtree="memory pids")
    with pytest.raises(CgroupError) as e:
        _prepare(root, limits=Limits(memory="1g"), best_effort=best_effort)
    assert what in e.value.line() and e.value.code == 125
    assert "continuing" not in e.value.line()
    assert root.leaves() == []          # nothing left behind: the leaf is removed


def test_best_effort_still_relaxes_limits_but_not_the_filter(root, monkeypatch):
    # A controller that cannot be had is dropped with a warning; the filter stays.
    bpf = Bpf(monkeypatch, str(root.cg))
    root.cgdir(root.cg, controllers="pids cpu", subtree="")
    h = _prepare(root, limits=Limits(memory="1g"), best_effort=True)
    assert h.filter == "bpf" and bpf.attached and any("continuing" in w for w in h.warnings)
    h.teardown()


def test_no_writable_cgroup_under_root_is_fatal_even_best_effort(root, monkeypatch):
    Bpf(monkeypatch, str(root.cg))
    root.unwritable = {str(root.cg), str(root.cg / "cgroup.procs")}
    for best_effort in (False, True):
        with pytest.raises(CgroupError) as e:
            _prepare(root, best_effort=best_effort)
        assert "device filter: no cgroup to attach it to" in e.value.line()


def test_no_cgroup2_and_no_v1_devices_is_fatal_even_best_effort(root, monkeypatch):
    root.mounts = []
    root.set_proc(caps=FULL_CAPS, v1=("memory",))
    with pytest.raises(CgroupError) as e:
        _prepare(root, best_effort=True)
    assert "device filter: cannot be applied" in e.value.line()
