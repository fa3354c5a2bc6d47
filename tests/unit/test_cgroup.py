"""The cgroup layer's file-level logic on a fake /proc and cgroupfs tree.

mkdir in the fake tree creates the interface files the kernel would (for the
controllers the parent enables); the BPF part is replaced by a recorder:
the real program is loaded and attached in tests/integration."""
import os
import shutil

import pytest

from gpusandbox.errors import CgroupError, UsageError
from gpusandbox.linux import bpfdev, cgempty, cgfs, cgplace, cgroup
from gpusandbox.linux.cgroup import Limits

from .test_bpfdev import run as run_bpf

REAL_ATTACH_BPF = cgroup._attach_bpf

FULL_CAPS = "000001ffffffffff"


class Fake:
    def __init__(self, tmp, monkeypatch):
        self.proc = tmp / "proc"
        self.cg = tmp / "cg"
        self.v1 = tmp / "v1"
        (self.proc / "self").mkdir(parents=True)
        self.cg.mkdir()
        self.writes = []
        self.mp = monkeypatch
        self.unwritable = set()
        self.mounts = [f"41 31 0:38 / {self.cg} rw,relatime - cgroup2 cgroup2 rw"]
        self.set_proc(own="/", caps="0", uid_map="0 0 4294967295")
        (self.proc / "cgroups").write_text("#subsys_name\thierarchy\tnum_cgroups\tenabled\n"
                                           "memory\t0\t1\t1\npids\t0\t1\t1\ncpu\t0\t1\t1\n")
        (self.proc / "stat").write_text("cpu 1 2 3\nbtime 1000\n")
        self.cgdir(self.cg, controllers="memory pids cpu", subtree="")
        real_write = cgroup._write

        def write(path, text):
            if str(path) in self.unwritable:
                raise PermissionError(13, "Permission denied")
            self.writes.append((str(path), text))
            if str(path).endswith("/cgroup.procs"):    # the kernel adds the pid
                with open(path, "a") as f:
                    f.write(f"{text}\n")
                return
            real_write(path, text)
            if str(path).endswith("cgroup.subtree_control"):   # the kernel accumulates +ctl
                p = str(path)
                old = open(p).read().replace(text, "")
                with open(p, "w") as f:
                    f.write(" ".join(old.split() + [text.lstrip("+")]))
        # The file helpers live in cgplace and cgfs and are also used from cgroup and cgempty.
        for mod in (cgroup, cgfs, cgempty, cgplace):
            monkeypatch.setattr(mod, "_write", write, raising=False)
            monkeypatch.setattr(mod, "_mkdir", self.mkdir, raising=False)
            monkeypatch.setattr(mod, "_rmdir", lambda p: shutil.rmtree(p), raising=False)
            monkeypatch.setattr(mod, "_writable", lambda p: str(p) not in self.unwritable,
                                raising=False)
        self.attached = []
        monkeypatch.setattr(cgroup, "_attach_bpf", self.attach)
        # Pids in the fake tree are made up: never signal them; "killing"
        # empties the fake cgroup.procs files as the kernel would.
        self.killed = []
        monkeypatch.setattr(cgempty, "_kill_listed", self.kill)

    def kill(self, path):
        self.killed.append(path)
        for top, _, files in os.walk(path):
            if "cgroup.procs" in files:
                open(os.path.join(top, "cgroup.procs"), "w").close()

    def attach(self, h, pdir, rules):
        self.attached.append((h.path, pdir, rules))
        h.filter = "bpf"
        h.note("device filter: BPF program id 1 attached")

    def set_proc(self, own="/", caps="0", uid_map="0 0 4294967295", v1=()):
        s = self.proc / "self"
        (s / "cgroup").write_text("".join(f"{i + 1}:{c}:/\n" for i, c in enumerate(v1)) + f"0::{own}\n")
        (s / "status").write_text(f"Name:\tx\nCapEff:\t{caps}\n")
        (s / "uid_map").write_text(f"{uid_map}\n")
        lines = list(self.mounts)
        for i, c in enumerate(v1):
            lines.append(f"{50 + i} 31 0:{50 + i} / {self.v1 / c} rw - cgroup cgroup rw,{c}")
        (s / "mountinfo").write_text("\n".join(lines) + "\n")

    def cgdir(self, path, controllers="", subtree="", procs="", populated=0, kill=True):
        path.mkdir(exist_ok=True)
        (path / "cgroup.controllers").write_text(controllers + "\n")
        (path / "cgroup.subtree_control").write_text(subtree + "\n")
        (path / "cgroup.procs").write_text(procs)
        if path != self.cg:
            (path / "cgroup.events").write_text(f"populated {populated}\nfrozen 0\n")
            if kill:
                (path / "cgroup.kill").write_text("")
        return path

    def mkdir(self, path):
        parent = os.path.dirname(path)
        if "devices.deny" in os.listdir(parent):       # a v1 devices cgroup
            os.mkdir(path)
            for f in ("cgroup.procs", "devices.deny", "devices.allow"):
                open(os.path.join(path, f), "w").close()
            return
        if str(path).startswith(str(self.v1) + "/"):   # another v1 hierarchy
            self.v1dir(type(self.cg)(path))
            return
        enabled = open(os.path.join(parent, "cgroup.subtree_control")).read().split()
        p = self.cgdir(type(self.cg)(path), controllers=" ".join(enabled))
        files = {"memory": ["memory.max", "memory.swap.max"], "pids": ["pids.max"], "cpu": ["cpu.max"]}
        for ctl in enabled:
            for f in files.get(ctl, []):
                (p / f).write_text("")

    def v1dir(self, path):
        """A v1 cgroup of the hierarchy named by its mount (self.v1/<ctl>)."""
        ctl = path.relative_to(self.v1).parts[0]
        path.mkdir(parents=True, exist_ok=True)
        files = {"memory": ["memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
                            "memory.soft_limit_in_bytes"],
                 "pids": ["pids.max"], "cpu": ["cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.shares"],
                 "cpuset": ["cpuset.cpus", "cpuset.mems"]}
        for f in ["cgroup.procs"] + files.get(ctl, []):
            if not (path / f).exists():
                (path / f).write_text("")
        if path.parent == self.v1 and ctl == "cpuset":
            (path / "cpuset.cpus").write_text("0-3\n")
            (path / "cpuset.mems").write_text("0\n")
        return path

    def leaves(self, under=None):
        return sorted(n for n in os.listdir(under or self.cg) if n.startswith("gpusandbox-"))


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    # No reaper process for a fake tree (the integration tests cover it).
    monkeypatch.setattr(cgroup, "_start_reaper", lambda h, leaf, version, v1=(): None)
    return Fake(tmp_path, monkeypatch)


