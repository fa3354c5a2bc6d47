"""Named containers of the SPANK plugin: one writer, nothing left on failure."""
import os

import pytest

from gpusandbox.errors import UsageError
from gpusandbox.hpc import spankname as sn


def env(tmp_path, step="0"):
    return {"GPUSANDBOX_CONTAINERS": str(tmp_path / "c"), "SLURM_JOB_ID": "7",
            "SLURM_STEP_ID": step}


def fill(tmp):
    os.makedirs(tmp + "/rootfs/etc")
    open(tmp + "/rootfs/etc/x", "w").close()


def test_take_creates_once_then_enter(tmp_path):
    e = env(tmp_path)
    path = sn.take(e, "a", fill)
    assert os.path.isfile(path + "/rootfs/etc/x")
    assert sn.take(e, "a", lambda tmp: pytest.fail("created twice")) == path
    assert sn.enter(e, "a") == path
    assert sn.names(e) == ["a"]


def test_a_running_step_keeps_the_container(tmp_path):
    sn.take(env(tmp_path, "0"), "a", fill)
    sn.enter(env(tmp_path, "0"), "a")          # its descriptor stays open: held
    with pytest.raises(UsageError, match="in use by another step"):
        sn.take(env(tmp_path, "1"), "a", fill)


def test_a_step_that_lost_the_container_stops(tmp_path):
    sn.take(env(tmp_path, "0"), "a", fill)
    sn.take(env(tmp_path, "1"), "a", fill)     # before step 0's tasks started
    with pytest.raises(UsageError, match="taken by step 7.1"):
        sn.enter(env(tmp_path, "0"), "a")


def test_failed_creation_leaves_nothing(tmp_path):
    def broken(tmp):
        fill(tmp)
        raise UsageError("no image")
    with pytest.raises(UsageError):
        sn.take(env(tmp_path), "a", broken)
    assert os.listdir(tmp_path / "c") == []


def test_remove_read_only_tree(tmp_path):
    e = env(tmp_path)
    path = sn.take(e, "a", fill)
    os.chmod(path + "/rootfs/etc", 0o555)
    sn.remove(e, "a")
    assert os.listdir(tmp_path / "c") == []
    with pytest.raises(UsageError, match="no container named a"):
        sn.remove(e, "a")


@pytest.mark.parametrize("name", ["", ".x", "a/b", "x" * 65, "a b"])
def test_bad_names(tmp_path, name):
    with pytest.raises(UsageError):
        sn.take(env(tmp_path), name, fill)


@pytest.mark.parametrize("value, want", [
    ("a", ("a", "auto")), ("a:auto", ("a", "auto")), ("a:create", ("a", "create")),
    ("a:exec", ("a", "exec")), ("a:no_exec", ("a", "no_exec")), ("a:", ("a", "auto")),
])
def test_split_name_flag(value, want):
    assert sn.split(value) == want


@pytest.mark.parametrize("value", ["a:ro", ":exec", "a:exec:x"])
def test_split_refuses(value):
    with pytest.raises(UsageError):
        sn.split(value)


def test_create_flag_refuses_an_existing_container(tmp_path):
    e = env(tmp_path)
    sn.take(e, "a", fill, "create")
    with pytest.raises(UsageError, match="a:create: the container already exists"):
        sn.take(env(tmp_path, "1"), "a", fill, "create")
    assert sn.take(env(tmp_path, "1"), "a", fill, "no_exec")    # reused as auto


def test_exec_flag_wants_a_running_container(tmp_path):
    with pytest.raises(UsageError, match="a:exec: the container is not running"):
        sn.take(env(tmp_path), "a", fill, "exec")
    assert os.listdir(tmp_path / "c") == []         # nothing made
    sn.take(env(tmp_path, "0"), "a", fill)
    assert sn.holder(env(tmp_path, "1"), "a") is None   # taken, but no task runs in it
    assert sn.enter(env(tmp_path, "0"), "a")        # step 0 runs in it


def test_holder_is_a_running_step_of_the_job(tmp_path):
    """Step 1 of the job joins the container step 0's tasks run in; step 0's
    own tasks, and a step of another job, do not."""
    sn.take(env(tmp_path, "0"), "a", fill)
    sn.enter(env(tmp_path, "0"), "a")               # step 0's task holds it
    assert sn.holder(env(tmp_path, "1"), "a") == "0"
    assert sn.holder(env(tmp_path, "0"), "a") is None
    assert sn.enter(env(tmp_path, "0"), "a")        # the probe never stops a sibling task
    other = dict(env(tmp_path, "1"), SLURM_JOB_ID="8")
    assert sn.holder(other, "a") is None
    with pytest.raises(UsageError, match="a:exec: the container runs in step 7.0, not a "
                                         "step of this job"):
        sn.take(other, "a", fill, "exec")
    assert sn.holder(env(tmp_path, "1"), "absent") is None
    assert sorted(os.listdir(tmp_path / "c")) == ["a", "a.lock", "a.owner"]


def test_another_users_store_is_one_line(tmp_path):
    top = tmp_path / "c"
    top.mkdir()
    (top / "a.lock").mkdir()                        # cannot be opened as the lock
    (top / "a.owner").write_text("7.0\n")
    with pytest.raises(UsageError, match="cannot open the container's lock"):
        sn.holder(env(tmp_path, "1"), "a")
