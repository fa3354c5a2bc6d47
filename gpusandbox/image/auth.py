"""Registry credentials and authentication challenges.

Credentials come from the first of: --authfile, $REGISTRY_AUTH_FILE,
${XDG_RUNTIME_DIR}/containers/auth.json, ~/.config/containers/auth.json,
~/.docker/config.json (the lookup order of podman and skopeo).  Each file is
read bounded in size and parsed as untrusted JSON: a malformed file is
reported, never half-used.  In each file, `credHelpers[HOST]` comes first,
then `credsStore` (docker's order), then the inline `auth` entry (base64 of
USER:PASSWORD): a helper is a program (credhelper.py), run only when the
file naming it is the caller's own or root's and no one else can write it.

WWW-Authenticate challenges are parsed per RFC 7235 (quoted strings with
escapes, several challenges in one header)."""
import base64
import binascii
import json
import os

from .digest import ImageError

MAX_AUTHFILE = 1 << 20
DOCKER_HUB_KEYS = ("docker.io", "index.docker.io", "registry-1.docker.io")


def _tchar(c):
    return c.isalnum() or c in "!#$%&'*+-.^_`|~"


def parse_challenges(header):
    """[(scheme lowercased, {param lowercased: value})] of a WWW-Authenticate
    header value; a malformed tail ends the parse (what came before stays)."""
    out, i, n = [], 0, len(header or "")
    s = header or ""
    while i < n:
        while i < n and s[i] in " \t,":
            i += 1
        j = i
        while j < n and _tchar(s[j]):
            j += 1
        if j == i:
            break
        scheme, params, i = s[i:j].lower(), {}, j
        while i < n:
            k = i
            while k < n and s[k] in " \t,":
                k += 1
            m = k
            while m < n and _tchar(s[m]):
                m += 1
            p = m
            while p < n and s[p] in " \t":
                p += 1
            if m == k or p >= n or s[p] != "=":
                break           # not a param: the next challenge starts at k
            name, p = s[k:m].lower(), p + 1
            while p < n and s[p] in " \t":
                p += 1
            if p < n and s[p] == '"':
                val, p = [], p + 1
                while p < n and s[p] != '"':
                    if s[p] == "\\" and p + 1 < n:
                        p += 1
                    val.append(s[p])
                    p += 1
                if p >= n:
                    return out + [(scheme, params)]
                value, p = "".join(val), p + 1
            else:
                q = p
                while q < n and s[q] not in " \t,":
                    q += 1
                value, p = s[p:q], q
            params.setdefault(name, value)
            i = p
        out.append((scheme, params))
        if i < n and not (s[i] in " \t," or _tchar(s[i])):
            break
    return out


def authfile_candidates(authfile=None, env=None):
    """[(path, explicit)] in lookup order."""
    env = os.environ if env is None else env
    if authfile:
        return [(authfile, True)]
    out = []
    if env.get("REGISTRY_AUTH_FILE"):
        return [(env["REGISTRY_AUTH_FILE"], True)]
    # podman's runtime-directory auth file, only from a runtime directory that
    # is the caller's and closed to others (gpusandbox/rundir.py): one that
    # another user made first would hand the pull their credentials file.
    from .. import rundir
    if env.get("XDG_RUNTIME_DIR") and rundir.usable_runtime(env["XDG_RUNTIME_DIR"]):
        out.append((os.path.join(env["XDG_RUNTIME_DIR"], "containers", "auth.json"), False))
    home = env.get("HOME") or os.path.expanduser("~")
    out.append((os.path.join(home, ".config", "containers", "auth.json"), False))
    out.append((os.path.join(home, ".docker", "config.json"), False))
    return out


