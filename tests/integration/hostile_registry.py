"""A hostile registry of the tests' own: an http.server on loopback that
speaks enough of the distribution API (Bearer tokens included) to reach
each failure path of the client.  The repository name picks the behaviour:

  good            a valid image
  wrongdigest     a blob with one byte changed
  truncated       every blob response cut at half its length
  cut-resume      the first blob response cut; Range answered with 206
  cut-restart     the first blob response cut; Range ignored (200, whole blob)
  hang            the first blob response sends half, sets `half_sent`, then
                  waits for `release` (a pull to kill mid-layer); later ones whole
                  (Range ignored: 200)
  hang-resume     as hang, then Range answered with 206
  hang-manifest   the manifest request sets `manifest_asked` and waits for
                  `release` before it is answered
  larger          Content-Length larger than the descriptor
  larger-unsized  no Content-Length, more bytes than the descriptor
  expire          the first token is refused on the blob (401 in mid-pull)
  expire-always   every token is refused on the blob
  redirect        the blob 307s to another loopback address (127.0.0.2)
  redirect-loop   the blob redirects to itself forever
  ratelimit       the first manifest request gets 429 with Retry-After: 2
  ratelimit-always every manifest request gets 429 TOOMANYREQUESTS
  flaky           the first two manifest requests get 503
  denied          403 DENIED
  blob-unknown    blobs answer 404 BLOB_UNKNOWN
  garbage         the manifest is not JSON
  both            the manifest is also an index
  schema1         a Docker schema 1 manifest
  badchild        an index whose entry digest does not match the manifest served
"""
import gzip
import hashlib
import io
import http.server
import json
import os
import re
import tarfile
import ssl
import threading
import urllib.parse

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def _sha(b):
    return "sha256:" + hashlib.sha256(b).hexdigest()