def prepare(fake, **kw):
    return cgroup.prepare(proc=str(fake.proc), **kw)


# --- limits ------------------------------------------------------------------------
@pytest.mark.parametrize("kw,files", [
    (dict(memory="512m"), [("memory", "memory.max", str(512 << 20))]),
    (dict(memory="2G"), [("memory", "memory.max", str(2 << 30))]),
    (dict(memory="1.5g"), [("memory", "memory.max", str(3 << 29))]),
    (dict(memory="10485760"), [("memory", "memory.max", "10485760")]),
    (dict(memory="64MiB"), [("memory", "memory.max", str(64 << 20))]),
    (dict(memory="max"), [("memory", "memory.max", "max")]),
    (dict(memory="1g", memory_swap="3g"),
     [("memory", "memory.max", str(1 << 30)), ("memory", "memory.swap.max", str(2 << 30))]),
    (dict(memory="1g", memory_swap="1g"),
     [("memory", "memory.max", str(1 << 30)), ("memory", "memory.swap.max", "0")]),
    (dict(memory="1g", memory_swap="-1"),
     [("memory", "memory.max", str(1 << 30)), ("memory", "memory.swap.max", "max")]),
    (dict(pids="256"), [("pids", "pids.max", "256")]),
    (dict(pids="max"), [("pids", "pids.max", "max")]),
    (dict(cpus="1.5"), [("cpu", "cpu.max", "150000 100000")]),
    (dict(cpus="0.01"), [("cpu", "cpu.max", "1000 100000")]),
])
def test_limits_parse(kw, files):
    assert Limits(**kw).files() == files


