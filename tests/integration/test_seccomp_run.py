"""--seccomp FILE through `gpusandbox run`: a profile of the caller's is the
command's alone (stages/command.spawnable keeps it off pid 1)."""
import os

from .test_run_core import sh


def test_a_profile_of_the_callers_is_the_commands_not_pid_1s(runner, rootfs, shared_tmp):
    """--seccomp FILE: a profile of the caller's filters the command only; the
    forked command stage installs it (stages/command.spawnable), so one that
    denies what pid 1 waits and forwards signals with still gives the
    command's status, and the command sees its own rules."""
    import json
    from gpusandbox.linux import seccomp
    with open(seccomp.profile_path("default")) as f:
        prof = json.load(f)
    # pid 1 takes its signals with rt_sigtimedwait and forwards them with kill;
    # the shell waits for mkdir with wait4, which stays allowed.
    denied = {"kill", "rt_sigtimedwait", "mkdirat", "mkdir"}
    for rule in prof["syscalls"]:
        rule["names"] = [n for n in rule["names"] if n not in denied]
    prof["syscalls"] = [r for r in prof["syscalls"] if r["names"]]
    prof["syscalls"].append({"names": sorted(denied), "action": "SCMP_ACT_ERRNO",
                             "errnoRet": 1})
    os.chmod(shared_tmp, 0o755)
    path = shared_tmp / "mine.json"
    path.write_text(json.dumps(prof))
    os.chmod(path, 0o644)
    r = sh(runner, rootfs, "mkdir /tmp/x || echo refused; exit 7", "--seccomp", str(path))
    assert r.returncode == 7, r.stderr
    assert "refused" in r.stdout and "Operation not permitted" in r.stderr
