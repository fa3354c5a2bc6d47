"""scripts/test-users picks the test user's subordinate range clear of every
range already in /etc/subuid and /etc/subgid (machines that ran other things
before have entries of their own)."""
import importlib.machinery
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "test-users"


def _load():
    loader = importlib.machinery.SourceFileLoader("test_users_script", str(SCRIPT))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _overlaps(a, n, b, m):
    return a < b + m and b < a + n


def test_free_range_on_an_empty_host():
    assert _load().free_start([]) == 100000


def test_free_range_avoids_every_existing_range(tmp_path):
    tu = _load()
    (tmp_path / "subuid").write_text("alice:100000:65536\n1001:165536:65536\nbad line\n"
                                     "bob:300000:1000000\n")
    (tmp_path / "subgid").write_text("carol:231072:65536\n")
    taken = tu.ranges(str(tmp_path / "subuid")) + tu.ranges(str(tmp_path / "subgid"))
    assert [t[0] for t in taken] == ["alice", "1001", "bob", "carol"]
    start = tu.free_start(taken)
    assert start >= 100000 and start % 65536 == 0
    assert not any(_overlaps(start, tu.COUNT, s, n) for _, s, n in taken), start


def test_missing_file_has_no_ranges(tmp_path):
    assert _load().ranges(str(tmp_path / "nope")) == []
