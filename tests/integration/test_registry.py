"""The registry client against Debian's docker-registry (anonymous and
htpasswd) filled by skopeo, and against a hostile server of our own."""
import base64
import collections
import hashlib
import io
import json

import pytest

from gpusandbox.image.digest import ImageError
from gpusandbox.image.registry import RegistrySource

from .hostile_registry import Hostile
from .registry_fixture import images, registry, registry_auth, registry_token  # noqa: F401

Ref = collections.namedtuple("Ref", "host repo tag digest")


def _src(host, repo, tag=None, digest=None, **kw):
    return RegistrySource(Ref(host, repo, tag, digest), **kw)


def _authfile(tmp_path, host, creds):
    p = tmp_path / "auth.json"
    auth = base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
    p.write_text(json.dumps({"auths": {host: {"auth": auth}}}))
    return str(p)


def _pull_all(src, tmp_path, platform=None):
    d, m, raw = src.manifest(platform)
    for desc in [m["config"]] + m["layers"]:
        out = tmp_path / desc["digest"][7:]
        with open(out, "wb") as f:
            src.blob(desc, f)
        assert "sha256:" + hashlib.sha256(out.read_bytes()).hexdigest() == desc["digest"]
        assert out.stat().st_size == desc["size"]
    return d, m, raw


# -- the real registry ---------------------------------------------------------

def test_anonymous_by_tag_and_digest(registry, tmp_path):
    want = registry.pushed["simple"]
    with _src(registry.host, "test/simple", "simple") as s:
        d, m, raw = _pull_all(s, tmp_path)
    assert d == want == "sha256:" + hashlib.sha256(raw).hexdigest()
    types = [x["mediaType"] for x in m["layers"]]
    assert any(t.endswith("+zstd") for t in types) and any(t.endswith("+gzip") for t in types)
    with _src(registry.host, "test/simple", digest=want) as s:
        assert s.manifest()[0] == want


def test_multi_platform_selection(registry, images):
    _, info = images
    with _src(registry.host, "test/multi", "multi", platform="linux/amd64") as s:
        d, m, _ = s.manifest()
        assert d == info["multi"]["amd64"]
        # a platform given per call wins; arm64 with and without its variant
        assert s.manifest("linux/arm64")[0] == info["multi"]["arm64"]
        assert s.manifest("linux/arm64/v8")[0] == info["multi"]["arm64"]
        with pytest.raises(ImageError) as e:
            s.manifest("linux/s390x")
    assert "linux/amd64, linux/arm64/v8" in e.value.line() and "--platform" in e.value.hint
    assert "unknown" not in e.value.line()


def test_unknown_tag_and_repository(registry):
    for repo, tag in (("test/simple", "nope"), ("test/absent", "x")):
        with pytest.raises(ImageError) as e:
            _src(registry.host, repo, tag).manifest()
        assert "no such" in e.value.line() and e.value.hint


