"""--container-save of the SPANK plugin: the target's checks, the squashfs
written atomically from a container directory, the step's own container."""
import json
import os
import shutil
import subprocess

import pytest

from gpusandbox.errors import UsageError
from gpusandbox.hpc import spanksave as ss

needs_mksquashfs = pytest.mark.skipif(shutil.which("mksquashfs") is None,
                                      reason="mksquashfs is not installed")


def env(tmp_path, save, **kw):
    return {"GPUSANDBOX_CONTAINERS": str(tmp_path / "c"), "SLURM_JOB_ID": "7",
            "SLURM_STEP_ID": "0", "PWD": str(tmp_path), "GPUSANDBOX_SPANK_SAVE": save, **kw}


def test_target_is_relative_to_the_job_directory(tmp_path):
    assert ss.target(env(tmp_path, "out/x.sqsh")) == str(tmp_path / "out" / "x.sqsh")
    assert ss.target(env(tmp_path, "/abs/x.sqsh")) == "/abs/x.sqsh"
    with pytest.raises(UsageError, match="no working directory"):
        ss.target(env(tmp_path, "x.sqsh", PWD=""))


@needs_mksquashfs
def test_check_refuses_what_cannot_be_written(tmp_path):
    ss.check(env(tmp_path, "x.sqsh"))
    with pytest.raises(UsageError, match="no directory"):
        ss.check(env(tmp_path, "absent/x.sqsh"))
    (tmp_path / "d.sqsh").mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        ss.check(env(tmp_path, "d.sqsh"))
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(UsageError, match="is not writable"):
            ss.check(env(tmp_path, "ro/x.sqsh"))


def _bundle(path):
    os.makedirs(path / "rootfs" / "etc")
    (path / "rootfs" / "etc" / "state").write_text("saved\n")
    (path / "config.json").write_text(json.dumps(
        {"process": {"env": ["PATH=/usr/bin", "A=1"], "cwd": "/etc", "args": ["sh"]}}))


@needs_mksquashfs
def test_write_bundle_carries_its_config(tmp_path):
    _bundle(tmp_path / "b")
    out = tmp_path / "out.sqsh"
    ss.write(str(tmp_path / "b"), str(out))
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []    # no temporary
    got = tmp_path / "un"
    subprocess.run(["unsquashfs", "-no-xattrs", "-d", str(got), str(out)], check=True,
                   capture_output=True)
    assert (got / "etc" / "state").read_text() == "saved\n"
    conf = json.loads((got / ".gpusandbox" / "config.json").read_text())["config"]
    assert conf == {"Env": ["PATH=/usr/bin", "A=1"], "WorkingDir": "/etc", "Cmd": ["sh"]}


@needs_mksquashfs
def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    out = tmp_path / "out.sqsh"
    out.write_text("old")
    with pytest.raises(UsageError, match="cannot write"):
        ss.write(str(tmp_path / "absent"), str(out))
    assert out.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["out.sqsh"]


@needs_mksquashfs
def test_unnamed_save_uses_and_removes_the_step_container(tmp_path):
    e = env(tmp_path, "s.sqsh")
    path = ss.create(e, lambda tmp: _bundle(type(tmp_path)(tmp)))
    assert path == ss.step_container(e) and os.path.isdir(path + "/rootfs")
    ss.save(e)
    assert not os.path.exists(path) and (tmp_path / "s.sqsh").stat().st_size > 0
    assert os.listdir(tmp_path / "c") == []