def _read_json(path, want_stat=False):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ImageError(f"cannot read auth file {path}", e.strerror) from None
    with os.fdopen(fd, "rb") as f:
        import stat
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ImageError(f"cannot read auth file {path}", "not a regular file")
        data = f.read(MAX_AUTHFILE + 1)
    if len(data) > MAX_AUTHFILE:
        raise ImageError(f"cannot read auth file {path}", f"larger than {MAX_AUTHFILE} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        raise ImageError(f"cannot read auth file {path}", "not valid JSON") from None
    if not isinstance(doc, dict):
        raise ImageError(f"cannot read auth file {path}", "not a JSON object")
    return (doc, st) if want_stat else doc


def _key_match(key, host, repo):
    """Length of the match of an `auths` key against host/repo, or -1.
    Keys may carry a scheme, a /v1/ or /v2/ suffix (docker's legacy form)
    or a repository namespace (containers-auth.json(5))."""
    k = key
    for pre in ("https://", "http://"):
        if k.startswith(pre):
            k = k[len(pre):]
    k = k.rstrip("/")
    for suf in ("/v1", "/v2"):
        if k.endswith(suf):
            k = k[: -len(suf)]
    khost, _, kpath = k.partition("/")
    hosts = DOCKER_HUB_KEYS if host in DOCKER_HUB_KEYS else (host,)
    if khost not in hosts:
        return -1
    if not kpath:
        return 0
    if repo == kpath or (repo or "").startswith(kpath + "/"):
        return len(kpath)
    return -1


def _entry_creds(entry, path):
    if not isinstance(entry, dict):
        raise ImageError(f"cannot read auth file {path}", "an auths entry is not an object")
    auth = entry.get("auth")
    if auth is None:
        return None
    if not isinstance(auth, str):
        raise ImageError(f"cannot read auth file {path}", "an auth value is not a string")
    try:
        text = base64.b64decode(auth, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise ImageError(f"cannot read auth file {path}",
                         "an auth value is not base64 of USER:PASSWORD") from None
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise ImageError(f"cannot read auth file {path}",
                         "an auth value is not base64 of USER:PASSWORD")
    return user, password


def find_credentials(host, repo=None, authfile=None, env=None):
    """(user, password) for host (and repo), or None for anonymous access.
    The first file that exists decides (as podman: files are not merged)
    unless it has no entry for the host, then the next one is read."""
    for path, explicit in authfile_candidates(authfile, env):
        got = _read_json(path, want_stat=True)
        doc, st = got if got is not None else (None, None)
        if doc is None:
            if explicit:
                raise ImageError(f"auth file {path} does not exist", None,
                                 "pass an existing file to --authfile (podman/skopeo login "
                                 "writes one)")
            continue
        helped = _helper_credentials(doc, st, path, host, env)
        if helped is not None:
            return helped
        auths = doc.get("auths", {})
        if not isinstance(auths, dict):
            raise ImageError(f"cannot read auth file {path}", "auths is not an object")
        best, best_len = None, -1
        for key, entry in auths.items():
            n = _key_match(key, host, repo)
            if n > best_len:
                creds = _entry_creds(entry, path)
                if creds is not None:
                    best, best_len = creds, n
        if best is not None:
            return best
    return None


def _helper_name(doc, path, host):
    """(helper name, the key that named it) for host, or (None, None)."""
    helpers = doc.get("credHelpers", {})
    if not isinstance(helpers, dict):
        raise ImageError(f"cannot read auth file {path}", "credHelpers is not an object")
    hosts = DOCKER_HUB_KEYS if host in DOCKER_HUB_KEYS else (host,)
    for h in hosts:
        if h in helpers:
            return helpers[h], f"credHelpers[{h!r}]"
    store = doc.get("credsStore")
    if store is not None:
        return store, "credsStore"
    return None, None


def _helper_credentials(doc, st, path, host, env):
    name, key = _helper_name(doc, path, host)
    if name is None:
        return None
    if not isinstance(name, str):
        raise ImageError(f"cannot read auth file {path}", f"{key} is not a string")
    from ..conffile import owner_problem
    why = owner_problem(st, allow_caller=True)
    if why is not None:
        raise ImageError(f"auth file {path}: {key} names a program and the file is not safe",
                         why, f"make it yours and closed to others (chmod go-w {path}), "
                         "or remove the key")
    from . import credhelper
    return credhelper.get(name, host, f"{key} in {path}", env)


def basic_header(creds):
    user, password = creds
    raw = f"{user}:{password}".encode("utf-8")
    return "Basic " + base64.b64encode(raw).decode("ascii")