def test_basic_auth_with_authfile(registry_auth, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with pytest.raises(ImageError) as e:
        _src(registry_auth.host, "private/simple", "simple").manifest()
    assert "authentication required" in e.value.line() and "--authfile" in e.value.hint
    af = _authfile(tmp_path, registry_auth.host, registry_auth.creds)
    with _src(registry_auth.host, "private/simple", "simple", authfile=af) as s:
        d, _, _ = _pull_all(s, tmp_path)
    assert d == registry_auth.pushed["simple"]
    # $REGISTRY_AUTH_FILE is read the same way
    monkeypatch.setenv("REGISTRY_AUTH_FILE", af)
    assert _src(registry_auth.host, "private/simple", "simple").manifest()[0] == d
    bad = _authfile(tmp_path, registry_auth.host, (registry_auth.creds[0], "wrong"))
    with pytest.raises(ImageError) as e:
        _src(registry_auth.host, "private/simple", "simple", authfile=bad).manifest()
    assert "refused the credentials" in e.value.line()


# -- the hostile server ----------------------------------------------------------

@pytest.fixture
def hostile():
    h = Hostile()
    yield h
    h.stop()


def _hsrc(h, scen, **kw):
    s = _src(h.host, scen, "latest", **kw)
    s.backoff = 0.01
    s.retries = 2
    return s


def _blob_error(h, scen, tmp_path):
    """The one ImageError of pulling the layer; the file never holds more
    than the descriptor's size."""
    s = _hsrc(h, scen)
    d, m, _ = s.manifest()
    desc = m["layers"][0]
    out = tmp_path / "blob"
    with open(out, "wb") as f, pytest.raises(ImageError) as e:
        s.blob(desc, f)
    assert out.stat().st_size <= desc["size"]
    return e.value


def _blob_ok(h, scen, tmp_path):
    s = _hsrc(h, scen)
    d, m, _ = s.manifest()
    out = tmp_path / "blob"
    with open(out, "wb") as f:
        s.blob(m["layers"][0], f)
    assert out.read_bytes() == h.image.layer
    return s


def test_hostile_good_pull(hostile, tmp_path):
    s = _blob_ok(hostile, "good", tmp_path)
    assert s.manifest()[0] == hostile.image.digest


@pytest.mark.parametrize("scen,words", [
    ("wrongdigest", "does not match its digest"),
    ("truncated", "is truncated"),
    ("larger", "wrong size"),
    ("larger-unsized", "larger than its descriptor"),
    ("expire-always", "authentication required"),
    ("redirect-loop", "redirected too often"),
    ("blob-unknown", "lacks a blob"),
])
def test_hostile_blob_errors(hostile, tmp_path, scen, words):
    e = _blob_error(hostile, scen, tmp_path)
    assert words in e.line()


def test_cut_connection_resumes_with_range(hostile, tmp_path):
    _blob_ok(hostile, "cut-resume", tmp_path)
    ranges = [hd.get("Range") for _, p, hd in hostile.seen if "/blobs/" in p]
    assert ranges[0] is None and ranges[1] == f"bytes={len(hostile.image.layer) // 2}-"


def test_cut_connection_restarts_without_range_support(hostile, tmp_path):
    _blob_ok(hostile, "cut-restart", tmp_path)


def test_token_refreshed_on_401_mid_pull(hostile, tmp_path):
    _blob_ok(hostile, "expire", tmp_path)
    assert hostile.tokens == 2


def test_redirect_to_other_host_drops_authorization(hostile, tmp_path):
    _blob_ok(hostile, "redirect", tmp_path)
    main = [hd for srv, p, hd in hostile.seen if srv == "127.0.0.1" and "/blobs/" in p]
    other = [hd for srv, p, hd in hostile.seen if srv == "127.0.0.2"]
    assert main and all(hd.get("Authorization", "").startswith("Bearer ") for hd in main)
    assert other and not any("Authorization" in hd for hd in other)


def test_retry_after_honoured(hostile):
    s = _hsrc(hostile, "ratelimit")
    waits = []
    s._sleep = lambda attempt, retry_after=None: waits.append(retry_after)
    assert s.manifest()[0] == hostile.image.digest
    assert waits == [2.0]


def test_5xx_retried(hostile):
    s = _hsrc(hostile, "flaky")
    assert s.manifest()[0] == hostile.image.digest
    assert hostile.counts["flaky"] == 3


@pytest.mark.parametrize("scen,words", [
    ("ratelimit-always", "rate limiting"),
    ("denied", "access denied"),
    ("garbage", "not valid JSON"),
    ("both", "both a manifest and an index"),
    ("schema1", "schemaVersion"),
    ("badchild", "does not match its digest"),
])
def test_hostile_manifest_errors(hostile, scen, words):
    s = _hsrc(hostile, scen)
    with pytest.raises(ImageError) as e:
        s.manifest("linux/amd64")
    assert words in e.value.line()
    if scen in ("ratelimit-always", "denied"):
        assert e.value.hint


def test_manifest_digest_checked_when_pulled_by_digest(hostile):
    wrong = "sha256:" + "1" * 64
    s = _src(hostile.host, "good", digest=wrong)
    with pytest.raises(ImageError) as e:
        s.manifest()
    assert "does not match the digest" in e.value.line()
    s = _src(hostile.host, "good", digest=hostile.image.digest)
    assert s.manifest()[0] == hostile.image.digest


def test_token_auth(registry_token, tmp_path, monkeypatch):
    """docker's token auth: anonymous Bearer for a public repository, a
    token bought with the authfile's credentials for a private one."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    reg = registry_token
    with _src(reg.host, "public/simple", "simple") as s:
        d, _, _ = _pull_all(s, tmp_path)
    assert d == reg.pushed["public"]
    with pytest.raises(ImageError) as e:
        _src(reg.host, "private/simple", "simple").manifest()
    assert "authentication required" in e.value.line()
    af = _authfile(tmp_path, reg.host, reg.creds)
    n = len(reg.tokens.issued)
    with _src(reg.host, "private/simple", "simple", authfile=af) as s:
        d, _, _ = _pull_all(s, tmp_path)
    assert d == reg.pushed["private"]
    assert any(authed and acc and acc[0]["name"] == "private/simple"
               for authed, acc in reg.tokens.issued[n:])


def test_http_proxy_from_environment(hostile, monkeypatch):
    """http_proxy is honoured (a registry by name, plain http allowed by
    tls_verify=False, reached only through the proxy); no_proxy bypasses it."""
    monkeypatch.setenv("http_proxy", f"http://{hostile.host}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    s = _src("gsbx-test.invalid", "good", "latest", tls_verify=False)
    s.backoff, s.retries = 0.01, 1
    assert s.manifest()[0] == hostile.image.digest
    assert any(p.startswith("http://gsbx-test.invalid/v2/good/manifests/")
               for _, p, _ in hostile.seen)
    monkeypatch.setenv("no_proxy", "gsbx-test.invalid")
    s = _src("gsbx-test.invalid", "good", "latest", tls_verify=False)
    s.backoff, s.retries = 0.01, 1
    with pytest.raises(ImageError) as e:
        s.manifest()
    assert "cannot reach registry gsbx-test.invalid" in e.value.line()


def test_blob_write_error_is_not_a_cut(hostile, tmp_path):
    """A failing destination (disk full) is reported as itself, not retried
    as a broken connection."""
    import errno

    class Full(io.BytesIO):
        def write(self, b):
            raise OSError(errno.ENOSPC, "No space left on device")
    s = _hsrc(hostile, "good")
    _, m, _ = s.manifest()
    with pytest.raises(OSError) as e:
        s.blob(m["layers"][0], Full())
    assert e.value.errno == errno.ENOSPC
    assert len([p for _, p, _ in hostile.seen if "/blobs/" in p]) == 1


def test_store_writer_restart_and_resume(hostile, tmp_path):
    """Through the store's own blob writer: a cut blob resumed (206) or
    restarted (200) ends verified in the store."""
    from gpusandbox.image.store import Store
    for scen in ("cut-resume", "cut-restart"):
        st = Store(str(tmp_path / scen))
        s = _hsrc(hostile, scen)
        _, m, _ = s.manifest()
        desc = m["layers"][0]
        assert st.ensure_blob(s, desc)
        with st.open_blob(desc["digest"]) as f:
            assert f.read() == hostile.image.layer


def _tls_server(where, san):
    """The hostile server over https with a self-signed cert for `san`, and
    a certs.d directory holding it as the registry's CA."""
    import subprocess
    where.mkdir()
    key, crt = where / "key.pem", where / "crt.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=gsbx-test", "-addext", f"subjectAltName={san}",
                    "-keyout", str(key), "-out", str(crt)], check=True, capture_output=True)
    h = Hostile(tls=(str(crt), str(key)))
    h.certs = where / "certs.d"
    (h.certs / h.host).mkdir(parents=True)
    (h.certs / h.host / "ca.crt").write_bytes(crt.read_bytes())
    return h


