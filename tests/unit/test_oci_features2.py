"""OCI config: the per-process settings (oci/configproc.py) and the sysctl
namespace rule, as data, without the kernel."""
import os

import pytest

from gpusandbox.errors import UsageError
from gpusandbox.oci import config as oc
from gpusandbox.oci import configproc as cp


def test_settings_as_data():
    ps = cp.parse({"scheduler": {"policy": "SCHED_FIFO", "priority": 10,
                                 "flags": ["SCHED_FLAG_RESET_ON_FORK"]},
                   "ioPriority": {"class": "IOPRIO_CLASS_IDLE"},
                   "execCPUAffinity": {"initial": "0-2,5", "final": "1"}},
                  {"memoryPolicy": {"mode": "MPOL_INTERLEAVE", "nodes": "0-1",
                                    "flags": ["MPOL_F_STATIC_NODES"]},
                   "personality": {"domain": "LINUX32"}})
    assert ps.sched == (1, 1, 0, 10, 0, 0, 0)
    assert ps.ioprio == 3 << 13
    assert (ps.cpus_initial, ps.cpus_final) == ({0, 1, 2, 5}, {1})
    assert ps.mempolicy == (3, 1 << 15, {0, 1})
    assert ps.personality == 8
    assert not cp.parse({}, {})
    # A deadline without a period: the kernel takes the deadline as period.
    assert cp.parse({"scheduler": {"policy": "SCHED_DEADLINE", "runtime": 10000000,
                                   "deadline": 20000000}}).sched[4:] == (10000000, 20000000, 0)


@pytest.mark.parametrize("sched,why", [
    ({"runtime": 1}, "requires `deadline`"),
    ({"deadline": 2}, "requires `runtime`"),
    ({"runtime": 0, "deadline": 20000000}, "runtime must be greater than 0"),
    ({"runtime": 30000000, "deadline": 20000000, "period": 40000000},
     "runtime (30000000) must be <= deadline (20000000)"),
    ({"runtime": 10000000, "deadline": 30000000, "period": 20000000},
     "deadline (30000000) must be <= period (20000000)"),
    ({"runtime": 1023, "deadline": 10000000}, "runtime (1023) must be between 1024 and"),
    ({"runtime": (1 << 63) + 1, "deadline": (1 << 63) + 2},
     f"runtime ({(1 << 63) + 1}) must be between 1024 and {1 << 63}"),
])
def test_deadline_in_cruns_words(sched, why):
    with pytest.raises(UsageError) as e:
        cp.parse({"scheduler": dict(sched, policy="SCHED_DEADLINE")})
    assert "sched_setattr: `SCHED_DEADLINE` " + why in e.value.line()


@pytest.mark.parametrize("proc,linux,why", [
    ({"scheduler": {"policy": "SCHED_NOPE"}}, {}, "invalid scheduler `SCHED_NOPE`"),
    ({"scheduler": {"policy": "SCHED_RR", "flags": ["X"]}}, {}, "invalid scheduler option"),
    ({"ioPriority": {"class": "IOPRIO_CLASS_NONE"}}, {}, "invalid io priority"),
    ({"ioPriority": {"class": "IOPRIO_CLASS_BE", "priority": 8}}, {}, "out of range"),
    ({"execCPUAffinity": {"final": "3-1"}}, {}, "invalid CPU range"),
    ({}, {"memoryPolicy": {}}, "mode is required"),
    ({}, {"memoryPolicy": {"mode": "BAD_MODE"}}, "invalid memory policy mode"),
    ({}, {"memoryPolicy": {"mode": "MPOL_BIND", "flags": ["BADFLAG"]}},
     "invalid memory policy flag"),
    ({}, {"memoryPolicy": {"mode": "MPOL_BIND", "nodes": "bad"}}, "invalid CPU list"),
    ({}, {"personality": {"domain": "BSD"}}, "domain must be one of"),
])
def test_refusals(proc, linux, why):
    with pytest.raises(UsageError) as e:
        cp.parse(proc, linux)
    assert why in e.value.line()


NEW = oc.NS_FLAGS


@pytest.mark.parametrize("key,flags,join,domain,why", [
    ("kernel.shmmax", 0, [], None, "own ipc namespace"),
    ("fs.mqueue.queues_max", 0, [], None, "own ipc namespace"),
    ("net.ipv4.ping_group_range", 0, [], None, "own network namespace"),
    ("kernel.domainname", 0, [], None, "own uts namespace"),
    ("kernel.domainname", NEW["uts"], [], "other", "conflicts with domainname"),
    ("kernel.hostname", NEW["uts"], [], None, "set the config's hostname"),
    ("vm.swappiness", -1, [], None, "not in a namespace of the container's own"),
])
def test_sysctl_refused_outside_own_namespaces(key, flags, join, domain, why):
    with pytest.raises(UsageError) as e:
        oc._sysctl_namespaced(key, "1", flags, join, domain, oc.NS_FLAGS)
    assert why in e.value.line()


def test_sysctl_allowed_in_own_namespaces():
    oc._sysctl_namespaced("kernel.msgmax", "1", NEW["ipc"], [], None, oc.NS_FLAGS)
    oc._sysctl_namespaced("net.core.somaxconn", "1", 0, [("network", "/run/netns/x")], None,
                          oc.NS_FLAGS)
    oc._sysctl_namespaced("kernel.domainname", "d", NEW["uts"], [], "d", oc.NS_FLAGS)


def test_poststart_state_of_a_workload_already_gone(tmp_path):
    """The workload may end before `start` runs the poststart hooks (it is
    the container's pid 1): they still get running and the init's pid."""
    from gpusandbox.oci.runtime import ops, state
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    st = {"id": "c", "pid": pid, "start_time": 1, "bundle": "/b", "_dir": str(tmp_path)}
    assert state.public(st)["status"] == "stopped"
    post = ops.poststart_state(st)
    assert (post["status"], post["pid"], post["id"]) == ("running", pid, "c")
