"""fcntl(F_SETLEASE) is refused by the shipped profiles (a root command could
otherwise lease host-owned files it sees and stall host processes); every
other fcntl command passes."""
import pytest

from .test_seccomp import ALLOW, ARCHES, EPERM, check, prog_for

F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_SETLK = 0, 1, 2, 3, 4, 6
F_SETLEASE, F_GETLEASE, F_NOTIFY, F_ADD_SEALS = 1024, 1025, 1026, 1033
F_WRLCK = 1


@pytest.mark.parametrize("profile", ["default", "profiling"])
@pytest.mark.parametrize("arch", ARCHES)
def test_setlease_refused_other_commands_pass(profile, arch):
    prog = prog_for(profile, arch)
    assert check(prog, arch, "fcntl", (3, F_SETLEASE, F_WRLCK)) == EPERM
    assert check(prog, arch, "fcntl", (3, F_SETLEASE, 0)) == EPERM
    # The kernel reads cmd as an unsigned int: upper bits cannot smuggle it.
    assert check(prog, arch, "fcntl", (3, (1 << 32) | F_SETLEASE, F_WRLCK)) == EPERM
    for cmd in (F_DUPFD, F_GETFD, F_SETFD, F_GETFL, F_SETFL, F_SETLK, F_GETLEASE, F_NOTIFY,
                F_ADD_SEALS, F_SETLEASE + (1 << 16)):
        assert check(prog, arch, "fcntl", (3, cmd, 0)) == ALLOW, cmd
