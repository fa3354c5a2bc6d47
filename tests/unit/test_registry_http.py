"""Redirect, retry and error rules of the registry client, over a fake
session (no network): what is sent where, and what is refused."""
import collections
import json

import pytest

from gpusandbox.image import netutil
from gpusandbox.image import registry as reg
from gpusandbox.image.digest import ImageError

Ref = collections.namedtuple("Ref", "host repo tag digest")


@pytest.fixture(autouse=True)
def _no_user_auth_files(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)


class _Raw:
    def __init__(self, body):
        self.body = body

    def read(self, n, decode_content=True):
        out, self.body = self.body[:n], self.body[n:]
        return out


class _Resp:
    def __init__(self, status, headers=None, body=b""):
        self.status_code, self.headers, self.raw = status, dict(headers or {}), _Raw(body)

    def close(self):
        pass


class _Session:
    """Answers GETs from a list; records (url, headers)."""

    def __init__(self, answers):
        self.answers, self.sent = list(answers), []

    def get(self, url, headers, **kw):
        assert kw["allow_redirects"] is False and kw["auth"] is reg._noauth
        self.sent.append((url, dict(headers)))
        return self.answers.pop(0)


def _src(answers, host="r.example:443", base="https://r.example:443"):
    s = reg.RegistrySource(Ref(host, "a/b", "t", None), authfile=None)
    s._session = _Session(answers)
    s._base = base
    s._creds = None
    s._authz = "Bearer tok"
    s._sleep = lambda *a: None
    return s


def test_redirect_drops_authorization_off_origin():
    s = _src([_Resp(307, {"Location": "https://cdn.example/blob?sig=1"}),
              _Resp(302, {"Location": "https://r.example:443/back"}),
              _Resp(200)])
    s._request("/v2/a/b/blobs/x", {}, "blob x")
    auths = [h.get("Authorization") for _, h in s._session.sent]
    # once dropped it never comes back, not even on the registry's own origin
    assert auths == ["Bearer tok", None, None]


def test_redirect_same_origin_keeps_authorization():
    s = _src([_Resp(307, {"Location": "/v2/other"}), _Resp(200)])
    s._request("/v2/a/b/blobs/x", {}, "blob x")
    assert [h.get("Authorization") for _, h in s._session.sent] == ["Bearer tok"] * 2


@pytest.mark.parametrize("loc,words", [
    ("http://r.example/x", "https to plain http"),
    ("file:///etc/passwd", "unsupported URL"),
    ("", "without a Location"),
])
def test_redirect_refused(loc, words):
    s = _src([_Resp(302, {"Location": loc} if loc else {})])
    with pytest.raises(ImageError) as e:
        s._request("/v2/a/b/blobs/x", {}, "blob x")
    assert words in e.value.line()


def test_redirect_hops_bounded():
    s = _src([_Resp(302, {"Location": f"/x{i}"}) for i in range(reg.MAX_REDIRECTS + 1)])
    with pytest.raises(ImageError) as e:
        s._request("/v2/a/b/blobs/x", {}, "blob x")
    assert "redirected too often" in e.value.line()


def _err(status, code=None, headers=None):
    body = json.dumps({"errors": [{"code": code, "message": "m\x1b[31m"}]}).encode() \
        if code else b"<html>"
    return _Resp(status, headers, body)


@pytest.mark.parametrize("resp,what,words", [
    (_err(429, "TOOMANYREQUESTS"), "manifest t", "rate limiting"),
    (_err(403, "DENIED"), "manifest t", "access denied"),
    (_err(404, "MANIFEST_UNKNOWN"), "manifest t", "no such tag"),
    (_err(404, "NAME_UNKNOWN"), "manifest t", "no such repository"),
    (_err(404, "BLOB_UNKNOWN"), "blob x", "lacks a blob"),
    (_err(404), "manifest t", "no such tag"),
    (_err(403), "manifest t", "access denied"),
    (_err(418), "manifest t", "HTTP 418"),
])
def test_error_codes_one_line_with_fix(resp, what, words):
    s = _src([resp] * (s_retries := 5))
    s.retries = s_retries - 1
    with pytest.raises(ImageError) as e:
        s._request("/v2/a/b/manifests/t", {}, what)
    line = e.value.line()
    assert words in line and "\n" not in line and "\x1b" not in line
    if "HTTP 418" not in line:
        assert e.value.hint


