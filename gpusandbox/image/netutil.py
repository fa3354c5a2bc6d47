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
