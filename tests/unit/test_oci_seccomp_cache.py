"""An OCI config's linux.seccomp (compiled by `create` once per container)
goes through the per-user seccomp cache: a hit skips the parse, an edited
profile or a damaged entry is compiled again, and the program is always the
one a fresh compile gives."""
import pytest

from gpusandbox.linux import seccomp
from gpusandbox.oci import fastjson

from .test_seccomp import ALLOW, EPERM, _profile, check


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "gpusandbox" / "seccomp"


def _compile(doc):
    return seccomp.compile_document(doc, fastjson.dumps(doc).encode(), "linux.seccomp",
                                    "x86_64")


def _fresh(doc):
    return seccomp.assemble(seccomp.parse(doc, "x86_64", "linux.seccomp"), "x86_64")


def test_hit_edit_and_damage(cache_home, monkeypatch):
    allow = _profile([{"names": ["read"], "action": "SCMP_ACT_ALLOW"}])
    deny = _profile([{"names": ["read"], "action": "SCMP_ACT_ERRNO"}])
    a = _compile(allow)
    assert a == _fresh(allow) and check(a, "x86_64", "read") == ALLOW
    (entry,) = list(cache_home.iterdir())
    real_parse = seccomp.parse

    def no_parse(*a, **k):
        raise AssertionError("parsed although a valid cache entry exists")
    monkeypatch.setattr(seccomp, "parse", no_parse)
    assert _compile(allow) == a
    monkeypatch.setattr(seccomp, "parse", real_parse)
    b = _compile(deny)                          # the one entry now holds this profile
    assert b == _fresh(deny) and check(b, "x86_64", "read") == EPERM
    assert list(cache_home.iterdir()) == [entry]
    blob = bytearray(entry.read_bytes())
    blob[-3] ^= 0x40
    entry.write_bytes(bytes(blob))
    assert _compile(deny) == b
    assert entry.read_bytes() != bytes(blob)
