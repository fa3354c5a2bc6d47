"""linux/cgroupres.py: one limits model written as cgroup v2 or v1 files,
from `run`'s options, an OCI config's linux.resources and `update`'s flags;
and the OCI runtime's `update` command line (oci/runtime/update.py)."""
import io
import json

import pytest

from gpusandbox.errors import UsageError
from gpusandbox.linux import cgroupres
from gpusandbox.linux.cgroupres import Limits, from_oci
from gpusandbox.oci.runtime import update as upd


def test_the_same_limits_as_v2_and_v1_files():
    lim = Limits(memory="64m", memory_swap="128m", pids="20", cpus="0.5",
                 memory_reservation="32m", cpu_shares=512, cpuset_cpus="0-1",
                 cpuset_mems="0", blkio_weight=300, hugetlb=[("2MB", "4m")])
    assert lim.files(2) == [
        ("memory", "memory.max", str(64 << 20)), ("memory", "memory.swap.max", str(64 << 20)),
        ("memory", "memory.low", str(32 << 20)), ("pids", "pids.max", "20"),
        ("cpu", "cpu.max", "50000 100000"), ("cpu", "cpu.weight", "20"),
        ("cpuset", "cpuset.cpus", "0-1"), ("cpuset", "cpuset.mems", "0"),
        ("io", "io.weight", "default 300"), ("hugetlb", "hugetlb.2MB.max", str(4 << 20))]
    assert lim.files(1) == [
        ("memory", "memory.limit_in_bytes", str(64 << 20)),
        ("memory", "memory.memsw.limit_in_bytes", str(128 << 20)),
        ("memory", "memory.soft_limit_in_bytes", str(32 << 20)), ("pids", "pids.max", "20"),
        ("cpu", "cpu.cfs_period_us", "100000"), ("cpu", "cpu.cfs_quota_us", "50000"),
        ("cpu", "cpu.shares", "512"), ("cpuset", "cpuset.cpus", "0-1"),
        ("cpuset", "cpuset.mems", "0"), ("blkio", "blkio.weight", "300"),
        ("hugetlb", "hugetlb.2MB.limit_in_bytes", str(4 << 20))]
    assert lim.controllers() == ["memory", "pids", "cpu", "cpuset", "blkio", "hugetlb"]
    # Unlimited: 'max' on v2, -1 on v1.
    assert Limits(memory="max", memory_swap="-1").files(1) == [
        ("memory", "memory.limit_in_bytes", "-1"), ("memory", "memory.memsw.limit_in_bytes", "-1")]


def test_a_period_alone_keeps_the_quota_on_v2():
    now = {"cpu.max": "30000 100000"}
    assert Limits(cpu_period=50000).files(2, current=now.get) == [("cpu", "cpu.max", "30000 50000")]
    assert Limits(cpu_quota=-1).files(2, current=now.get) == [("cpu", "cpu.max", "max 100000")]
    assert Limits(cpu_period=50000).files(1) == [("cpu", "cpu.cfs_period_us", "50000")]


def test_from_oci_reads_runc_fields():
    lim = from_oci({"memory": {"limit": 1 << 30, "swap": -1, "reservation": 0},
                    "pids": {"limit": 99}, "cpu": {"quota": 20000, "period": 50000,
                                                   "shares": 2, "cpus": "1", "mems": ""},
                    "blockIO": {"weight": 10}, "hugepageLimits": [{"pageSize": "1GB",
                                                                    "limit": 1 << 30}],
                    "devices": [{"allow": False, "access": "rwm"}]})
    assert (lim.memory, lim.memory_swap, lim.memory_reservation, lim.pids) == \
        (str(1 << 30), "max", None, "99")
    assert (lim.cpu_quota, lim.cpu_period, lim.cpu_shares, lim.cpuset_cpus, lim.cpuset_mems) == \
        (20000, 50000, 2, "1", None)
    assert lim.blkio_weight == 10 and lim.hugetlb == [("1GB", str(1 << 30))]
    assert from_oci({}).empty() and from_oci({"devices": []}).empty()


@pytest.mark.parametrize("res,needle", [
    ({"memory": {"limit": "1g"}}, "linux.resources.memory.limit: not an integer ('1g')"),
    ({"cpu": []}, "linux.resources.cpu: not an object"),
    ({"cpu": {"cpus": 3}}, "linux.resources.cpu.cpus: not a string (3)"),
    ({"hugepageLimits": {}}, "linux.resources.hugepageLimits: not a list"),
])
def test_from_oci_bad_fields(res, needle):
    with pytest.raises(UsageError) as e:
        from_oci(res)
    assert e.value.line().startswith(needle)


