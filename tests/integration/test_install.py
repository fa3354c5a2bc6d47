"""A regular (non-editable) install, as README tells users to make one: pip
builds the project quietly (no packaging warnings), the installed CLI can
write a simulated GPU host, whose C sources ship as package data, and the
man pages and completion scripts land in the prefix's share/."""
import json
import os
import re
import shutil
import subprocess

import pytest

from .conftest import REPO

SHIPPED = ("gpusandbox", "seccomp", "bin", "pyproject.toml", "setup.py", "README.md")


@pytest.fixture
def source_copy(tmp_path):
    """The project's sources alone: pip's in-tree build writes build/ and
    *.egg-info next to them, which must not race other tests' installs."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SHIPPED:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(p, src / name)
    return src


def test_regular_install_is_quiet_and_can_create_a_sim_host(source_copy, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("sim create makes device nodes: needs root")
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True)
    # Without PYTHONDONTWRITEBYTECODE distutils has nothing to say about
    # byte-compiling; every warning left is about our packaging.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # -v: pip shows the build backend's own output (newer pips show its
    # warnings even without it).  Build isolation: the setuptools a user gets.
    r = subprocess.run([str(venv / "bin" / "pip"), "install", "-v", "--no-deps",
                        str(source_copy)], capture_output=True, text=True, env=env,
                       cwd=str(tmp_path), timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    warnings = [ln for ln in out.splitlines() if re.search(r"warn", ln, re.I)]
    assert not warnings, "\n".join(warnings)
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert (site / "gpusandbox" / "sim" / "src" / "simcommon.c").is_file()
    # README's last step: setuptools out of the venv (its .pth file runs at
    # every interpreter start); everything below runs without it.
    r = subprocess.run([str(venv / "bin" / "pip"), "uninstall", "-qy", "setuptools"],
                       capture_output=True, text=True, cwd=str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    assert not list(site.glob("*.pth")) and not (site / "setuptools").exists()
    # Generated at build time from the parsers, installed under share/: what
    # the installed CLI prints, and man finds them from the venv's bin/ on PATH.
    cli = str(venv / "bin" / "gpusandbox")
    for rel, args in (("man/man1/gpusandbox.1", ["man"]),
                      ("man/man1/gpusandbox-run.1", ["man", "run"]),
                      ("bash-completion/completions/gpusandbox", ["completion", "bash"]),
                      ("zsh/site-functions/_gpusandbox", ["completion", "zsh"])):
        printed = subprocess.run([cli, *args], capture_output=True, text=True, timeout=60)
        assert (venv / "share" / rel).read_text() == printed.stdout, rel
    if shutil.which("man"):
        r = subprocess.run(["man", "-w", "gpusandbox-run"], capture_output=True, text=True,
                           env={"PATH": f"{venv}/bin:/usr/bin:/bin"}, timeout=60)
        assert r.stdout.strip() == str(venv / "share/man/man1/gpusandbox-run.1"), r.stderr
    host = tmp_path / "sim"
    r = subprocess.run([str(venv / "bin" / "gpusandbox"), "sim", "create", str(host),
                        "--gpus", "2", "--json"], capture_output=True, text=True,
                       cwd="/", timeout=300)
    try:
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout)
        assert [g["index"] for g in info["gpus"]] == [0, 1]
        smi = subprocess.run([str(host / "usr" / "bin" / "nvidia-smi"), "-L"],
                             capture_output=True, text=True, timeout=60)
        assert smi.returncode == 0, smi.stderr
        assert smi.stdout.count("GPU ") == 2, smi.stdout
    finally:
        subprocess.run([str(venv / "bin" / "gpusandbox"), "sim", "destroy", str(host)],
                       capture_output=True)
