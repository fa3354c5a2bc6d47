"""Credential helpers: docker's `docker-credential-NAME get` protocol
(docker/docker-credential-helpers): the server on stdin, one JSON object
{"ServerURL", "Username", "Secret"} on stdout; an error is a message on
stdout (or stderr) and a non-zero exit, and "credentials not found in
native keychain" means none, not a failure.

The helper is run only when the auth file that names it (credsStore,
credHelpers) is the caller's own or root's and no one else can write it
(auth.py checks before calling here): a file another user could write would
choose the program a pull runs.  NAME is one plain word (no '/').  It runs
with a small environment (ENV_KEEP, and the variables its own family reads,
HELPER_ENV), never the caller's other secrets; with stdin the server, a
timeout, and its error output shown (bounded, one line) when it fails.  The
secret it returns is never printed or logged."""
import json
import os
import shutil
import subprocess

from .digest import ImageError
from .netutil import clean

TIMEOUT = 30.0              # seconds; $GPUSANDBOX_CREDENTIAL_HELPER_TIMEOUT
TIMEOUT_VAR = "GPUSANDBOX_CREDENTIAL_HELPER_TIMEOUT"
MAX_OUTPUT = 1 << 16
NOT_FOUND = "credentials not found in native keychain"
ENV_KEEP = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "XDG_RUNTIME_DIR",
            "XDG_CONFIG_HOME", "XDG_DATA_HOME", "DBUS_SESSION_BUS_ADDRESS", "DISPLAY",
            "GNUPGHOME", "PASSWORD_STORE_DIR")
# The variables a helper of this family reads for its own login (prefixes).
HELPER_ENV = {
    "ecr-login": ("AWS_",), "gcr": ("CLOUDSDK_", "GOOGLE_"), "gcloud": ("CLOUDSDK_", "GOOGLE_"),
    "acr-env": ("AZURE_",),
}
_NAME_OK = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def helper_env(name, environ):
    keep = HELPER_ENV.get(name, ())
    return {k: v for k, v in environ.items()
            if k in ENV_KEEP or keep and k.startswith(keep)}


def server_for(host):
    """What the helper is asked for: docker's key for Docker Hub, else the
    registry's host[:port] (what `docker login HOST` stored)."""
    return "https://index.docker.io/v1/" if host in ("docker.io", "index.docker.io",
                                                      "registry-1.docker.io") else host


def _kill(p):
    """The helper and whatever it started (its own session)."""
    import signal
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    p.wait()
    for f in (p.stdin, p.stdout, p.stderr):
        try:
            f.close()
        except OSError:
            pass


def get(name, host, origin, environ=None):
    """(user, secret) the helper `name` gives for `host`, or None when it has
    none.  `origin`: the file and key that named it (for the error line)."""
    env = os.environ if environ is None else environ
    prog = f"docker-credential-{name}"
    if not name or not _NAME_OK.issuperset(name) or name[0] == ".":
        raise ImageError(f"credential helper {clean(name, 60)!r} ({origin})",
                         "not a helper name (one word: docker-credential-NAME)")
    path = shutil.which(prog, path=env.get("PATH") or os.defpath)
    if path is None:
        raise ImageError(f"credential helper {prog} not found ({origin})",
                         "it is not on PATH", f"install {prog}, or remove {origin}")
    try:
        timeout = float(env.get(TIMEOUT_VAR) or TIMEOUT)
    except ValueError:
        timeout = TIMEOUT
    if not 0 < timeout < 3600:
        timeout = TIMEOUT
    try:
        p = subprocess.Popen([path, "get"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=helper_env(name, env), close_fds=True,
                             start_new_session=True, cwd="/")
    except OSError as e:
        raise ImageError(f"credential helper {prog} ({origin}) could not run",
                         e.strerror) from None
    try:
        stdout, stderr = p.communicate(server_for(host).encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(p)
        raise ImageError(f"credential helper {prog} ({origin}) did not answer",
                         f"no answer within {timeout:g} s", "check the helper (is it waiting "
                         "for a password prompt or a locked keyring?)") from None
    except BaseException:
        _kill(p)
        raise
    r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    out = r.stdout[:MAX_OUTPUT].decode("utf-8", "replace").strip()
    if r.returncode != 0:
        if NOT_FOUND in out:
            return None
        msg = r.stderr[:MAX_OUTPUT].decode("utf-8", "replace").strip() or out
        raise ImageError(f"credential helper {prog} ({origin}) failed for {host}",
                         f"exit {r.returncode}: {clean(msg, 200) or 'no message'}",
                         f"log in again with the tool that stored the credentials "
                         f"(echo {server_for(host)} | {prog} get shows what it says)")
    try:
        doc = json.loads(out)
    except (ValueError, RecursionError):
        doc = None
    user = doc.get("Username") if isinstance(doc, dict) else None
    secret = doc.get("Secret") if isinstance(doc, dict) else None
    if not isinstance(user, str) or not isinstance(secret, str) or not user or not secret:
        raise ImageError(f"credential helper {prog} ({origin}) gave no valid credentials "
                         f"for {host}", "expected JSON with Username and Secret on stdout")
    if user == "<token>":
        raise ImageError(f"credential helper {prog} ({origin}) gave an identity token for "
                         f"{host}", "identity tokens (OAuth2 refresh tokens) are not supported",
                         "store a username and password or access token instead")
    return user, secret
