"""spawn_init's failure paths give back the pipes it made: a pod member's
launcher (and the OCI runtime's create) lives on after a failed clone, and
each leaked pair would stay open for the process's lifetime."""
import os
import types

import pytest

from gpusandbox.errors import SandboxError
from gpusandbox.stages import parent


def _fds():
    return set(os.listdir("/proc/self/fd"))


def _plan(rootfd=-1):
    return types.SimpleNamespace(clone_flags=0, rootfd=rootfd, seccomp=None)


_CG = types.SimpleNamespace(dirfd=-1, fds=())


def test_clone_failure_closes_the_pipes(monkeypatch):
    def fail(flags, cgroup_fd):
        raise OSError(1, "Operation not permitted")
    monkeypatch.setattr(parent.k, "clone_fork", fail)
    before = _fds()
    with pytest.raises(SandboxError) as e:
        parent.spawn_init(_plan(), _CG, None, None)
    assert "clone3" in str(e.value.what)
    assert _fds() == before


def test_pod_clone_failure_closes_the_pipes():
    class Member:
        def clone(self, flags, cgroup_fd, err_w):
            raise SandboxError("joining the pod's namespaces", "Operation not permitted")
    before = _fds()
    with pytest.raises(SandboxError):
        parent.spawn_init(_plan(), _CG, None, None, member=Member(), hold=True)
    assert _fds() == before


def _forked(flags, cgroup_fd):
    pid = os.fork()
    if pid == 0:
        os._exit(0)          # stands for init: never runs the launcher's code
    return pid


def test_pidfd_failure_closes_the_pipes(monkeypatch):
    monkeypatch.setattr(parent.k, "clone_fork", _forked)

    def no_pidfd(pid):
        raise OSError(24, "Too many open files")
    monkeypatch.setattr(parent, "_Child", no_pidfd)
    before = _fds()
    with pytest.raises(OSError):
        parent.spawn_init(_plan(), _CG, None, None, hold=True)
    assert _fds() == before


def test_register_failure_closes_the_pipes_and_kills_init(monkeypatch):
    reaped = []

    class Child:
        def __init__(self, pid):
            self.pid, self.fd = pid, -1

        def kill_and_reap(self):
            reaped.append(os.waitpid(self.pid, 0)[0])

    class Member:
        clone = staticmethod(lambda flags, cgroup_fd, err_w: _forked(flags, cgroup_fd))

        def register(self, fd):
            raise OSError(32, "Broken pipe")
    monkeypatch.setattr(parent, "_Child", Child)
    before = _fds()
    with pytest.raises(OSError):
        parent.spawn_init(_plan(), _CG, None, None, member=Member(), hold=True)
    assert len(reaped) == 1
    assert _fds() == before
