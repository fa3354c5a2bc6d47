"""The test install: the CLI installed (not imported from the checkout) into
BASE/venv, a venv every user can run, with the test hooks enabled.  Used by
the integration suite (tests/integration/conftest.py) and by scripts/soak,
so both run the same kind of install.  No pytest here.

The venv is built from Debian's /usr/bin/python3 so that the unprivileged test
user can execute it wherever the checkout lives; a stamp of the source tree's
hash skips reinstalling when nothing changed, and a file lock serialises
concurrent callers (xdist workers, a soak beside the suite).
"""
import fcntl
import hashlib
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BASE = "/opt/gpusandbox-test"


def base_from_env():
    return Path(os.environ.get("GSBX_TEST_BASE", DEFAULT_BASE))


def _src_hash():
    h = hashlib.sha256()
    for top in ("gpusandbox", "seccomp", "bin", "pyproject.toml", "setup.py"):
        p = REPO / top
        files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file()
                                                and "__pycache__" not in x.parts)
        for f in files:
            h.update(str(f.relative_to(REPO)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _dependencies():
    import tomllib
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["dependencies"]


def ensure(base, timeout=None):
    """Install or refresh the CLI under `base`; returns the venv's path.
    Needs root (the hook's marker must be root-owned).  timeout: seconds
    each step may take (subprocess.TimeoutExpired past it)."""
    base = Path(base)
    venv = base / "venv"
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    with open(base / ".lock", "w") as lock:
        _lock(lock, timeout and 3 * timeout)
        if not (venv / "bin" / "python").exists():
            subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True,
                           timeout=timeout)
        stamp = base / "stamp"
        want = _src_hash()
        if not stamp.exists() or stamp.read_text() != want:
            # The project's dependencies, read from pyproject.toml, so a venv
            # made by an earlier tree gets the ones added since (pip skips
            # what is already satisfied without asking the index).
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *_dependencies(),
                            "setuptools>=61", "wheel"], check=True, timeout=timeout)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps",
                            "--no-build-isolation", "--force-reinstall", str(REPO)],
                           check=True, cwd="/", timeout=timeout)
            stamp.write_text(want)
        enable_test_hooks(venv)
    return venv


def _lock(f, timeout):
    """Wait for the install lock (for at most `timeout` seconds when given:
    whoever holds it runs the same three bounded steps)."""
    import time
    end = time.monotonic() + (timeout or 0)
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (fcntl.LOCK_NB if timeout else 0))
            return
        except BlockingIOError:
            if time.monotonic() > end:
                raise TimeoutError(f"{f.name}: still locked after {timeout} s") from None
            time.sleep(0.2)


def enable_test_hooks(venv):
    """The test install honours GPUSANDBOX_TEST_PAUSE (the kill -9 at each
    setup stage tests): a root-owned marker next to the installed package,
    which no other install has (gpusandbox.testhook.pause_hook_enabled)."""
    from gpusandbox.testhook import TEST_MARKER
    for pkg in Path(venv).glob("lib/python3*/site-packages/gpusandbox"):
        marker = pkg / TEST_MARKER
        if not marker.exists():
            marker.write_text("GPUSANDBOX_TEST_PAUSE is honoured by this install (test suite)\n")
        os.chown(marker, 0, 0)
        os.chmod(marker, 0o644)
