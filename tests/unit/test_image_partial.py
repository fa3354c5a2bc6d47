"""Partial blob downloads in the store (image/partial.py): which kept files
a resumable source may go on from, and what a failure leaves."""
import hashlib
import os

import pytest

from gpusandbox.image import partial, store as storemod
from gpusandbox.image.digest import ImageError
from gpusandbox.image.storegc import prune

DATA = os.urandom(3000)
DESC = {"digest": "sha256:" + hashlib.sha256(DATA).hexdigest(), "size": len(DATA)}


class Source:
    """Resumable: writes from the offset `out` already holds (as the
    registry client does with Range), or fails after `cut` bytes."""
    resumable = True

    def __init__(self, data=DATA, cut=None, resumable_error=True):
        self.data, self.cut, self.err = data, cut, resumable_error
        self.offsets = []

    def blob(self, desc, out):
        v = out.prefix()
        self.offsets.append(v.seen)
        end = self.cut if self.cut is not None else len(self.data)
        out.write(self.data[v.seen:end])
        if self.cut is not None:
            e = ImageError("cut")
            e.resumable = self.err
            raise e


@pytest.fixture
def st(tmp_path):
    s = storemod.Store(str(tmp_path / "store"))
    yield s
    s.close()


def _part(st):
    return os.path.join(st.root, partial.rel_name(DESC["digest"]))


def _seed(st, data, mode=0o600):
    with open(_part(st), "wb") as f:
        f.write(data)
    os.chmod(_part(st), mode)


def test_cut_keeps_prefix_and_next_fetch_resumes(st):
    with pytest.raises(ImageError):
        st.ensure_blob(Source(cut=1000), DESC)
    assert os.path.getsize(_part(st)) == 1000 and not st.has_blob(DESC)
    src = Source()
    assert st.ensure_blob(src, DESC)
    assert src.offsets == [1000] and st.read_blob(DESC["digest"], 1 << 20) == DATA
    assert not os.path.exists(_part(st))


def test_non_transfer_failure_removes_partial(st):
    with pytest.raises(ImageError):
        st.ensure_blob(Source(cut=1000, resumable_error=False), DESC)
    assert not os.path.exists(_part(st))


def test_wrong_prefix_restarts_from_zero_once(st):
    _seed(st, b"\0" * 1000)
    src = Source()
    assert st.ensure_blob(src, DESC)
    assert src.offsets == [1000, 0] and st.read_blob(DESC["digest"], 1 << 20) == DATA


def test_wrong_blob_fails_and_leaves_nothing(st):
    _seed(st, DATA[:1000])
    with pytest.raises(ImageError) as e:
        st.ensure_blob(Source(data=DATA[:-1] + b"x"), DESC)
    assert "does not match" in e.value.line()
    assert not os.path.exists(_part(st)) and not st.has_blob(DESC)


@pytest.mark.parametrize("how", ["mode", "longer", "symlink", "hardlink", "dir"])
def test_unusable_partial_is_discarded(st, tmp_path, how):
    if how == "mode":
        _seed(st, DATA[:1000], 0o644)
    elif how == "longer":
        _seed(st, DATA + b"more")
    elif how == "symlink":
        (tmp_path / "elsewhere").write_bytes(DATA[:1000])
        os.symlink(tmp_path / "elsewhere", _part(st))
    elif how == "hardlink":
        _seed(st, DATA[:1000])
        os.link(_part(st), tmp_path / "second")
    else:
        os.mkdir(_part(st))
    src = Source()
    if how == "dir":
        # a directory under the name is not removed by unlink: refused, one line
        with pytest.raises(ImageError):
            st.ensure_blob(src, DESC)
        return
    assert st.ensure_blob(src, DESC)
    assert src.offsets == [0] and st.read_blob(DESC["digest"], 1 << 20) == DATA
    if how == "symlink":
        assert (tmp_path / "elsewhere").read_bytes() == DATA[:1000]


def test_other_users_partial_is_discarded(st):
    if os.geteuid() != 0:
        pytest.skip("needs root to plant another user's file")
    _seed(st, DATA[:1000])
    os.chown(_part(st), 65534, 65534)
    src = Source()
    assert st.ensure_blob(src, DESC)
    assert src.offsets == [0]


def test_clean_staging_keeps_partials_prune_removes_them(st):
    _seed(st, DATA[:1000])
    st.clean_staging()
    assert os.path.exists(_part(st))
    prune(st)
    assert not os.path.exists(_part(st))


def test_whole_blob_kept_is_published_without_a_request(st):
    _seed(st, DATA)
    src = Source()
    assert st.ensure_blob(src, DESC)
    assert src.offsets == [] and st.read_blob(DESC["digest"], 1 << 20) == DATA
    # ... and a wrong one of full length is fetched again from the start.
    st2_part = _part(st)
    os.unlink(os.path.join(st.root, st.blob_path(DESC["digest"])))
    _seed(st, b"x" * len(DATA))
    assert st.ensure_blob(src, DESC)
    assert src.offsets == [0] and not os.path.exists(st2_part)
