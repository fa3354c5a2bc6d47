"""Host names, URLs and headers as the registry client meets them: pure
functions, no HTTP library."""
import ipaddress
import time
import urllib.parse


def clean(text, limit=200):
    """Server text made safe for one terminal line."""
    return "".join(c if c.isprintable() else "?" for c in str(text))[:limit]


def split_hostport(hostport):
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") else None
    if hostport.count(":") > 1:
        return hostport, None       # a bare IPv6 address
    host, sep, port = hostport.rpartition(":")
    return (host, port) if sep and port.isdigit() else (hostport, None)


def is_loopback(hostport):
    host = split_hostport(hostport)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin(url):
    p = urllib.parse.urlsplit(url)
    return p.scheme, (p.hostname or "").lower(), p.port or (443 if p.scheme == "https" else 80)


def retry_after(value, cap):
    if not value:
        return None
    try:
        return min(max(float(value), 0.0), cap)
    except ValueError:
        pass
    try:
        from email.utils import parsedate_to_datetime
        return min(max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0), cap)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _chain(exc):
    """`exc` and what it wraps: __cause__, __context__, urllib3's .reason
    and exceptions among args (requests wraps MaxRetryError there), each
    once, outermost first."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen or not isinstance(e, BaseException):
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None)]
        todo += [a for a in e.args if isinstance(a, BaseException)]


def net_cause(exc):
    """Why a connection failed, in a few words, from the innermost error
    that says it (an HTTP library's message quotes pools and URLs, and is
    cut mid-word at any fixed length): the resolver's, a refusal, a
    timeout, a TLS verification failure, else the socket error's text."""
    import socket
    import ssl
    errs = list(_chain(exc))
    for e in errs:
        if isinstance(e, socket.gaierror):
            return f"cannot resolve the host name ({e.strerror or e})"
    for e in errs:
        if isinstance(e, ssl.SSLCertVerificationError):
            return f"TLS certificate not trusted ({clean(e.verify_message or e, 100)})"
    for e in errs:
        if isinstance(e, ConnectionRefusedError):
            return "connection refused (nothing listens on that port)"
        if isinstance(e, (ConnectionResetError, ConnectionAbortedError)):
            return "the connection was reset"
    for e in errs:
        if isinstance(e, (TimeoutError, socket.timeout)) or "Timeout" in type(e).__name__:
            return "timed out"
    for e in errs:
        if isinstance(e, ssl.SSLError):
            return f"TLS failed ({clean(e.reason or e, 100)})"
    for e in reversed(errs):
        if isinstance(e, OSError) and e.strerror:
            return clean(e.strerror, 100)
    return clean(type(errs[-1]).__name__, 60)