@pytest.mark.parametrize("kw,opt", [
    (dict(memory="12x"), "--memory 12x"),
    (dict(memory="-5m"), "--memory -5m"),
    (dict(memory="nan"), "--memory nan"),
    (dict(memory="1m"), "--memory 1m"),
    (dict(memory_swap="2g"), "--memory-swap 2g"),
    (dict(memory="2g", memory_swap="1g"), "--memory-swap 1g"),
    (dict(memory="max", memory_swap="1g"), "--memory-swap 1g"),
    (dict(pids="0"), "--pids-limit 0"),
    (dict(pids="ten"), "--pids-limit ten"),
    (dict(cpus="0"), "--cpus 0"),
    (dict(cpus="lots"), "--cpus lots"),
    (dict(cpus="100000"), "--cpus 100000"),
])
def test_limits_refused_naming_the_option(kw, opt):
    with pytest.raises(UsageError) as e:
        Limits(**kw).files()
    assert e.value.what.startswith(opt) and e.value.hint and e.value.code == 125


# --- rootless -------------------------------------------------------------------------
def test_rootless_without_delegation_gives_no_leaf(fake):
    fake.unwritable = {str(fake.cg), str(fake.cg / "cgroup.procs"), str(fake.cg / "cgroup.subtree_control")}
    seen = []
    h = prepare(fake, device_rules=[("c", 195, 0, "rw")], verbose=seen.append)
    assert h.dirfd == -1 and h.path is None and h.filter is None
    assert h.notes[0].startswith("cgroup: none (") and "not writable by uid" in h.notes[0]
    assert h.notes[1] == ("device filter: not applied (rootless: device isolation rests on "
                          "the bind-mounted nodes alone)")
    assert seen == h.notes and fake.leaves() == [] and fake.attached == []
    h.teardown()


