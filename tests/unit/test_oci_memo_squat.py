"""A rootless caller's /tmp/gpusandbox-<uid> taken first by another user (a
directory of theirs, or a link): base_dir has no base, the memo none, and
the filter a fresh directory of its own (its --remove nothing to do); the
other user's directory is never used.  The uid is a made-up one, so the
name is this test's alone."""
import os
import shutil

import pytest

from gpusandbox.oci import filter as ocifilter
from gpusandbox.oci import memo

FAKE_UID = 3999999917
NAME = f"/tmp/gpusandbox-{FAKE_UID}"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chowns to another uid")


@pytest.fixture
def taken(monkeypatch):
    monkeypatch.setattr(memo, "real_root", lambda: False)
    monkeypatch.setattr(memo, "host_uid", lambda: FAKE_UID)
    made = []
    yield made
    for p in [NAME] + made:
        if os.path.islink(p) or os.path.isfile(p):
            os.unlink(p)
        elif os.path.isdir(p):
            shutil.rmtree(p)


def _theirs(path):
    os.mkdir(path, 0o777)
    os.chmod(path, 0o777)
    os.chown(path, 12345, 12345)


def test_the_callers_own_directory_is_used(taken):
    assert memo.base_dir() == (NAME, False)
    assert memo.directory() == NAME + "/oci-memo"
    assert ocifilter.state_dir({}) == NAME + "/oci"


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
    assert memo.base_dir() == (None, False)
    assert memo.directory() is None          # no memo: discovery every time
    d = ocifilter.state_dir({})
    taken.append(d)
    assert d.startswith(NAME + ".") and d != theirs
    st = os.lstat(d)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700
    assert ocifilter.state_dir({}, fresh=False) is None
    # an old config's --remove finds nothing of the caller's to remove
    os.mkdir(os.path.join(theirs, "c-0123456789abcdef"))
    assert ocifilter.remove("c-0123456789abcdef") == 0
    assert os.listdir(theirs) == ["c-0123456789abcdef"]
    assert os.lstat(NAME).st_uid == (12345 if how == "dir" else 0)


def test_a_filter_create_goes_on_in_a_fresh_directory(taken, monkeypatch, capsysbinary):
    """No GPU asked for: the config comes back as it was, and the fresh
    directory is gone again with the create."""
    import io
    _theirs(NAME)
    mine = lambda: {n for n in os.listdir("/tmp") if n.startswith(f"gpusandbox-{FAKE_UID}.")}
    data = b'{"ociVersion": "1.0.2", "process": {"args": ["true"], "env": ["PATH=/bin"]}}'
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert ocifilter.main([]) == 0
    assert capsysbinary.readouterr().out == data
    assert mine() == set()
    assert os.listdir(NAME) == []
