"""Which network namespace and capabilities a launch gets (plan._identity,
plan.resolve_net)."""
import os

import pytest

from gpusandbox import plan as planmod
from gpusandbox.linux import caps
from gpusandbox.linux import sys as k
from gpusandbox.spec import RunSpec

NET_RAW, NET_BIND_SERVICE = 13, 10


def identity(monkeypatch, euid, net=None, user=None, fakeroot=False, env=None, by_image=False):
    monkeypatch.setattr(os, "geteuid", lambda: euid)
    monkeypatch.setattr(os, "getegid", lambda: euid)
    spec = RunSpec()
    spec.net, spec.user, spec.fakeroot = net, user, fakeroot
    if by_image:
        spec.user_by_image, spec.userns = True, "host"     # image.runimage.apply_user
    plan = planmod.LaunchPlan(spec)
    planmod._identity(plan, spec, env or {})
    return plan


def test_real_root_defaults_to_a_private_network_with_docker_caps(monkeypatch):
    p = identity(monkeypatch, 0)
    assert p.spec.net == "none" and p.clone_flags & k.CLONE_NEWNET
    assert p.cap_effective == caps.ROOT_DEFAULT and NET_RAW in p.cap_effective
    assert any(n.startswith("network: private namespace") for n in p.notes)
    assert p.warnings == []


def test_real_root_net_host_drops_net_caps_and_says_so_only_in_notes(monkeypatch):
    p = identity(monkeypatch, 0, net="host")
    assert not p.clone_flags & k.CLONE_NEWNET
    assert NET_RAW not in p.cap_effective and NET_BIND_SERVICE not in p.cap_effective
    assert set(caps.ROOT_DEFAULT) - set(p.cap_effective) == {NET_RAW, NET_BIND_SERVICE}
    assert p.warnings == [] and any("--net host" in n for n in p.notes)


@pytest.mark.parametrize("euid,user,fakeroot", [(1000, None, False), (1000, None, True),
                                                (0, (1000, 1000), False)])
def test_a_command_that_is_not_host_root_keeps_the_host_network(monkeypatch, euid, user,
                                                                 fakeroot):
    p = identity(monkeypatch, euid, user=user, fakeroot=fakeroot)
    assert p.spec.net == "host" and not p.clone_flags & k.CLONE_NEWNET
    assert p.cap_effective == (caps.root_caps(True) if fakeroot else ())


def test_real_root_in_a_user_namespace_is_still_host_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    spec = RunSpec()
    spec.userns = "single"
    p = planmod.LaunchPlan(spec)
    planmod._identity(p, spec, {})
    assert spec.net == "none"        # uid 0 inside maps to uid 0 outside


@pytest.mark.parametrize("env,warned", [
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"}, True),
    ({"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}, True),
    ({"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1"}, False),
    ({"SLURM_NTASKS": "4"}, False),                 # a batch script, not a step
])
def test_multi_task_slurm_step_under_root_is_told_about_net_host(monkeypatch, env, warned):
    p = identity(monkeypatch, 0, env=env)
    assert p.spec.net == "none"
    assert bool([w for w in p.warnings if "--net host" in w]) == warned
    assert identity(monkeypatch, 0, net="host", env=env).warnings == []


def test_an_image_user_under_root_gets_a_private_network(monkeypatch):
    """The image's User picked the host uid, not the caller: no host network
    (its daemons on abstract sockets would take the command for that user)."""
    p = identity(monkeypatch, 0, user=(1006, 1006), by_image=True)
    assert p.spec.net == "none" and p.clone_flags & k.CLONE_NEWNET
    assert (p.cmd_uid, p.cap_effective, p.warnings) == (1006, (), [])
    assert [n for n in p.notes if n.startswith("network: ")] == [
        "network: private namespace, loopback only (the command's host uid 1006 is the "
        "image's User, not a uid you chose with --user; --net host shares the host's)"]
    p = identity(monkeypatch, 0, user=(1006, 1006), by_image=True, net="host")
    assert not p.clone_flags & k.CLONE_NEWNET and p.cap_effective == ()
    assert any("uid 1006 (the image's User)" in n for n in p.notes), p.notes
    env = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}
    p = identity(monkeypatch, 0, user=(1006, 1006), by_image=True, env=env)
    assert [w for w in p.warnings if "--net host" in w and "uid 1006" in w], p.warnings


def test_planning_the_identity_again_replaces_the_network_notes(monkeypatch):
    """A .sqsh file's User plans the identity a second time (plan.build):
    only the second decision is reported."""
    env = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2"}
    p = identity(monkeypatch, 0, env=env)
    p.spec.net, p.spec.user = None, (1000, 1000)
    planmod._identity(p, p.spec, env)
    assert p.spec.net == "host"
    assert not [n for n in p.notes if n.startswith("network: ")] and p.warnings == []