def test_rootless_under_slurm_names_the_job_cgroup(fake, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    fake.unwritable = {str(fake.cg)}
    h = prepare(fake)
    assert "and on the Slurm job's own device cgroup" in h.notes[-1]


def test_rootless_limits_without_delegation_fail(fake):
    fake.unwritable = {str(fake.cg / "cgroup.procs")}
    with pytest.raises(CgroupError) as e:
        prepare(fake, limits=Limits(memory="1g", pids="10"))
    assert "--memory, --pids-limit" in e.value.what and "cgroup.procs not writable" in e.value.why
    assert e.value.code == 125 and "--best-effort-limits" in e.value.hint
    h = prepare(fake, limits=Limits(memory="1g"), best_effort=True)
    assert h.path is None and "continuing: --best-effort-limits" in h.notes[0]


def test_rootless_delegated_leaf_with_limits(fake):
    job = fake.cgdir(fake.cg / "user", controllers="memory pids cpu", subtree="memory pids")
    fake.set_proc(own="/user")
    h = prepare(fake, limits=Limits(memory="512m", pids="64"))
    name = os.path.basename(h.path)
    prefix, pid, tag = name.split("-")
    assert (prefix, int(pid)) == ("gpusandbox", os.getpid()) and len(tag) == 8
    assert os.path.dirname(h.path) == str(job)
    assert open(f"{h.path}/memory.max").read() == str(512 << 20)
    assert open(f"{h.path}/pids.max").read() == "64"
    assert h.dirfd >= 0 and os.path.samestat(os.fstat(h.dirfd), os.stat(h.path))
    assert h.filter is None and h.notes[-1].startswith("device filter: not applied (rootless")
    assert f"cgroup: {h.path}" in h.notes and fake.attached == []
    h.teardown()
    assert not os.path.exists(h.path) and h.dirfd == -1 and h.fds == []
    assert (h.path + "/cgroup.kill", "1") in fake.writes
    h.teardown()   # idempotent


def test_join_writes_cgroup_procs(fake):
    h = prepare(fake)
    h.join(12345)
    assert (f"{h.path}/cgroup.procs", "12345") in fake.writes
    h.teardown()


# --- controllers -------------------------------------------------------------------------
def test_v1_bound_controllers_get_v1_leaves(fake):
    (fake.proc / "cgroups").write_text("#h\nmemory\t4\t1\t1\npids\t8\t1\t1\ncpu\t1\t1\t1\n")
    fake.set_proc(v1=("memory", "pids", "cpu"))
    # The hierarchies are mounted but the launcher cannot make a leaf there.
    with pytest.raises(CgroupError) as e:
        prepare(fake, limits=Limits(memory="1g", cpus="1"))
    err = e.value
    assert err.what == "cgroup: no cgroup v1 leaf for the limits: memory (--memory), cpu (--cpus)"
    assert f"memory: --cgroup-parent /: no such cgroup ({fake.v1 / 'memory'})" in err.why
    assert "--cgroup-parent" in err.hint and fake.leaves() == []
    h = prepare(fake, limits=Limits(memory="1g", pids="5"), best_effort=True)
    assert "no cgroup v1 leaf" in h.warnings[0] and h.path and h.v1 == []
    h.teardown()
    # With the hierarchies there: one v1 leaf each, named as the v2 leaf, the
    # v1 files written; the cgroup2 leaf gets none of them.
    for c in ("memory", "pids", "cpu"):
        fake.v1dir(fake.v1 / c)
    h = prepare(fake, limits=Limits(memory="1g", memory_swap="2g", pids="5", cpus="1.5"))
    name = os.path.basename(h.path)
    assert h.v1 == [str(fake.v1 / c / name) for c in ("memory", "pids", "cpu")]
    assert h.needs_join and h.dirfd >= 0
    read = lambda c, f: open(fake.v1 / c / name / f).read()
    assert read("memory", "memory.limit_in_bytes") == str(1 << 30)
    assert read("memory", "memory.memsw.limit_in_bytes") == str(2 << 30)
    assert read("pids", "pids.max") == "5"
    assert (read("cpu", "cpu.cfs_period_us"), read("cpu", "cpu.cfs_quota_us")) == ("100000", "150000")
    assert not any(w[0].startswith(str(fake.cg)) and "memory" in w[0] for w in fake.writes)
    h.join(4242)
    assert all(open(f"{p}/cgroup.procs").read() == "4242\n" for p in h.v1)
    h.teardown()
    assert all(not os.path.exists(p) for p in h.v1) and not os.path.exists(h.path)


def test_update_makes_a_missing_v1_leaf_and_moves_the_members(fake):
    fake.set_proc(v1=("memory", "cpuset"))
    for c in ("memory", "cpuset"):
        fake.v1dir(fake.v1 / c)
    (fake.v1 / "cpuset" / "box").mkdir()
    fake.v1dir(fake.v1 / "cpuset" / "box")
    h = prepare(fake, limits=Limits(memory="1g"))
    name = os.path.basename(h.path)
    assert h.v1 == [str(fake.v1 / "memory" / name)]
    open(f"{h.path}/cgroup.procs", "w").write("4242\n4243\n")
    # The init never joined a cpuset leaf: it still sits where `create` was.
    (fake.proc / "4242").mkdir()
    (fake.proc / "4242" / "cgroup").write_text(f"2:cpuset:/box\n1:memory:/{name}\n0::/{name}\n")
    from gpusandbox.linux import cgroupupdate
    fake.mp.setattr(cgroupupdate, "_write", cgfs._write)
    recorded = []
    cgroupupdate.update(h.path, 2, h.v1, Limits(memory="64m", cpuset_cpus="1"),
                        proc=str(fake.proc), pid=4242, record=recorded.append)
    new = str(fake.v1 / "cpuset" / "box" / name)
    assert recorded == [new]
    assert (str(fake.v1 / "memory" / name / "memory.limit_in_bytes"), str(64 << 20)) in fake.writes
    assert (f"{new}/cpuset.cpus", "1") in fake.writes
    # A new v1 cpuset cgroup is empty until given its nearest ancestor's cpus and mems.
    assert (f"{new}/cpuset.mems", "0") in fake.writes
    assert {(f"{new}/cgroup.procs", p) for p in ("4242", "4243")} <= set(fake.writes)
    with pytest.raises(CgroupError) as e:   # pids: neither a v1 leaf nor enabled in cgroup2
        cgroupupdate.update(h.path, 2, h.v1, Limits(pids="7"), proc=str(fake.proc))
    assert e.value.what.startswith("update: cannot set --pids-limit (pids.max = 7)")
    assert "not enabled" in e.value.why
    h.v1 += recorded
    h.teardown()
    assert all(not os.path.exists(p) for p in h.v1)


def test_no_internal_processes_rule(fake):
    fake.cgdir(fake.cg / "job", controllers="memory", procs="4242\n")
    fake.set_proc(own="/job")
    with pytest.raises(CgroupError) as e:
        prepare(fake, limits=Limits(memory="1g"))
    assert "no internal processes" in e.value.why and "--cgroup-parent" in e.value.hint
    assert not any(p.endswith("subtree_control") for p, _ in fake.writes)


def test_controller_enabled_in_an_empty_parent(fake):
    fake.cgdir(fake.cg / "empty", controllers="memory pids")
    h = prepare(fake, parent="empty", limits=Limits(memory="1g"))
    assert (str(fake.cg / "empty" / "cgroup.subtree_control"), "+memory") in fake.writes
    assert open(f"{h.path}/memory.max").read() == str(1 << 30)
    h.teardown()


def test_controller_not_delegated(fake):
    fake.cgdir(fake.cg / "p", controllers="pids")
    with pytest.raises(CgroupError) as e:
        prepare(fake, parent="p", limits=Limits(cpus="1"))
    assert "not delegated to" in e.value.why and "cgroup.controllers" in e.value.why


def test_missing_swap_accounting(fake):
    fake.cgdir(fake.cg / "p", controllers="memory", subtree="memory")
    fake.mp.setattr(cgroup, "_mkdir", lambda p: (fake.mkdir(p), os.unlink(f"{p}/memory.swap.max")))
    with pytest.raises(CgroupError) as e:
        prepare(fake, parent="p", limits=Limits(memory="1g", memory_swap="2g"))
    assert "--memory-swap" in e.value.what and "swap accounting is off" in e.value.why
    assert fake.leaves(fake.cg / "p") == []     # the half-made leaf was removed


# --- parent ----------------------------------------------------------------------------------
def test_parent_resolution(fake):
    fake.cgdir(fake.cg / "a")
    fake.cgdir(fake.cg / "a" / "b")
    for parent in ("a/b", "/a/b/", f"{fake.cg}/a/b"):
        h = prepare(fake, parent=parent)
        assert os.path.dirname(h.path) == str(fake.cg / "a" / "b")
        h.teardown()
    for parent, words in (("/elsewhere/x", f"no such cgroup ({fake.cg}/elsewhere/x)"), ("a/../..", "'..'"),
                          ("a/nope", "no such cgroup")):
        with pytest.raises(UsageError) as e:
            prepare(fake, parent=parent)
        assert e.value.what.startswith(f"--cgroup-parent {parent}") and words in e.value.what


# --- stale leaves -------------------------------------------------------------------------------
def test_stale_leaves(fake):
    dead = fake.cgdir(fake.cg / "gpusandbox-999991-ab12")
    busy = fake.cgdir(fake.cg / "gpusandbox-999992-cd34", populated=1)
    foreign = fake.cgdir(fake.cg / "gpusandbox-x-ab12")
    other = fake.cgdir(fake.cg / "gpusandboxes-999993-ab12")
    live = fake.cgdir(fake.cg / "gpusandbox-777-ee")
    (fake.proc / "777").mkdir()
    (fake.proc / "777" / "cmdline").write_bytes(b"/usr/bin/python3\0/usr/local/bin/gpusandbox\0run\0")
    reused = fake.cgdir(fake.cg / "gpusandbox-778-ff")
    old = fake.cgdir(fake.cg / "gpusandbox-779-ff")
    tick = os.sysconf("SC_CLK_TCK")
    made = os.stat(reused).st_ctime
    for pid, start in ((778, made + 60), (779, made - 60)):
        (fake.proc / str(pid)).mkdir()
        (fake.proc / str(pid) / "cmdline").write_bytes(b"sleep\0100\0")
        (fake.proc / str(pid) / "stat").write_text(
            f"{pid} (sle ep) S " + " ".join(["0"] * 18 + [str(int((start - 1000) * tick))]) + " 0 0\n")
    h = prepare(fake)
    assert not dead.exists() and not reused.exists()
    assert busy.exists() and foreign.exists() and other.exists() and live.exists() and old.exists()
    assert f"cgroup: removed stale {dead}" in h.notes and f"cgroup: removed stale {reused}" in h.notes
    h.teardown()


# --- root --------------------------------------------------------------------------------------
def test_root_attaches_the_filter_with_the_rules(fake, monkeypatch):
    """The real _attach_bpf, with only the bpf() calls replaced: the program
    it loads lets the default nodes and the given rules through and nothing
    else; it is attached to the leaf with BPF_F_ALLOW_MULTI, checked in force
    there, and detached from the leaf at teardown."""
    monkeypatch.setattr(cgroup, "_attach_bpf", REAL_ATTACH_BPF)
    calls = []
    prog_fd = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)   # stands for the program

    def where(fd):
        return os.readlink(f"/proc/self/fd/{fd}")

    def load(insns):
        calls.append(("load", insns))
        return prog_fd

    def query(fd, effective=False):
        calls.append(("query", where(fd), effective))
        return 0, [77] if where(fd) != str(fake.cg) else []
    monkeypatch.setattr(bpfdev, "load", load)
    monkeypatch.setattr(bpfdev, "prog_id", lambda fd: 77 if fd == prog_fd else None)
    monkeypatch.setattr(bpfdev, "attach",
                        lambda fd, pfd, flags: calls.append(("attach", where(fd), pfd, flags)))
    monkeypatch.setattr(bpfdev, "detach",
                        lambda fd, pfd: calls.append(("detach", where(fd), pfd)))
    monkeypatch.setattr(bpfdev, "query", query)
    fake.set_proc(caps=FULL_CAPS)
    h = prepare(fake, device_rules=[("c", 195, 0, "rw")])
    (_, insns), *rest = calls
    assert run_bpf(insns, bpfdev.DEV_CHAR, 195, 0, bpfdev.ACC_READ | bpfdev.ACC_WRITE) == 1
    assert run_bpf(insns, bpfdev.DEV_CHAR, 195, 0, bpfdev.ACC_MKNOD) == 0
    assert run_bpf(insns, bpfdev.DEV_CHAR, 195, 1, bpfdev.ACC_READ) == 0
    assert run_bpf(insns, bpfdev.DEV_CHAR, 1, 3, bpfdev.ACC_READ | bpfdev.ACC_WRITE) == 1
    assert run_bpf(insns, bpfdev.DEV_BLOCK, 7, 0, bpfdev.ACC_READ) == 0
    assert rest == [("attach", h.path, prog_fd, bpfdev.BPF_F_ALLOW_MULTI),
                    ("query", h.path, False), ("query", h.path, True),
                    ("query", str(fake.cg), True)]
    assert h.filter == "bpf" and h.prog_id == 77
    assert h.notes[-1].startswith("device filter: BPF program id 77 attached")
    del calls[:]
    h.teardown()
    assert calls == [("detach", h.path, prog_fd)]
    assert not os.path.exists(h.path)


