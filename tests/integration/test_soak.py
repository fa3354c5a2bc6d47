"""scripts/soak as CI runs it: 200 launches mixing root, rootless, GPU and
plain, a share of them SIGKILLed in setup or while running, and an audit that
finds nothing left (mounts, cgroups v1/v2, BPF programs, processes, temp
files, unexpected fds).  And the soak against an install without the test
hook: it skips the fate it cannot run, and ends."""
import os
import re
import shutil
import signal
import subprocess

import pytest

from .conftest import BASE, REPO, VENV, comm, pids_with

pytestmark = [pytest.mark.root, pytest.mark.slow]

SOAK = str(REPO / "scripts" / "soak")


def test_soak_200_launches_leave_nothing(cli, test_user):
    # No --gpusandbox: the soak runs its own test install, here the suite's.
    r = subprocess.run([SOAK, "--launches", "200", "--concurrency", "4",
                        "--install-base", str(BASE)], capture_output=True, text=True,
                       timeout=900, cwd="/")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    audit = re.search(r"^soak: audit (.*)$", r.stdout, re.M)
    assert audit, out[-4000:]
    counts = dict(kv.split("=") for kv in audit.group(1).split())
    assert set(counts) >= {"mounts", "cgroups", "bpf", "processes", "tempfiles", "fds",
                           "stuck", "leftovers"}
    assert all(v == "0" for v in counts.values()), audit.group(0)
    launched = re.search(r"^soak: 200 launches in .*complete=(\d+) kill-running=(\d+) "
                         r"kill-setup=(\d+) kill-stage=(\d+)", r.stdout, re.M)
    assert launched and all(int(n) > 0 for n in launched.groups()), r.stdout


@pytest.fixture
def hookless_cli(cli, shared_tmp):
    """This tree's CLI as any install but the test one has it: the installed
    package without the hook's marker, beside an entry of its own (the
    script's directory comes first on sys.path)."""
    from gpusandbox.testhook import TEST_MARKER
    pkg = next(VENV.glob("lib/python3*/site-packages/gpusandbox"))
    shutil.copytree(pkg, shared_tmp / "gpusandbox",
                    ignore=shutil.ignore_patterns(TEST_MARKER, "__pycache__"))
    entry = shared_tmp / "gpusandbox-plain"
    entry.write_text(f"#!{VENV}/bin/python3\nimport sys\n"
                     "from gpusandbox.__main__ import main\nsys.exit(main())\n")
    os.chmod(entry, 0o755)
    return str(entry)


def test_soak_skips_kill_stage_without_the_pause_hook(hookless_cli, test_user):
    """Seed 28 draws kill-stage first: a soak that waited for "paused at" from
    an install that never pauses would wait for ever."""
    p = subprocess.Popen([SOAK, "--launches", "8", "--concurrency", "2", "--seed", "28",
                          "--gpusandbox", hookless_cli], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd="/")
    try:
        out, _ = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        p.kill()
        out, _ = p.communicate()
        _kill_launchers(out)
        pytest.fail(f"the soak did not end: {out[-2000:]}")
    assert p.returncode == 0, out[-4000:]
    assert re.search(r"^soak: note: kill-stage skipped: \S+ does not honour "
                     r"GPUSANDBOX_TEST_PAUSE", out, re.M), out
    launched = re.search(r"^soak: 8 launches in .*: (.*);", out, re.M)
    assert launched and "kill-stage" not in launched.group(1), out
    assert re.search(r"^soak: audit .* leftovers=0$", out, re.M), out


def _kill_launchers(out):
    """What a hung soak left: its launchers (their reapers then remove the
    leaves; a reaper itself is left to do that)."""
    token = re.search(r"token (\d+)", out)
    for pid in pids_with(token.group(1)) if token else []:
        if comm(pid) != "gpusandbox-reap":
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
