"""A real registry for the tests: Debian's docker-registry (the distribution
registry) on 127.0.0.1, anonymous, htpasswd (Basic) and token (Bearer, with a
token server of the tests' own) variants, filled with
skopeo from OCI layouts built here (a gzip, a zstd and an uncompressed
layer; a multi-platform index with an attestation entry).

Import the fixtures into a test module:
    from .registry_fixture import registry, registry_auth, images  # noqa: F401
"""
import base64
import gzip
import hashlib
import http.server
import io
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tarfile
import threading
import time
import urllib.parse
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REGISTRY_BIN = "/usr/bin/docker-registry"
USER, PASSWORD = "gsbxuser", "s3cret-pw"


def _need(*tools):
    for t in tools:
        if not shutil.which(t) and not os.path.exists(t):
            pytest.skip(f"{t} is not installed (scripts/test installs it)")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- OCI layouts -------------------------------------------------------------

def _tar(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in sorted(files.items()):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def _sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Layout:
    """An OCI image layout being written (blobs, index.json)."""

    def __init__(self, path):
        self.path = Path(path)
        (self.path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        self.refs = []

    def blob(self, data, media_type):
        d = _sha(data)
        (self.path / "blobs" / "sha256" / d[7:]).write_bytes(data)
        return {"mediaType": media_type, "digest": d, "size": len(data)}

    def layer(self, files, compression):
        raw = _tar(files)
        if compression == "gzip":
            data, mt = gzip.compress(raw, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip"
        elif compression == "zstd":
            data = subprocess.run(["zstd", "-q", "-c"], input=raw, stdout=subprocess.PIPE,
                                  check=True).stdout
            mt = "application/vnd.oci.image.layer.v1.tar+zstd"
        else:
            data, mt = raw, "application/vnd.oci.image.layer.v1.tar"
        return self.blob(data, mt), _sha(raw)

    def image(self, layers, arch="amd64", variant=None, env=("PATH=/usr/bin:/bin",)):
        descs, diff_ids = [], []
        for files, comp in layers:
            d, diff = self.layer(files, comp)
            descs.append(d)
            diff_ids.append(diff)
        cfg = {"architecture": arch, "os": "linux",
               "config": {"Env": list(env), "Cmd": ["/bin/sh"]},
               "rootfs": {"type": "layers", "diff_ids": diff_ids}}
        if variant:
            cfg["variant"] = variant
        config = self.blob(json.dumps(cfg).encode(), "application/vnd.oci.image.config.v1+json")
        m = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
             "config": config, "layers": descs}
        raw = json.dumps(m).encode()
        return self.blob(raw, "application/vnd.oci.image.manifest.v1+json"), m, raw

    def tag(self, desc, name):
        self.refs.append(dict(desc, annotations={"org.opencontainers.image.ref.name": name}))
        (self.path / "index.json").write_text(json.dumps(
            {"schemaVersion": 2, "manifests": self.refs}))


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


# -- the registry process ----------------------------------------------------

class Registry:
    def __init__(self, top, htpasswd=None, token=None):
        self.port = _free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.top = top
        cfg = [
            "version: 0.1",
            "log:",
            "  level: error",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {top / 'data'}",
            "http:",
            f"  addr: {self.host}",
            f"  secret: {secrets.token_hex(16)}",
        ]
        if htpasswd:
            cfg += ["auth:", "  htpasswd:", "    realm: gsbx-test", f"    path: {htpasswd}"]
        if token:
            cfg += ["auth:", "  token:", f"    realm: {token.realm}",
                    f"    service: {token.SERVICE}", f"    issuer: {token.ISSUER}",
                    f"    rootcertbundle: {token.cert}"]
        (top / "config.yml").write_text("\n".join(cfg) + "\n")
        self.log = open(top / "registry.log", "wb")
        self.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(top / "config.yml")],
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2).close()
                break
            except urllib.error.HTTPError:
                break           # 401: up, with auth
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("docker-registry did not start: " +
                                       (top / "registry.log").read_text()[-2000:])
                time.sleep(0.1)

    def push(self, layout, tag, repo, creds=None, all_=False):
        """Copies layout:tag to repo:tag; returns the manifest digest in the
        registry (skopeo may recompress, so it can differ from the layout's)."""
        dfile = self.top / f"digest-{secrets.token_hex(4)}"
        argv = ["skopeo", "--insecure-policy", "copy", "-q", "--dest-tls-verify=false",
                "--digestfile", str(dfile)]
        if all_:
            argv.append("--all")
        if creds:
            argv += ["--dest-creds", f"{creds[0]}:{creds[1]}"]
        argv += [f"oci:{layout}:{tag}", f"docker://{self.host}/{repo}:{tag}"]
        subprocess.run(argv, check=True, timeout=120, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, TMPDIR=str(self.top)))
        return dfile.read_text().strip()

    def blob_gets(self, since=0):
        """{path: count} of the blob GETs in the access log after byte `since`
        (log_size() before the action)."""
        out = {}
        with open(self.top / "registry.log", "rb") as f:
            f.seek(since)
            for line in f.read().decode(errors="replace").splitlines():
                m = re.search(r'"GET (/v2/\S+/blobs/sha256:[0-9a-f]{64}) HTTP', line)
                if m:
                    out[m.group(1)] = out.get(m.group(1), 0) + 1
        return out

    def log_size(self):
        self.log.flush()
        return os.path.getsize(self.top / "registry.log")

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


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
