"""The fast no-leaf decision (cgplace.without_leaf, what stages/parent.py
asks first for a launch without limits) and the full cgroup.prepare() agree:
on every fake layout either both make no leaf, with the same notes, the same
lines shown as they come (-v) and the same handle, or both raise the same
error, or the fast path hands over (None) and prepare() makes a leaf.  A
rootless launch that gets no leaf then loads neither cgroup.py nor cgfs.py
(tests/integration/test_launch_imports.py counts it on a real launch)."""
import os
import subprocess
import sys

import pytest

from gpusandbox.errors import CgroupError, UsageError
from gpusandbox.linux import cgplace, cgroup

from .test_cgroup import FULL_CAPS, Fake, only_v1_devices

RULES = [("c", 195, 0, "rw"), ("c", 195, 255, "rw")]
ALL = "{d}", "{d}/cgroup.procs", "{d}/cgroup.subtree_control"
NO_CGROUP2 = "no cgroup2 filesystem is mounted"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.setattr(cgroup, "_start_reaper", lambda h, leaf, version, v1=(): None)
    return Fake(tmp_path, monkeypatch)


def _outcome(call):
    seen = []
    try:
        h = call(seen.append)
    except (CgroupError, UsageError) as e:
        return ("error", type(e).__name__, e.line(), e.hint, e.code)
    if h is None:
        return ("leaf",)
    try:
        return ("leaf" if h.path else "none", h.notes, seen, h.warnings, h.view(), h.fds,
                h.needs_join, h.filter, h.dirfd)
    finally:
        h.teardown()


def _both(fake, parent=None):
    proc = str(fake.proc)
    fast = _outcome(lambda v: cgplace.without_leaf(parent, verbose=v, proc=proc))
    full = _outcome(lambda v: cgroup.prepare(parent=parent, device_rules=RULES, verbose=v,
                                             proc=proc))
    return fast, full


def _unwritable(fake, d, which=ALL):
    fake.unwritable |= {w.format(d=d) for w in which}


def _hybrid(fake, own="/user.slice/session-1.scope"):
    """v1 controllers beside cgroup2 (systemd's hybrid layout: cgroup2 at
    .../unified, the controllers bound to v1 in /proc/cgroups)."""
    (fake.proc / "cgroups").write_text(
        "#subsys_name\thierarchy\tnum_cgroups\tenabled\n"
        "cpu\t3\t1\t1\nmemory\t4\t1\t1\npids\t5\t1\t1\ndevices\t6\t1\t1\n")
    fake.set_proc(own=own, v1=("cpu", "memory", "pids", "devices"))
    return fake.cgdir(fake.cg / own.strip("/").split("/")[0]), own


def test_pure_v2_delegated_makes_a_leaf(fake):
    fake.cgdir(fake.cg / "user", controllers="memory pids cpu")
    fake.set_proc(own="/user")
    fast, full = _both(fake)
    assert fast == ("leaf",) and full[0] == "leaf" and full[-1] >= 0 and full[4] is True


def test_pure_v2_not_delegated_no_leaf(fake):
    d = fake.cgdir(fake.cg / "user")
    fake.set_proc(own="/user")
    _unwritable(fake, d)
    fast, full = _both(fake)
    assert fast == full and fast[0] == "none"
    assert fast[1] == [f"cgroup: none ({d}, {d}/cgroup.procs, {d}/cgroup.subtree_control "
                       f"not writable by uid {os.getuid()})",
                       "device filter: not applied (rootless: device isolation rests on the "
                       "bind-mounted nodes alone)"]
    assert fast[2] == fast[1] and fast[3:] == ([], False, [], False, None, -1)


@pytest.mark.parametrize("which", [("{d}/cgroup.procs",), ("{d}/cgroup.subtree_control",),
                                   ("{d}",)])
def test_one_file_not_writable_is_no_leaf(fake, which):
    _unwritable(fake, fake.cg, which)
    fast, full = _both(fake)
    assert fast == full and fast[0] == "none"
    assert fast[1][0] == (f"cgroup: none ({which[0].format(d=fake.cg)} not writable by uid "
                          f"{os.getuid()})")