def test_root_in_a_user_namespace_is_rootless(fake):
    fake.set_proc(caps=FULL_CAPS, uid_map="0 1000 1")
    h = prepare(fake)
    assert fake.attached == [] and "rootless" in h.notes[-1]
    h.teardown()


def only_v1_devices(fake):
    """A host without cgroup2 whose v1 devices hierarchy root may use."""
    fake.mounts = []
    devs = fake.v1 / "devices"
    devs.mkdir(parents=True)
    for f in ("cgroup.procs", "devices.deny", "devices.allow"):
        (devs / f).write_text("")
    fake.set_proc(caps=FULL_CAPS, v1=("devices",))
    return devs


def test_no_cgroup2_root_falls_back_to_v1_devices(fake):
    devs = only_v1_devices(fake)
    h = prepare(fake, device_rules=[("c", 195, 0, "rw"), ("c", 508, None, "rw")])
    assert h.filter == "v1" and h.dirfd == -1 and os.path.dirname(h.path) == str(devs)
    writes = [(os.path.basename(p), t) for p, t in fake.writes if p.startswith(h.path)]
    assert writes[0] == ("devices.deny", "a")
    assert writes[1:] == [("devices.allow", line) for line in bpfdev.v1_lines(
        list(bpfdev.DEFAULT_RULES) + [("c", 195, 0, "rw"), ("c", 508, None, "rw")])]
    assert ("devices.allow", "c 136:* rwm") in writes and ("devices.allow", "c 508:* rw") in writes
    h.join(77)
    assert (f"{h.path}/cgroup.procs", "77") in fake.writes
    h.teardown()   # v1 has no cgroup.kill: the listed pids are killed one by one
    assert fake.killed == [h.path] and not os.path.exists(h.path)


