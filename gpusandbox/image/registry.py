"""The registry client: a Source over the OCI distribution v2 API.

HTTP is `requests` (connection pooling, https_proxy/no_proxy, TLS), imported
only here so that `run` of a directory or a cached image never pays for it.
Redirects are followed by this module, not by requests: Authorization goes
only to the registry's own origin (a redirect to blob storage drops it for
the rest of the chain), https never leads to http, at most MAX_REDIRECTS hops.
A loopback registry is never reached through a proxy (as Go's
ProxyFromEnvironment, which podman and skopeo use).

Everything the registry sends is untrusted: manifests are read bounded and
their digest is computed always (and compared when pulled by digest, or when
an index named it); a blob is streamed through digest.Verifier and never read
past its descriptor's size.  A cut connection resumes with HTTP Range when
the server answers 206, else the blob restarts.  Connection errors, 5xx and
429 are retried with backoff (Retry-After honoured up to a cap).  Registry
error codes become one line with the fix."""
import os
import random
import ssl
import time
import urllib.parse

import requests
import urllib3

from . import auth as authmod
from . import digest as digestmod
from .digest import ImageError
from . import manifest as mf
from .netutil import clean as _clean, is_loopback, net_cause, origin as _origin
from .netutil import retry_after as _retry_after

MAX_MANIFEST = 4 << 20
MAX_ERROR_BODY = 64 << 10
MAX_TOKEN_BODY = 1 << 20
MAX_REDIRECTS = 5
CHUNK = 1 << 20
CERTS_DIRS = ("/etc/containers/certs.d", "/etc/docker/certs.d")
DOCKER_HUB = ("docker.io", "index.docker.io")
_REDIRECT = (301, 302, 303, 307, 308)
_RETRY_STATUS = (429, 500, 502, 503, 504)
_NO_PROXY = {"http": None, "https": None, "all": None}
ACCEPT = ", ".join(mf.MANIFEST_TYPES + mf.INDEX_TYPES)

# code -> (what it means, the fix)
ERRORS = {
    "TOOMANYREQUESTS": ("the registry is rate limiting pulls",
                        "wait and retry, or pull with credentials (--authfile), "
                        "which most registries allow more pulls"),
    "DENIED": ("access denied",
               "check the image name and that the credentials in the auth file "
               "(--authfile, podman/skopeo login) may pull it"),
    "UNAUTHORIZED": ("authentication required",
                     "log in (podman login / skopeo login) or pass --authfile FILE"),
    "MANIFEST_UNKNOWN": ("no such tag or digest",
                         "check the tag (skopeo list-tags docker://HOST/REPO)"),
    "NAME_UNKNOWN": ("no such repository", "check the image name and the registry host"),
    "BLOB_UNKNOWN": ("the registry lacks a blob that the image names",
                     "the image is incomplete on the registry: push it again"),
}


def _noauth(r):
    """Passed as auth= so that requests never adds ~/.netrc credentials to a
    request this module did not authorize."""
    return r


def _platform(p):
    """None (the host's), "OS/ARCH[/VARIANT]" or a platform dict."""
    if p is None:
        return mf.host_platform()
    return mf.parse_platform(p) if isinstance(p, str) else p


def _loads(raw, ctype, what):
    """kind, doc of a manifest or index; schema 1 named as such."""
    doc = mf.loads(raw, what)
    if doc.get("schemaVersion") != 2:
        raise ImageError(f"{what}: unsupported schemaVersion",
                         _clean(doc.get("schemaVersion"), 20),
                         "only schema 2 (OCI or Docker v2) images are supported: "
                         "push the image again with a current docker, podman or skopeo")
    return mf.kind(doc, ctype), doc


class _Cut(Exception):
    """The connection broke while a blob's body was being read."""


def _read(r, n):
    """Up to n raw body bytes (no Content-Encoding decoding: the digest is
    of the bytes as stored)."""
    try:
        return r.raw.read(n, decode_content=False)
    except (urllib3.exceptions.HTTPError, requests.RequestException, OSError):
        raise _Cut() from None