def test_retries_bounded_and_retry_after_capped():
    s = _src([_Resp(503)] * 3 + [_Resp(429, {"Retry-After": "99999"}), _Resp(200)])
    waits = []
    s._sleep = lambda attempt, ra=None: waits.append(ra)
    s.retries = 4
    assert s._request("/v2/", {}, "x").status_code == 200
    assert waits == [None, None, None, s.max_retry_after]
    s = _src([_Resp(503)] * 3)
    s.retries = 2
    with pytest.raises(ImageError) as e:
        s._request("/v2/", {}, "x")
    assert "HTTP 503" in e.value.line()


def test_retry_after_forms():
    assert netutil.retry_after("3", 30) == 3.0
    assert netutil.retry_after("-3", 30) == 0.0
    assert netutil.retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 30) == 0.0
    assert netutil.retry_after("soon", 30) is None


def test_loopback_and_hostport():
    for h in ("127.0.0.1:5000", "127.9.9.9", "localhost:1", "[::1]:5000", "::1"):
        assert netutil.is_loopback(h), h
    for h in ("10.0.0.1:5000", "localhost.evil.com", "[::2]:1", "r.io"):
        assert not netutil.is_loopback(h), h
    assert netutil.split_hostport("[::1]:5000") == ("::1", "5000")
    assert netutil.split_hostport("r.io") == ("r.io", None)


def test_token_realm_rules():
    s = _src([])
    for realm in ("http://auth.example/token", "ftp://x/y", "https:///nohost"):
        with pytest.raises(ImageError):
            s._token({"realm": realm})
    s._session = _Session([_Resp(200, {}, b'{"token": "abc"}')])
    s._creds = ("u", "p")
    assert s._token({"realm": "https://auth.example/token?x=1", "service": "svc"}) == "abc"
    url, headers = s._session.sent[0]
    assert url == "https://auth.example/token?x=1&service=svc&scope=repository%3Aa%2Fb%3Apull"
    assert headers["Authorization"].startswith("Basic ")
    s._session = _Session([_Resp(200, {}, b'{"token": "a\\nb"}')])
    with pytest.raises(ImageError):
        s._token({"realm": "https://auth.example/token"})


def test_requests_stays_out_of_the_launch_path():
    """Only the registry client imports requests: the CLI, the image
    helpers and the auth parsing do not (run DIR never pays for it)."""
    import subprocess
    import sys
    code = ("import sys, gpusandbox.__main__, gpusandbox.cli, gpusandbox.image.auth, "
            "gpusandbox.image.manifest, gpusandbox.image.digest, gpusandbox.image.sources, "
            "gpusandbox.image.runimage, gpusandbox.image.store, gpusandbox.image.cli; "
            "print('requests' in sys.modules, 'urllib3' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True).stdout.split()
    assert out == ["False", "False"]


class _Refusing(_Session):
    def get(self, url, headers, **kw):
        import requests
        self.sent.append((url, dict(headers)))
        raise requests.exceptions.SSLError("wrong version number")


@pytest.mark.parametrize("host,tls_verify,schemes", [
    ("r.example:5000", True, ["https"]),
    ("r.example:5000", False, ["https", "http"]),
    ("127.0.0.1:5000", True, ["https", "http"]),
    ("localhost:5000", True, ["https", "http"]),
])
def test_plain_http_only_for_loopback_or_no_tls_verify(host, tls_verify, schemes):
    s = reg.RegistrySource(Ref(host, "a/b", "t", None), tls_verify=tls_verify)
    s._session = _Refusing([])
    s._sleep = lambda *a: None
    with pytest.raises(ImageError) as e:
        s.manifest()
    assert [u.partition(":")[0] for u, _ in s._session.sent] == schemes
    assert f"TLS with registry {host} failed" in e.value.line()