@pytest.fixture
def tls_hostile(tmp_path):
    h = _tls_server(tmp_path / "tls", "IP:127.0.0.1")
    yield h
    h.stop()


def test_https_with_certs_d_ca(tls_hostile, tmp_path, monkeypatch):
    import gpusandbox.image.registry as regmod
    h = tls_hostile
    monkeypatch.setattr(regmod, "CERTS_DIRS", (str(h.certs),))
    s = _hsrc(h, "good")
    _blob_ok(h, "good", tmp_path)
    assert s._base_url() == f"https://{h.host}"
    # https never leads to http, Authorization or not
    e = _blob_error(h, "redirect", tmp_path)
    assert "https to plain http" in e.line()
    assert not [p for srv, p, _ in h.seen if srv == "127.0.0.2"]
    # a trusted CA, but a certificate for another name
    other = _tls_server(tmp_path / "other", "DNS:gsbx-other.invalid")
    try:
        monkeypatch.setattr(regmod, "CERTS_DIRS", (str(other.certs),))
        with pytest.raises(ImageError) as e:
            _hsrc(other, "good").manifest()
        assert f"TLS with registry {other.host} failed" in e.value.line()
        assert not [p for _, p, _ in other.seen if "/manifests/" in p]
    finally:
        other.stop()


def test_https_unknown_ca_refused(tls_hostile, tmp_path, monkeypatch):
    """Without its CA the server is not trusted; the plain-http fallback of
    a loopback registry finds no http there either: the TLS error, with
    where the CA goes, and no manifest asked for."""
    import gpusandbox.image.registry as regmod
    monkeypatch.setattr(regmod, "CERTS_DIRS", (str(tmp_path / "none"),))
    with pytest.raises(ImageError) as e:
        _hsrc(tls_hostile, "good").manifest()
    assert f"TLS with registry {tls_hostile.host} failed" in e.value.line()
    assert f"certs.d/{tls_hostile.host}/ca.crt" in e.value.hint
    assert not [p for _, p, _ in tls_hostile.seen if "/manifests/" in p]


def test_loopback_never_through_a_proxy(hostile, monkeypatch):
    for var in ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")     # nothing listens there
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    assert _hsrc(hostile, "good").manifest()[0] == hostile.image.digest


def test_a_registry_dies_with_the_run_that_started_it(tmp_path):
    """A test run (or benchmark) killed before its teardown, as a timeout's
    SIGTERM does, leaves no docker-registry running: it dies with its
    starter (bench_lib.registry.spawn)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from .conftest import wait_for
    from .registry_fixture import REGISTRY_BIN
    if not os.path.exists(REGISTRY_BIN):
        pytest.skip("docker-registry is not installed (scripts/test installs it)")
    scripts = Path(__file__).resolve().parents[2] / "scripts"
    code = (f"import sys, time; sys.path.insert(0, {str(scripts)!r})\n"
            "from bench_lib.registry import Registry\n"
            f"r = Registry({str(tmp_path)!r}); print(r.pid, flush=True); time.sleep(600)\n")
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(starter.stdout.readline())
        with open(f"/proc/{pid}/comm") as f:
            assert f.read().strip() == "docker-registry"
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait()

    def gone():
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(") ")[1][0] == "Z"    # exited, not yet reaped
        except FileNotFoundError:
            return True
    assert wait_for(gone, 10), f"docker-registry {pid} outlived the process that started it"
