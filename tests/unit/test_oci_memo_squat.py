"""A rootless caller's /tmp/gpusandbox-<uid> taken first by another user (a
directory of theirs, or a link): the other user's entry is never used.  The
caller's base becomes a fresh directory under an unguessable name, recorded
in its own state directory so that later calls (the memo, the filter, pods,
MPS) meet there; without a home to record it in, the memo and the filter get
a fresh one per call and the parts that need a meeting point fail with a
hint.  The uid is a made-up one, so the names are this test's alone."""
import os
import shutil

import pytest

from gpusandbox import rundir
from gpusandbox.errors import UsageError
from gpusandbox.oci import filter as ocifilter
from gpusandbox.oci import memo

# Made up, and this worker's own (xdist runs this module's tests side by
# side: one shared name would be one test's directory in another's way).
FAKE_UID = 3900000000 + os.getpid() % 1000000
NAME = f"/tmp/gpusandbox-{FAKE_UID}"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns to another uid")


def _mine():
    return {n for n in os.listdir("/tmp") if n.startswith(f"gpusandbox-{FAKE_UID}.")}


@pytest.fixture
def taken(monkeypatch, tmp_path):
    monkeypatch.setattr(rundir, "real_root", lambda: False)
    monkeypatch.setattr(rundir, "host_uid", lambda: FAKE_UID)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    made = []
    yield made
    for p in [NAME] + made + ["/tmp/" + n for n in _mine()]:
        if os.path.islink(p) or os.path.isfile(p):
            os.unlink(p)
        elif os.path.isdir(p):
            shutil.rmtree(p)


def _theirs(path):
    os.mkdir(path, 0o777)
    os.chmod(path, 0o777)
    os.chown(path, 12345, 12345)


def test_the_callers_own_directory_is_used(taken):
    assert memo.directory() == NAME + "/oci-memo"
    assert ocifilter.state_dir(os.environ) == NAME + "/oci"
    assert rundir.part("pods") == NAME + "/pods"
    assert os.lstat(NAME).st_mode & 0o7777 == 0o700


def test_an_old_mode_of_the_callers_own_is_repaired(taken):
    os.mkdir(NAME, 0o755)
    os.chmod(NAME, 0o755)
    assert rundir.part("pods") == NAME + "/pods"
    assert os.lstat(NAME).st_mode & 0o7777 == 0o700


@pytest.mark.parametrize("how", ["dir", "link"])
def test_a_taken_name_is_not_used(taken, how):
    if how == "dir":
        _theirs(NAME)
        theirs = NAME
    else:
        theirs = NAME + ".theirs"
        taken.append(theirs)
        _theirs(theirs)
        os.symlink(theirs, NAME)
    d = memo.directory()
    base = os.path.dirname(d)
    assert base.startswith(NAME + ".") and base != theirs and d.endswith("/oci-memo")
    st = os.lstat(base)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700
    # recorded: every later part meets in the same one
    assert ocifilter.state_dir(os.environ) == base + "/oci"
    assert ocifilter.state_dir(os.environ, fresh=False) == base + "/oci"
    assert rundir.part("pods") == base + "/pods"
    # an old config's --remove finds nothing of the caller's in theirs
    os.mkdir(os.path.join(theirs, "c-0123456789abcdef"))
    assert ocifilter.remove("c-0123456789abcdef") == 0
    assert os.listdir(theirs) == ["c-0123456789abcdef"]
    assert os.lstat(NAME).st_uid == (12345 if how == "dir" else 0)


def test_without_a_home_to_record_in(taken, monkeypatch):
    _theirs(NAME)
    monkeypatch.setattr(rundir, "_pointer_path", lambda environ: None)
    assert memo.directory() is None          # no memo: discovery every time
    a, b = ocifilter.state_dir(os.environ), ocifilter.state_dir(os.environ)
    assert a != b and a.startswith(NAME + ".") and b.startswith(NAME + ".")
    assert ocifilter.state_dir(os.environ, fresh=False) is None
    with pytest.raises(UsageError) as e:
        rundir.part("pods")
    assert "XDG_RUNTIME_DIR" in e.value.hint


def test_a_filter_create_goes_on_in_a_fresh_directory(taken, monkeypatch, capsysbinary):
    """No GPU asked for: the config comes back as it was, and the
    container's directory is gone again with the create."""
    import io
    _theirs(NAME)
    data = b'{"ociVersion": "1.0.2", "process": {"args": ["true"], "env": ["PATH=/bin"]}}'
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert ocifilter.main([]) == 0
    assert capsysbinary.readouterr().out == data
    assert all(not os.path.exists(f"/tmp/{n}/oci") for n in _mine())
    assert os.listdir(NAME) == []
