"""A real registry for the tests: Debian's docker-registry (the distribution
registry) on 127.0.0.1, anonymous, htpasswd (Basic) and token (Bearer, with a
token server of the tests' own) variants, filled with
skopeo from OCI layouts built here (a gzip, a zstd and an uncompressed
layer; a multi-platform index with an attestation entry).

Import the fixtures into a test module:
    from .registry_fixture import registry, registry_auth, images  # noqa: F401
"""
import base64
import http.server
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
# The registry process and the layout writer: one implementation with the
# benchmark and scripts/demo.
from bench_lib.registry import REGISTRY_BIN, Layout, Registry, spawn  # noqa: E402,F401
USER, PASSWORD = "gsbxuser", "s3cret-pw"


def _need(*tools):
    for t in tools:
        if not shutil.which(t) and not os.path.exists(t):
            pytest.skip(f"{t} is not installed (scripts/test installs it)")


def build_images(top):
    """Writes the layouts; returns {tag: info} of what each holds."""
    lay = Layout(top / "layout")
    info = {}
    d, m, raw = lay.image([({"etc/hello": b"hello gzip\n", "bin/x": os.urandom(200_000)}, "gzip"),
                           ({"etc/zstd": b"hello zstd\n"}, "zstd"),
                           ({"etc/plain": b"plain\n"}, None)])
    lay.tag(d, "simple")
    info["simple"] = {"digest": d["digest"], "manifest": m, "raw": raw,
                      "blobdir": lay.path / "blobs" / "sha256"}
    amd, m_amd, _ = lay.image([({"etc/arch": b"amd64\n"}, "gzip")], arch="amd64")
    arm, m_arm, _ = lay.image([({"etc/arch": b"arm64\n"}, "gzip")], arch="arm64", variant="v8")
    att_layer = lay.blob(b'{"_type": "https://in-toto.io/Statement/v0.1"}',
                         "application/vnd.in-toto+json")
    att_cfg = lay.blob(b'{"architecture": "unknown", "os": "unknown", "rootfs": '
                       b'{"type": "layers", "diff_ids": []}}',
                       "application/vnd.oci.image.config.v1+json")
    att = lay.blob(json.dumps({"schemaVersion": 2,
                               "mediaType": "application/vnd.oci.image.manifest.v1+json",
                               "config": att_cfg, "layers": [att_layer]}).encode(),
                   "application/vnd.oci.image.manifest.v1+json")
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [
                 # The attestation comes first: a client that does not skip
                 # it picks the wrong entry.
                 dict(att, platform={"os": "unknown", "architecture": "unknown"},
                      annotations={"vnd.docker.reference.type": "attestation-manifest",
                                   "vnd.docker.reference.digest": amd["digest"]}),
                 dict(amd, platform={"os": "linux", "architecture": "amd64"}),
                 dict(arm, platform={"os": "linux", "architecture": "arm64", "variant": "v8"})]}
    idx = lay.blob(json.dumps(index).encode(), "application/vnd.oci.image.index.v1+json")
    lay.tag(idx, "multi")
    info["multi"] = {"digest": idx["digest"], "amd64": amd["digest"], "arm64": arm["digest"],
                     "manifests": {"amd64": m_amd, "arm64": m_arm}}
    return lay.path, info


@pytest.fixture(scope="session")
def images(tmp_path_factory):
    _need("zstd")
    top = tmp_path_factory.mktemp("oci")
    return build_images(top)


def _htpasswd(path):
    _need("htpasswd")
    line = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip()
    path.write_text(line + "\n")
    return path


@pytest.fixture(scope="session")
def registry(tmp_path_factory, images):
    _need(REGISTRY_BIN, "skopeo")
    top = tmp_path_factory.mktemp("registry")
    reg = Registry(top)
    try:
        layout, _ = images
        reg.pushed = {"simple": reg.push(layout, "simple", "test/simple"),
                      "multi": reg.push(layout, "multi", "test/multi", all_=True)}
        yield reg
    finally:
        reg.stop()


@pytest.fixture(scope="session")
def registry_auth(tmp_path_factory, images):
    _need(REGISTRY_BIN, "skopeo")
    top = tmp_path_factory.mktemp("registry-auth")
    reg = Registry(top, htpasswd=_htpasswd(top / "htpasswd"))
    reg.creds = (USER, PASSWORD)
    try:
        layout, _ = images
        reg.pushed = {"simple": reg.push(layout, "simple", "private/simple", creds=reg.creds)}
        yield reg
    finally:
        reg.stop()


# -- a token server (docker's token auth) ------------------------------------

def _b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class TokenServer:
    """Issues RS256 JWTs the registry trusts (rootcertbundle = our self-signed
    cert, sent as x5c).  Credentials USER:PASSWORD get what they ask for;
    anonymous callers get pull on public/* only."""
    SERVICE, ISSUER = "gsbx-registry", "gsbx-test-issuer"

    def __init__(self, top):
        _need("openssl")
        self.key, self.cert = top / "token.key", top / "token.crt"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                        "-keyout", str(self.key), "-out", str(self.cert), "-days", "2",
                        "-subj", "/CN=gsbx-token"], check=True, capture_output=True)
        der = subprocess.run(["openssl", "x509", "-in", str(self.cert), "-outform", "DER"],
                             check=True, capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        self.issued = []
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                body = json.dumps({"token": outer.token(q, self.headers.get("Authorization")),
                                   "expires_in": 300}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()
        self.realm = f"http://127.0.0.1:{self.srv.server_address[1]}/token"

    def token(self, q, authz):
        good = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        authed = authz == good
        access = []
        for scope in q.get("scope", []):
            for one in scope.split(" "):
                typ, _, rest = one.partition(":")
                name, _, actions = rest.rpartition(":")
                if typ != "repository" or not name:
                    continue
                acts = actions.split(",") if authed else \
                    (["pull"] if name.startswith("public/") and "pull" in actions else [])
                access.append({"type": "repository", "name": name, "actions": acts})
        now = int(time.time())
        claims = {"iss": self.ISSUER, "sub": USER if authed else "", "aud": self.SERVICE,
                  "exp": now + 300, "nbf": now - 60, "iat": now, "jti": secrets.token_hex(8),
                  "access": access}
        head = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        signing = (_b64url(json.dumps(head).encode()) + "." +
                   _b64url(json.dumps(claims).encode())).encode()
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)],
                             input=signing, check=True, capture_output=True).stdout
        self.issued.append((authed, access))
        return signing.decode() + "." + _b64url(sig)

    def stop(self):
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture(scope="session")
def registry_token(tmp_path_factory, images):
    _need(REGISTRY_BIN, "skopeo")
    top = tmp_path_factory.mktemp("registry-token")
    ts = TokenServer(top)
    try:
        reg = Registry(top, token=ts)
    except BaseException:
        ts.stop()
        raise
    reg.creds, reg.tokens = (USER, PASSWORD), ts
    try:
        layout, _ = images
        reg.pushed = {"public": reg.push(layout, "simple", "public/simple", creds=reg.creds),
                      "private": reg.push(layout, "simple", "private/simple", creds=reg.creds)}
        yield reg
    finally:
        reg.stop()
        ts.stop()