def test_no_cgroup2_limits_and_rootless(fake):
    fake.mounts = []
    fake.set_proc()
    with pytest.raises(CgroupError) as e:
        prepare(fake, limits=Limits(pids="5"))
    assert "no cgroup v1 leaf" in e.value.what and "pids: no cgroup v1 hierarchy" in e.value.why
    h = prepare(fake)
    assert h.path is None and "no cgroup2" in h.notes[0] and "rootless" in h.notes[1]


def test_pure_v1_limits_go_to_v1_leaves(fake):
    fake.mounts = []
    fake.set_proc(v1=("pids", "memory"))
    for c in ("pids", "memory"):
        fake.v1dir(fake.v1 / c)
    h = prepare(fake, limits=Limits(pids="5", memory="1g"))
    name = os.path.basename(h.path)
    # Rootless: no devices leaf; the first v1 leaf is the one teardown kills through.
    assert (h.path, h.version, h.v1) == (str(fake.v1 / "memory" / name), 1,
                                        [str(fake.v1 / "pids" / name)])
    assert open(fake.v1 / "pids" / name / "pids.max").read() == "5" and h.needs_join
    h.teardown()
    assert fake.leaves(fake.v1 / "pids") == [] and fake.leaves(fake.v1 / "memory") == []


def test_teardown_after_partial_setup_never_raises(fake):
    h = cgroup.CgroupHandle()
    h.path, h.version = str(fake.cg / "gone"), 2
    h.teardown()
    assert h.notes == []   # a leaf that never appeared: nothing to report
    h2 = prepare(fake)
    os.close(h2._fd)       # simulate an fd closed behind our back
    h2.teardown()
    assert any("could not close" in n for n in h2.notes) and not os.path.exists(h2.path)