def _layer():
    """A real gzip'd tar (one 3 MiB file of random bytes), so that a good
    pull through the CLI completes, and half of it is more than the client's
    1 MiB read (a pull killed mid-layer has written some of it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        ti = tarfile.TarInfo("data.bin")
        data = os.urandom(3 << 20)
        ti.size, ti.mode = len(data), 0o644
        t.addfile(ti, io.BytesIO(data))
    raw = buf.getvalue()
    return gzip.compress(raw, compresslevel=1), _sha(raw)


class _Image:
    def __init__(self):
        self.layer, diff_id = _layer()
        arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "amd64")
        self.config = json.dumps({"architecture": arch, "os": "linux",
                                  "config": {"Cmd": ["/data.bin"]},
                                  "rootfs": {"type": "layers",
                                             "diff_ids": [diff_id]}}).encode()
        self.blobs = {_sha(self.layer): self.layer, _sha(self.config): self.config}
        self.manifest = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST,
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": _sha(self.config), "size": len(self.config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": _sha(self.layer), "size": len(self.layer)}]}
        self.raw = json.dumps(self.manifest).encode()
        self.digest = _sha(self.raw)
        self.layer_desc = self.manifest["layers"][0]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass                    # a client that hangs up mid-body is a test case


class Hostile:
    def __init__(self, tls=None):
        """tls: (certfile, keyfile) to serve https on 127.0.0.1 (the other
        server on 127.0.0.2 stays plain http)."""
        self.scheme = "https" if tls else "http"
        self.image = _Image()
        self.lock = threading.Lock()
        self.counts = {}
        self.tokens = 0
        self.seen = []              # (server, path, headers) of every request
        self.half_sent = threading.Event()
        self.manifest_asked = threading.Event()
        self.release = threading.Event()
        self.main = self._serve("127.0.0.1", self._main_handler, tls)
        self.other = self._serve("127.0.0.2", self._other_handler)
        self.host = f"127.0.0.1:{self.main.server_address[1]}"
        self.other_host = f"127.0.0.2:{self.other.server_address[1]}"

    def _serve(self, addr, handler, tls=None):
        outer = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                with outer.lock:
                    outer.seen.append((addr, self.path, dict(self.headers)))
                handler(self)

        srv = _Server((addr, 0), H)
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    def count(self, key):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            return self.counts[key]

    def stop(self):
        for s in (self.main, self.other):
            s.shutdown()
            s.server_close()

    # -- responses ---------------------------------------------------------

    @staticmethod
    def _send(h, status, body=b"", headers=(), length=True):
        h.send_response(status)
        for k, v in headers:
            h.send_header(k, v)
        if length:
            h.send_header("Content-Length", str(len(body)))
        else:
            h.send_header("Connection", "close")
            h.close_connection = True
        h.end_headers()
        h.wfile.write(body)

    def _error(self, h, status, code, headers=()):
        body = json.dumps({"errors": [{"code": code, "message": code.lower()}]}).encode()
        self._send(h, status, body, [("Content-Type", "application/json")] + list(headers))

    def _challenge(self, h):
        realm = f"{self.scheme}://{self.host}/token"
        self._error(h, 401, "UNAUTHORIZED", [(
            "WWW-Authenticate", f'Bearer realm="{realm}",service="hostile",scope="x"')])

    def _cut(self, h, body, start=0):
        """Promise the whole remainder, send half of it, close."""
        h.send_response(200 if start == 0 else 206)
        h.send_header("Content-Length", str(len(body) - start))
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        h.end_headers()
        h.wfile.write(body[start:start + (len(body) - start) // 2])
        h.wfile.flush()
        h.close_connection = True

    def _other_handler(self, h):
        m = re.match(r"/blob/(sha256:[0-9a-f]{64})$", h.path)
        data = self.image.blobs.get(m.group(1)) if m else None
        if data is None:
            return self._send(h, 404)
        self._send(h, 200, data)

    def _main_handler(self, h):
        # an absolute URI when the client uses this server as its http proxy
        path = urllib.parse.urlsplit(h.path).path
        if path == "/token":
            with self.lock:
                self.tokens += 1
                n = self.tokens
            return self._send(h, 200, json.dumps({"token": f"tok-{n}"}).encode(),
                              [("Content-Type", "application/json")])
        auth = h.headers.get("Authorization", "")
        if not auth.startswith("Bearer tok-"):
            return self._challenge(h)
        if path == "/v2/":
            return self._send(h, 200, b"{}")
        m = re.match(r"/v2/(.+)/(manifests|blobs)/([^/]+)$", path)
        if not m:
            return self._send(h, 404)
        scen, what, ref = m.groups()
        if scen == "denied":
            return self._error(h, 403, "DENIED")
        if what == "manifests":
            return self._manifest(h, scen, ref)
        return self._blob(h, scen, ref, auth)

    def _manifest(self, h, scen, ref):
        img = self.image
        ct = [("Content-Type", OCI_MANIFEST)]
        if scen == "ratelimit" and self.count("ratelimit") == 1:
            return self._error(h, 429, "TOOMANYREQUESTS", [("Retry-After", "2")])
        if scen == "ratelimit-always":
            return self._error(h, 429, "TOOMANYREQUESTS", [("Retry-After", "1")])
        if scen == "flaky" and self.count("flaky") <= 2:
            return self._send(h, 503, b"busy")
        if scen == "garbage":
            return self._send(h, 200, b"\x00garbage{{", ct)
        if scen == "hang-manifest":
            self.manifest_asked.set()
            self.release.wait(120)
        if scen == "both":
            doc = dict(img.manifest, manifests=[])
            return self._send(h, 200, json.dumps(doc).encode(), ct)
        if scen == "schema1":
            doc = {"schemaVersion": 1, "name": "x", "tag": "y", "fsLayers": []}
            return self._send(h, 200, json.dumps(doc).encode(), [(
                "Content-Type", "application/vnd.docker.distribution.manifest.v1+prettyjws")])
        if scen == "badchild" and not ref.startswith("sha256:"):
            # The entry's size is right, its digest names another document.
            wrong = _sha(img.raw + b" ")
            idx = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
                {"mediaType": OCI_MANIFEST, "digest": wrong, "size": len(img.raw),
                 "platform": {"os": "linux", "architecture": "amd64"}},
                {"mediaType": OCI_MANIFEST, "digest": wrong, "size": len(img.raw),
                 "platform": {"os": "linux", "architecture": "arm64"}}]}
            return self._send(h, 200, json.dumps(idx).encode(), [("Content-Type", OCI_INDEX)])
        return self._send(h, 200, img.raw, ct)

    def _blob(self, h, scen, ref, auth):
        img = self.image
        data = img.blobs.get(ref)
        if data is None or scen == "blob-unknown":
            return self._error(h, 404, "BLOB_UNKNOWN")
        rng = h.headers.get("Range")
        start = int(re.match(r"bytes=(\d+)-$", rng).group(1)) if rng else 0
        n = self.count(f"{scen}-blob-{ref}")   # per blob: the first request of each
        if scen == "wrongdigest":
            bad = bytearray(data)
            bad[len(bad) // 2] ^= 1
            return self._send(h, 200, bytes(bad))
        if scen == "truncated":
            return self._cut(h, data, start)
        if scen in ("hang", "hang-resume") and n == 1 and len(data) > 4096:
            h.send_response(200)
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data[: len(data) // 2])
            h.wfile.flush()
            self.half_sent.set()
            self.release.wait(120)
            h.close_connection = True
            return
        if scen in ("cut-resume", "cut-restart") and n == 1:
            return self._cut(h, data)
        if scen in ("cut-resume", "hang-resume") and start:
            return self._send(h, 206, data[start:], [
                ("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")])
        if scen == "larger":
            return self._send(h, 200, data + b"\0" * 1000)
        if scen == "larger-unsized":
            return self._send(h, 200, data + b"\0" * 1000, length=False)
        if scen == "expire" and auth == "Bearer tok-1":
            return self._challenge(h)
        if scen == "expire-always":
            return self._challenge(h)
        if scen == "redirect":
            return self._send(h, 307, b"", [("Location", f"http://{self.other_host}/blob/{ref}")])
        if scen == "redirect-loop":
            return self._send(h, 302, b"", [("Location", h.path)])
        return self._send(h, 200, data)
