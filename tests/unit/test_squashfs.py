"""FILE.sqsh as IMAGE: how the argument is recognised and the file checked
before anything is mounted, and that `run DIR` loads none of it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusandbox.image import squash as squashfs
from gpusandbox.cli import is_image_ref
from gpusandbox.errors import UsageError

REPO = Path(__file__).resolve().parents[2]


def test_open_file_refuses_what_is_not_a_squashfs_file(tmp_path):
    bad = tmp_path / "bad.sqsh"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(UsageError) as e:
        squashfs.open_file(str(bad))
    assert "not a squashfs file" in e.value.line()
    fifo = tmp_path / "fifo.sqsh"
    os.mkfifo(fifo)
    with pytest.raises(UsageError) as e:   # refused, not waited on
        squashfs.open_file(str(fifo))
    assert "not a regular file" in e.value.line()
    good = tmp_path / "good.sqsh"
    good.write_bytes(b"hsqs" + b"\0" * 100)
    (tmp_path / "link.sqsh").symlink_to(good)
    with pytest.raises(UsageError) as e:
        squashfs.open_file(str(tmp_path / "link.sqsh"))
    assert "symlink" in e.value.line()
    with pytest.raises(UsageError) as e:
        squashfs.open_file(str(tmp_path / "missing.sqsh"))
    assert "not found" in e.value.line()
    fd = squashfs.open_file(str(good))
    try:
        assert os.pread(fd, 4, 0) == b"hsqs"
    finally:
        os.close(fd)


def test_a_directory_named_like_a_squashfs_file_stays_a_directory(tmp_path):
    d = tmp_path / "root.sqsh"
    d.mkdir()
    assert not squashfs.is_squashfs_arg(str(d))
    assert squashfs.is_squashfs_arg(str(tmp_path / "x.squashfs"))


def test_an_existing_relative_sqsh_is_a_file_not_a_store_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "img.sqsh").write_bytes(b"hsqs")
    assert not is_image_ref("img.sqsh")
    assert is_image_ref("ubuntu:22.04")


def test_run_of_a_directory_loads_no_squashfs_module(tmp_path):
    """plan.build of a directory imports neither squashfs module; one of a
    .sqsh does (and refuses this one, which is not squashfs)."""
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (tmp_path / "bad.sqsh").write_bytes(b"junk")
    code = (
        "import sys\n"
        "from gpusandbox.cli import parse_run_args\n"
        "from gpusandbox import plan\n"
        "from gpusandbox.errors import UsageError\n"
        f"plan.build(parse_run_args([{str(root)!r}, 'true']), {{'PATH': '/bin'}})\n"
        "print(sorted(m for m in sys.modules if 'squash' in m))\n"
        "try:\n"
        f"    plan.build(parse_run_args([{str(tmp_path / 'bad.sqsh')!r}, 'true']), {{}})\n"
        "except UsageError as e:\n"
        "    print(e.line())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(REPO))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "[]", out.stdout
    assert "not a squashfs file" in lines[1], out.stdout