def test_a_leaf_that_cannot_be_emptied_keeps_its_filter(fake, monkeypatch):
    monkeypatch.setattr(cgroup, "KILL_WAIT", 0.05)
    detached = []
    monkeypatch.setattr(cgroup.CgroupHandle, "_detach", lambda self: detached.append(self.path))
    h = prepare(fake)
    h._attached = True
    with open(f"{h.path}/cgroup.events", "w") as f:
        f.write("populated 1\nfrozen 0\n")
    h.teardown()
    assert detached == [] and os.path.isdir(h.path) and h.fds == []
    assert h.notes[-1] == f"cgroup: {h.path} still has processes; left for a later cleanup"
    assert fake.killed == []     # cgroup.kill was used, not pid by pid
    with open(f"{h.path}/cgroup.events", "w") as f:
        f.write("populated 0\nfrozen 0\n")
    h2 = prepare(fake)     # same launcher pid: not stale; removed only once its launcher is gone
    assert os.path.isdir(h.path)
    h2.teardown()


def test_status_on_a_hybrid_fake(fake):
    (fake.proc / "cgroups").write_text("#h\nmemory\t4\t1\t1\npids\t0\t1\t1\n")
    fake.set_proc(v1=("memory",))
    s = cgroup.status(proc=str(fake.proc))
    assert s["cgroup2"] == str(fake.cg) and s["hybrid"] is True and s["own_cgroup"] == "/"
    assert s["controllers_v1"] == ["memory"] and s["delegated"] is True
    assert s["controllers"] == ["memory", "pids", "cpu"]
    assert s["bpf_filter"] is False and "CAP_SYS_ADMIN" in s["bpf_why"] and s["error"] is None