class _TLSAdapter(requests.adapters.HTTPAdapter):
    def __init__(self, ctx):
        self._ctx = ctx
        super().__init__()

    def init_poolmanager(self, *a, **kw):
        kw["ssl_context"] = self._ctx
        return super().init_poolmanager(*a, **kw)

    def proxy_manager_for(self, proxy, **kw):
        kw["ssl_context"] = self._ctx
        return super().proxy_manager_for(proxy, **kw)


class RegistrySource:
    """Source over docker://HOST[:PORT]/REPO[:TAG|@DIGEST] (`ref` is any
    object with host, repo, tag and digest)."""

    resumable = True          # blob() goes on from what `out` holds (Range)

    retries = 4               # attempts after the first, per request
    backoff = 0.5             # seconds, doubled per attempt (with jitter)
    max_retry_after = 30.0    # cap of a server's Retry-After
    timeout = (15, 60)        # connect, read (seconds without a byte)

    def __init__(self, ref, *, authfile=None, tls_verify=True, platform=None):
        self.host = ref.host
        self.repo = ref.repo
        self.tag = ref.tag
        self.digest = digestmod.validate(ref.digest) if ref.digest else None
        if not self.host or not self.repo:
            raise ImageError("invalid registry reference", "no host or repository")
        self.name = f"{self.host}/{self.repo}"
        self.endpoint = "registry-1.docker.io" if self.host in DOCKER_HUB else self.host
        self.tls_verify = tls_verify
        self.platform = _platform(platform)
        self._creds = authmod.find_credentials(self.host, self.repo, authfile)
        self._authz = None
        self._base = None
        self._session = requests.Session()
        self._session.headers.update({"User-Agent": "gpusandbox",
                                      "Accept-Encoding": "identity"})
        self._tls_setup()

    # -- transport -------------------------------------------------------

    def _tls_setup(self):
        """The system's CAs (OpenSSL's default paths, so SSL_CERT_FILE and
        SSL_CERT_DIR apply) plus a registry CA from certs.d, in an SSLContext
        of this session: not a `verify=` path, which requests replaces with
        $REQUESTS_CA_BUNDLE whenever that is set."""
        s = self._session
        if not self.tls_verify:
            s.verify = False
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            return
        ctx = ssl.create_default_context()
        # urllib3 matches the host name itself when the context does not
        # (urllib3 1.26, Debian 12's, requires that for an IP address).
        ctx.check_hostname = False
        dirs = list(CERTS_DIRS) + [os.path.expanduser("~/.config/containers/certs.d")]
        for top in dirs:
            d = os.path.join(top, self.endpoint.replace("/", "_"))
            try:
                names = sorted(os.listdir(d))
            except OSError:
                continue
            for n in names:
                path = os.path.join(d, n)
                try:
                    if n.endswith(".crt"):
                        ctx.load_verify_locations(cafile=path)
                    elif n.endswith(".cert") and os.path.exists(path[:-5] + ".key"):
                        ctx.load_cert_chain(path, path[:-5] + ".key")
                except (OSError, ssl.SSLError) as e:
                    raise ImageError(f"cannot use {path}", _clean(e, 120),
                                     "it must be a PEM certificate (or key)") from None
        s.mount("https://", _TLSAdapter(ctx))

    def _get(self, url, headers):
        """One GET with redirects followed here (see the module doc)."""
        headers = dict(headers)
        auth_origin = _origin(url)
        for _ in range(MAX_REDIRECTS + 1):
            proxies = _NO_PROXY if is_loopback(urllib.parse.urlsplit(url).netloc) else None
            r = self._session.get(url, headers=headers, stream=True, allow_redirects=False,
                                  timeout=self.timeout, auth=_noauth, proxies=proxies)
            if r.status_code not in _REDIRECT:
                return r
            loc = r.headers.get("Location")
            r.close()
            if not loc:
                raise ImageError(f"registry {self.host} sent a redirect without a Location", None)
            new = urllib.parse.urljoin(url, loc)
            scheme = urllib.parse.urlsplit(new).scheme
            if scheme not in ("http", "https"):
                raise ImageError(f"registry {self.host} redirected to an unsupported URL",
                                 _clean(new, 100))
            if url.startswith("https:") and scheme == "http":
                raise ImageError(f"registry {self.host} redirected from https to plain http",
                                 _clean(new, 100), "refused: the download would not be private")
            if _origin(new) != auth_origin:
                headers.pop("Authorization", None)
            url = new
        raise ImageError(f"registry {self.host} redirected too often",
                         f"more than {MAX_REDIRECTS} hops")

    def _sleep(self, attempt, retry_after=None):
        if retry_after is None:
            retry_after = self.backoff * (2 ** (attempt - 1)) * (1 + random.random() / 4)
        time.sleep(min(retry_after, self.max_retry_after))

    def _get_retrying(self, url, headers, what):
        """_get with retries on connection errors, 5xx and 429."""
        attempt = 0
        while True:
            try:
                r = self._get(url, headers)
            except requests.exceptions.SSLError as e:
                # A TLS failure is an answer, not a transient fault.
                raise ImageError(f"TLS with registry {self.host} failed", _clean(e, 160),
                                 "if its certificate is right, put its CA in /etc/containers/"
                                 f"certs.d/{self.endpoint}/ca.crt (or pass --tls-verify=false)"
                                 ) from None
            except (requests.ConnectionError, requests.Timeout) as e:
                if attempt >= self.retries:
                    err = ImageError(f"cannot reach registry {self.host}", net_cause(e),
                                     "check the host name, the network and https_proxy")
                    err.resumable = True
                    raise err from None
                attempt += 1
                self._sleep(attempt)
                continue
            if r.status_code in _RETRY_STATUS and attempt < self.retries:
                ra = _retry_after(r.headers.get("Retry-After"), self.max_retry_after)
                r.close()
                attempt += 1
                self._sleep(attempt, ra)
                continue
            return r

    def _base_url(self):
        """https, or http for a loopback registry or --tls-verify=false when
        https fails (as podman and docker do)."""
        if self._base:
            return self._base
        schemes = ["https"]
        if is_loopback(self.endpoint) or not self.tls_verify:
            schemes.append("http")
        errors = []
        for scheme in schemes:
            url = f"{scheme}://{self.endpoint}/v2/"
            try:
                r = self._get_retrying(url, {}, "registry")
            except ImageError as e:
                errors.append(e)
                continue
            self._base = f"{scheme}://{self.endpoint}"
            chal = r.headers.get("WWW-Authenticate") if r.status_code == 401 else None
            r.close()
            if chal:
                self._authenticate(chal)
            return self._base
        # Something answered TLS on https and plain http failed too: the
        # TLS error is the one to fix.
        raise errors[0] if errors[0].what.startswith("TLS") else errors[-1]

    # -- authentication --------------------------------------------------

    def _authenticate(self, header):
        chals = authmod.parse_challenges(header or "")
        for scheme, params in chals:
            if scheme == "bearer" and params.get("realm"):
                self._authz = "Bearer " + self._token(params)
                return
        for scheme, _ in chals:
            if scheme == "basic":
                if not self._creds:
                    raise ImageError(f"{self.name}: authentication required", None,
                                     ERRORS["UNAUTHORIZED"][1])
                self._authz = authmod.basic_header(self._creds)
                return
        raise ImageError(f"{self.name}: authentication required",
                         f"unsupported challenge {_clean(header, 80)!r}")

    def _token(self, params):
        realm = params["realm"]
        p = urllib.parse.urlsplit(realm)
        if p.scheme not in ("http", "https") or not p.netloc:
            raise ImageError(f"registry {self.host} names an invalid token realm",
                             _clean(realm, 100))
        if p.scheme == "http" and self.tls_verify and not is_loopback(p.netloc):
            raise ImageError(f"registry {self.host} names a plain-http token realm",
                             _clean(realm, 100), "refused: credentials would travel in clear")
        query = [("service", params["service"])] if params.get("service") else []
        query.append(("scope", params.get("scope") or f"repository:{self.repo}:pull"))
        sep = "&" if p.query else "?"
        url = realm + sep + urllib.parse.urlencode(query)
        headers = {"Authorization": authmod.basic_header(self._creds)} if self._creds else {}
        r = self._get_retrying(url, headers, "token")
        try:
            if r.status_code != 200:
                raise self._error(r, "token")
            body = self._read_bounded(r, MAX_TOKEN_BODY, "token response")
        finally:
            r.close()
        try:
            import json
            doc = json.loads(body)
        except (ValueError, RecursionError):
            doc = None
        tok = (doc.get("token") or doc.get("access_token")) if isinstance(doc, dict) else None
        if not isinstance(tok, str) or not tok or not tok.isprintable() or not tok.isascii():
            raise ImageError(f"registry {self.host}: the token server sent no valid token", None)
        return tok

    # -- requests with auth ----------------------------------------------

    def _request(self, path, headers, what):
        """A GET of the registry API, authenticated, retried; a 401 fetches
        a new token once per request (a token that expired mid-pull)."""
        url = self._base_url() + path
        renewed = False
        while True:
            h = dict(headers)
            if self._authz:
                h["Authorization"] = self._authz
            r = self._get_retrying(url, h, what)
            if r.status_code == 401 and not renewed:
                chal = r.headers.get("WWW-Authenticate")
                r.close()
                self._authenticate(chal)
                renewed = True
                continue
            if r.status_code not in (200, 206):
                try:
                    raise self._error(r, what)
                finally:
                    r.close()
            return r

    def _read_bounded(self, r, limit, what):
        cl = r.headers.get("Content-Length")
        if cl and cl.isdigit() and int(cl) > limit:
            raise ImageError(f"{self.name}: {what} is too large", f"{cl} bytes (at most {limit})")
        try:
            data = r.raw.read(limit + 1, decode_content=False)
        except (urllib3.exceptions.HTTPError, requests.RequestException, OSError) as e:
            raise ImageError(f"{self.name}: reading the {what} failed", _clean(e, 160)) from None
        if len(data) > limit:
            raise ImageError(f"{self.name}: {what} is too large", f"more than {limit} bytes")
        return data

    def _error(self, r, what):
        code, msg = None, None
        try:
            import json
            doc = json.loads(r.raw.read(MAX_ERROR_BODY, decode_content=False) or b"null")
            e = doc["errors"][0] if isinstance(doc, dict) else None
            if isinstance(e, dict) and isinstance(e.get("code"), str):
                code, msg = e["code"].upper(), e.get("message")
        except (ValueError, RecursionError, KeyError, IndexError, TypeError,
                urllib3.exceptions.HTTPError, requests.RequestException, OSError):
            pass
        if code is None:
            code = {401: "UNAUTHORIZED", 403: "DENIED", 429: "TOOMANYREQUESTS"}.get(r.status_code)
            if code is None and r.status_code == 404:
                code = "MANIFEST_UNKNOWN" if what.startswith("manifest") else \
                    "BLOB_UNKNOWN" if what.startswith("blob") else None
        if code == "UNAUTHORIZED" and self._creds:
            # Token registries answer so too when the credentials are good
            # but may not pull this repository (or it does not exist).
            return ImageError(f"{self.name}: the registry refused the credentials",
                              f"HTTP {r.status_code}", "check the image name and the auth file "
                              "(--authfile), or log in again (podman login / skopeo login)")
        why = f"{code}: {_clean(msg)}" if code and msg else code or f"HTTP {r.status_code}"
        if code in ERRORS:
            meaning, fix = ERRORS[code]
            return ImageError(f"{self.name} ({what}): {meaning}", _clean(why), fix)
        return ImageError(f"{self.name} ({what}): the registry answered HTTP {r.status_code}",
                          _clean(why))

    # -- Source ----------------------------------------------------------

    def _fetch_manifest(self, reference):
        r = self._request(f"/v2/{self.repo}/manifests/{reference}", {"Accept": ACCEPT},
                          f"manifest {reference}")
        try:
            raw = self._read_bounded(r, MAX_MANIFEST, "manifest")
            ctype = r.headers.get("Content-Type", "").partition(";")[0].strip()
        finally:
            r.close()
        return raw, ctype

    def manifest(self, platform=None):
        """(manifest digest, manifest dict, raw bytes) for `platform`
        (default: the one given at construction, else the host's)."""
        plat = _platform(platform) if platform is not None else self.platform
        reference = self.digest or self.tag or "latest"
        raw, ctype = self._fetch_manifest(reference)
        h = digestmod.hasher(self.digest or "sha256:" + "0" * 64)
        h.update(raw)
        got = f"{h.name}:{h.hexdigest()}"
        if self.digest and got != self.digest:
            raise ImageError(f"{self.name}: the manifest does not match the digest pulled",
                             f"got {got}", "the registry or a proxy altered it")
        k, doc = _loads(raw, ctype, f"{self.name} manifest")
        if k == "manifest":
            return got, mf.check_manifest(doc, f"{self.name} manifest"), raw
        d = mf.select(doc, plat, f"{self.name} index")
        raw2, ctype2 = self._fetch_manifest(d["digest"])
        v = digestmod.Verifier(d["digest"], d["size"])
        v.update(raw2[: d["size"] + 1])
        v.check()
        k, doc2 = _loads(raw2, ctype2, f"{self.name} manifest")
        if k != "manifest":
            raise ImageError(f"{self.name}: the index names another index",
                             "nested indexes are not supported")
        return d["digest"], mf.check_manifest(doc2, f"{self.name} manifest"), raw2

    def blob(self, desc, out):
        """Write the blob of descriptor `desc` to the binary file `out`,
        verified; `out` must be seekable for a restart after a cut."""
        desc = mf.descriptor(desc, f"{self.name} blob")
        dig = desc["digest"]
        # `out` may already hold the blob's first bytes (the store's partial
        # download of an earlier pull): go on from there with a Range request.
        v = out.prefix() if hasattr(out, "prefix") else digestmod.Verifier(dig, desc["size"])
        try:
            start = out.tell() - v.seen if out.seekable() else None
        except OSError:
            start = None
        path, cuts = f"/v2/{self.repo}/blobs/{dig}", 0
        while True:
            headers = {"Range": f"bytes={v.seen}-"} if v.seen else {}
            r = self._request(path, headers, f"blob {dig}")
            try:
                if v.seen and not (r.status_code == 206 and r.headers.get(
                        "Content-Range", "").startswith(f"bytes {v.seen}-")):
                    if start is None:
                        raise ImageError(f"{self.name}: blob {dig} was cut off and the "
                                         "registry cannot resume it", f"{v.seen} of {v.size} bytes")
                    # Range ignored (200, the whole blob) or answered
                    # wrongly: restart from the start, with this body if whole.
                    out.seek(start)
                    out.truncate()
                    v = digestmod.Verifier(dig, desc["size"])
                    if r.status_code != 200:
                        r.close()
                        continue
                if r.status_code != 200 and not v.seen:
                    raise ImageError(f"{self.name}: blob {dig}: unexpected HTTP {r.status_code}")
                cl = r.headers.get("Content-Length")
                if cl is not None and (not cl.isdigit() or int(cl) != v.remaining):
                    raise ImageError(f"{self.name}: blob {dig} has the wrong size",
                                     f"the registry sends {_clean(cl, 24)} bytes, "
                                     f"the manifest says {v.remaining}")
                if self._stream(r, v, out, cl is None):
                    return
            except _Cut:
                pass            # resume or restart below; a write error propagates
            finally:
                r.close()
            cuts += 1
            if cuts > self.retries:
                err = ImageError(f"{self.name}: blob {dig} is truncated",
                                 f"{v.seen} of {v.size} bytes after {cuts} attempts",
                                 "the connection keeps breaking: retry later")
                err.resumable = True     # the store keeps what came (partial.py)
                raise err
            self._sleep(cuts)

    def _stream(self, r, v, out, unsized):
        """True when the blob is complete and verified; False when cut."""
        while v.remaining:
            data = _read(r, min(CHUNK, v.remaining))
            if not data:
                return False
            v.update(data)
            out.write(data)
        # A body of unknown length must end here: one byte more is refused.
        if unsized and _read(r, 1):
            raise ImageError(f"blob {v.digest} is larger than its descriptor says",
                             f"more than {v.size} bytes")
        v.check()
        out.flush()
        return True

    def close(self):
        self._session.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