def test_hybrid_not_delegated_no_leaf(fake):
    d, _ = _hybrid(fake)
    _unwritable(fake, d / "session-1.scope")
    (d / "session-1.scope").mkdir()
    fast, full = _both(fake)
    assert fast == full and fast[0] == "none" and f"{d}/session-1.scope," in fast[1][0]


def test_hybrid_delegated_makes_a_leaf(fake):
    d, own = _hybrid(fake, own="/user")
    fast, full = _both(fake)
    assert fast == ("leaf",) and full[0] == "leaf" and full[4] is True


def test_root_with_a_writable_parent_makes_a_leaf_with_the_filter(fake):
    fake.set_proc(caps=FULL_CAPS)
    fast, full = _both(fake)
    assert fast == ("leaf",) and full[0] == "leaf" and full[7] == "bpf"
    assert fake.attached and fake.attached[0][2] == RULES


def test_root_without_a_writable_parent_is_refused_alike(fake):
    fake.set_proc(caps=FULL_CAPS)
    _unwritable(fake, fake.cg, ("{d}/cgroup.procs",))
    fast, full = _both(fake)
    assert fast == full and fast[:2] == ("error", "CgroupError")
    assert fast[2].startswith("device filter: no cgroup to attach it to")
    assert fast[3] == f"make {fake.cg} writable or pass --cgroup-parent"


def test_root_in_a_user_namespace_is_rootless_alike(fake):
    fake.set_proc(caps=FULL_CAPS, uid_map="0 1000 1")
    _unwritable(fake, fake.cg)
    fast, full = _both(fake)
    assert fast == full and fast[0] == "none" and "rootless" in fast[1][-1]


def test_no_cgroup2_rootless_no_leaf(fake):
    fake.mounts = []
    fake.set_proc(v1=("memory",))
    fast, full = _both(fake)
    assert fast == full and fast[0] == "none" and NO_CGROUP2 in fast[1][0]


def test_no_cgroup2_root_hands_over_to_the_v1_devices_leaf(fake):
    only_v1_devices(fake)
    fast, full = _both(fake)
    assert fast == ("leaf",) and full[0] == "leaf" and full[7] == "v1" and full[6] is True


def test_under_slurm_the_note_names_the_job_alike(fake, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    _unwritable(fake, fake.cg)
    fast, full = _both(fake)
    assert fast == full and fast[1][-1].endswith("and on the Slurm job's own device cgroup)")


@pytest.mark.parametrize("parent,kind", [("/nope", "UsageError"), ("a/../b", "UsageError"),
                                         ("job", None), ("/job", None), ("{cg}/job", None)])
def test_cgroup_parent_alike(fake, parent, kind):
    job = fake.cgdir(fake.cg / "job")
    parent = parent.format(cg=fake.cg)
    fast, full = _both(fake, parent)
    if kind:
        assert fast == full and fast[:2] == ("error", kind)
        return
    assert fast == ("leaf",) and full[0] == "leaf"
    _unwritable(fake, job, ("{d}/cgroup.subtree_control",))
    fast, full = _both(fake, parent)
    assert fast == full and fast[0] == "none" and f"{job}/cgroup.subtree_control" in fast[1][0]


def test_launchers_cgroup_unknown_or_hidden_alike(fake):
    (fake.proc / "self" / "cgroup").write_text("3:memory:/\n")
    fast, full = _both(fake)
    assert fast == full and "the launcher's cgroup is unknown" in fast[2]
    fake.mounts = [f"41 31 0:38 /sub {fake.cg} rw,relatime - cgroup2 cgroup2 rw"]
    fake.set_proc(own="/other")
    fast, full = _both(fake)
    assert fast == full and "the launcher's cgroup /other is not visible" in fast[2]


def test_the_launchers_module_does_not_load_the_leaf_makers():
    """stages/parent.py asks cgplace first: cgroup.py and cgfs.py load only
    when a leaf is to be made."""
    code = ("import sys; import gpusandbox.stages.parent; "
            "print(sorted(m for m in sys.modules if m in ('gpusandbox.linux.cgroup', "
            "'gpusandbox.linux.cgfs', 'gpusandbox.linux.cgplace')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['gpusandbox.linux.cgplace']"]