@pytest.mark.parametrize("kw,needle", [
    (dict(cpu_shares=1), "--cpu-shares 1: out of range"),
    (dict(cpu_quota=500), "--cpu-quota 500: below 1000 microseconds"),
    (dict(cpu_period=10), "--cpu-period 10: out of range"),
    (dict(cpus="1", cpu_quota=5000), "--cpus and --cpu-quota: give one of them"),
    (dict(cpuset_cpus="0-a"), "--cpuset-cpus 0-a: not a list of numbers"),
    (dict(blkio_weight=5000), "--blkio-weight 5000: out of range"),
    (dict(hugetlb=[("3XB", "1")]), "hugepage limit '3XB': not a page size"),
    (dict(memory_reservation="lots"), "--memory-reservation lots: not a size"),
])
@pytest.mark.parametrize("version", [1, 2])
def test_bad_values_name_the_option(kw, needle, version):
    with pytest.raises(UsageError) as e:
        Limits(**kw).files(version)
    assert e.value.line().startswith(needle) and e.value.hint


def test_every_file_names_its_option():
    lim = Limits(memory="64m", memory_swap="128m", pids="20", cpus="0.5",
                 memory_reservation="32m", cpu_shares=512, cpuset_cpus="0", cpuset_mems="0",
                 blkio_weight=300)
    for v in (1, 2):
        for _, name, _ in lim.files(v):
            assert cgroupres.option(name).startswith("--"), name


def test_update_flags_and_resources_file(monkeypatch, tmp_path):
    seen = {}

    def fake_update(path, version, v1, limits, **kw):
        seen.update(path=path, version=version, v1=v1, files=limits.files(1))

    from gpusandbox.linux import cgroupupdate
    from gpusandbox.oci.runtime import state
    monkeypatch.setattr(cgroupupdate, "update", fake_update)
    monkeypatch.setattr(state, "load", lambda root, cid: {
        "cgroup": "/u/leaf", "cgroup_version": 2, "cgroup_v1": ["/m/leaf"], "_dir": "/x"})
    monkeypatch.setattr(state, "alive", lambda st: True)
    # -r - then a flag overriding its field, as runc.
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(json.dumps(
        {"memory": {"limit": 64 << 20}, "pids": {"limit": 9}}).encode())))
    assert upd.main_update("/r", ["-r", "-", "--pids-limit=12", "c1"]) == 0
    assert seen["files"] == [("memory", "memory.limit_in_bytes", str(64 << 20)),
                             ("pids", "pids.max", "12")]
    assert (seen["path"], seen["v1"]) == ("/u/leaf", ["/m/leaf"])
    f = tmp_path / "res.json"
    f.write_text('{"cpu": {"shares": 100}}')
    assert upd.main_update("/r", ["--resources", str(f), "c1"]) == 0
    assert seen["files"] == [("cpu", "cpu.shares", "100")]


@pytest.mark.parametrize("argv,needle", [
    (["c1", "c2"], "update: needs exactly one container id"),
    (["--cpu-rt-runtime", "5", "c1"], "update --cpu-rt-runtime: not supported by gpusandbox"),
    (["--memory", "", "c1"], "update --memory: empty value"),
    (["-r", "/nonexistent/r.json", "c1"], "update --resources /nonexistent/r.json: No such file"),
])
def test_update_bad_command_lines(argv, needle, monkeypatch):
    from gpusandbox.oci.runtime import state
    monkeypatch.setattr(state, "load", lambda root, cid: {"cgroup": "/u/l", "_dir": "/x"})
    monkeypatch.setattr(state, "alive", lambda st: True)
    with pytest.raises(UsageError) as e:
        upd.main_update("/r", argv)
    assert e.value.line().startswith(needle) and e.value.hint


def test_disable_oom_killer_is_v1_only():
    lim = from_oci({"memory": {"limit": 1 << 30, "disableOOMKiller": True}})
    assert ("memory", "memory.oom_control", "1") in lim.files(1)
    assert [n for _, n, _ in lim.files(2)] == ["memory.max"]
    assert from_oci({"memory": {"disableOOMKiller": True}}).controllers() == ["memory"]
    with pytest.raises(UsageError):
        from_oci({"memory": {"disableOOMKiller": 1}})


def test_update_takes_runcs_cpu_share_spelling(monkeypatch):
    seen = {}
    from gpusandbox.linux import cgroupupdate
    from gpusandbox.oci.runtime import state
    monkeypatch.setattr(cgroupupdate, "update",
                        lambda path, version, v1, limits, **kw: seen.update(s=limits.cpu_shares))
    monkeypatch.setattr(state, "load", lambda root, cid: {"cgroup": "/u/l", "_dir": "/x"})
    monkeypatch.setattr(state, "alive", lambda st: True)
    assert upd.main_update("/r", ["--cpu-share", "300", "c1"]) == 0 and seen["s"] == "300"


def test_swappiness_is_v1_only_and_checked():
    """linux.resources.memory.swappiness (runtime-tools' linux_cgroups_memory):
    memory.swappiness on cgroup v1, nothing on v2; -1 means unset (runc)."""
    lim = from_oci({"memory": {"limit": 1 << 30, "swappiness": 10}})
    assert ("memory", "memory.swappiness", "10") in lim.files(1)
    assert [n for _, n, _ in lim.files(2)] == ["memory.max"]
    assert from_oci({"memory": {"swappiness": -1}}).empty()
    with pytest.raises(UsageError) as e:
        from_oci({"memory": {"swappiness": 101}})
    assert "swappiness: 101 is not 0 to 100" in e.value.line()
