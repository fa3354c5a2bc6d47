"""The user's mounts on the run command line: `-v`/`--bind` and docker's
`--mount`, both made Bind (a host path) or Tmpfs entries of RunSpec.binds.

Every destination is an absolute container path without `..`; the plan
normalises it and the init resolves it inside the new root.  Every mount is
nosuid and nodev whatever was asked (a bind can never carry a device node or
a setuid binary into the sandbox)."""
import os

from .errors import UsageError
from .spec import Bind, Tmpfs

# docker's --mount keys, its aliases folded onto one name each.
_KEYS = {"type": "type", "source": "src", "src": "src", "destination": "dst",
         "dst": "dst", "target": "dst", "readonly": "ro", "ro": "ro",
         "bind-propagation": "propagation", "tmpfs-size": "size", "tmpfs-mode": "mode",
         "consistency": "consistency"}
# What every bind does: the init makes its mount tree a slave of the host's
# (MS_REC | MS_SLAVE), and a clone of a slave mount is a slave of the same
# master, so mounts the host makes later under a shared SRC appear inside and
# nothing mounted inside reaches the host.  Where the host's mount is private
# there is nothing to receive: rslave and rprivate look alike.
_PROPAGATION = "rslave"
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _bad(opt, value, why, hint):
    from . import short
    raise UsageError(f"invalid {opt} {short(value, 80)}", why, hint)


def _destination(opt, value, dst, hint):
    if not dst.startswith("/"):
        _bad(opt, value, "the destination must be an absolute path", hint)
    if "\0" in dst or any(p == ".." for p in dst.split("/")):
        _bad(opt, value, "the destination may not contain '..'", "give a plain absolute path")
    return os.path.normpath(dst)


def parse_bind(value):
    """-v SRC:DST[:ro|rw], or -v PATH: the host's PATH at the same path inside."""
    parts = value.split(":")
    if len(parts) == 1:
        if not value.startswith("/"):
            _bad("--bind", value, "expected SRC:DST[:ro|rw], or one absolute PATH (the "
                 "same path inside)", "example: -v /scratch/data:/data:ro")
        dst = _destination("--bind", value, value, None)
        return Bind(os.path.abspath(value), dst, True)
    if len(parts) == 2:
        src, dst, mode = parts[0], parts[1], "rw"
    elif len(parts) == 3:
        src, dst, mode = parts
    else:
        _bad("--bind", value, "expected SRC:DST[:ro|rw]", "example: -v /scratch/data:/data:ro")
    if mode not in ("ro", "rw"):
        _bad("--bind", value, f"unknown mode {mode!r}", "use :ro or :rw")
    if not src:
        _bad("--bind", value, "SRC must be given", "example: -v /scratch/data:/data")
    if dst in ("ro", "rw") and src.startswith("/"):
        _bad("--bind", value, "the destination must be an absolute path",
             f"for the same path inside: -v {src}:{src}:{dst}")
    dst = _destination("--bind", value, dst, "example: -v /scratch/data:/data")
    return Bind(os.path.abspath(src), dst, mode == "rw")


def csv_fields(text):
    """docker's CSV (--mount, --gpus): comma-separated fields, a double-quoted
    part keeping its commas, the quotes dropped; None when a quote is left
    open."""
    out, cur, quoted = [], [], False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if quoted:
        return None
    out.append("".join(cur))
    return out


def _fields(value):
    fields = csv_fields(value)
    if fields is None:
        _bad("--mount", value, "unbalanced double quote", None)
    return fields


def _bool(value, key, text):
    low = text.lower()
    if low in ("", "1", "true"):
        return True
    if low in ("0", "false"):
        return False
    _bad("--mount", value, f"{key}={text!r} is not true or false", f"write {key} alone")


def size_bytes(text):
    """N[k|m|g|t][b|ib] (binary units, as docker's tmpfs-size) -> bytes, or None."""
    low = text.strip().lower()
    for suffix in ("ib", "b"):
        if low.endswith(suffix) and len(low) > len(suffix):
            low = low[:-len(suffix)]
            break
    unit = low[-1:] if low[-1:] in _UNITS and low[-1:] else ""
    digits = low[:-1] if unit else low
    if not digits.isascii() or not digits.isdigit() or len(digits) > 15:
        return None
    return int(digits) * _UNITS[unit]


def parse_mount(value):
    """docker's --mount: type=bind,src=SRC,dst=DST[,ro][,bind-propagation=rslave]
    or type=tmpfs,dst=DST[,tmpfs-size=N][,tmpfs-mode=OCTAL][,ro]."""
    got = {}
    for field in _fields(value):
        key, eq, val = field.partition("=")
        name = _KEYS.get(key.strip().lower())
        if name is None:
            _bad("--mount", value, f"unknown key {key.strip()!r}",
                 "keys: type, src|source, dst|target|destination, ro|readonly, "
                 "bind-propagation, tmpfs-size, tmpfs-mode")
        if name in got:
            _bad("--mount", value, f"{key.strip()} given twice", None)
        if name != "ro" and not eq:
            _bad("--mount", value, f"{key.strip()} needs a value", f"write {key.strip()}=...")
        got[name] = val if name != "ro" else _bool(value, key.strip(), val)
    kind = got.get("type")
    if kind is None:
        _bad("--mount", value, "type= is missing",
             "use type=bind,src=DIR,dst=PATH or type=tmpfs,dst=PATH")
    if kind == "volume":
        _bad("--mount", value, "named volumes are not offered",
             "bind a host directory instead: type=bind,src=DIR,dst=PATH")
    if kind not in ("bind", "tmpfs"):
        _bad("--mount", value, f"unknown type {kind!r}", "use type=bind or type=tmpfs")
    if not got.get("dst"):
        _bad("--mount", value, "dst= is missing", f"example: type={kind},dst=/data" +
             (",src=/scratch/data" if kind == "bind" else ""))
    dst = _destination("--mount", value, got["dst"], "example: dst=/data")
    rw = not got.get("ro", False)
    if kind == "bind":
        for key in ("size", "mode"):
            if key in got:
                _bad("--mount", value, "tmpfs-size and tmpfs-mode apply to type=tmpfs", None)
        if not got.get("src"):
            _bad("--mount", value, "src= is missing", "example: type=bind,src=/scratch/data,dst=/data")
        prop = got.get("propagation")
        if prop is not None and prop != _PROPAGATION:
            _bad("--mount", value, f"bind-propagation={prop} is not offered",
                 "every bind is rslave (the host's later mounts under SRC show inside, "
                 "nothing goes back): drop bind-propagation or write rslave")
        return Bind(os.path.abspath(got["src"]), dst, rw)
    for key in ("src", "propagation"):
        if key in got:
            _bad("--mount", value, f"{'src' if key == 'src' else 'bind-propagation'}= does "
                 "not apply to type=tmpfs", None)
    size = None
    if "size" in got:
        size = size_bytes(got["size"])
        if not size or size > 1 << 60:
            _bad("--mount", value, f"tmpfs-size {got['size']!r} is not a size",
                 "bytes, or with a unit: tmpfs-size=64m, tmpfs-size=1g")
    mode = 0o1777
    if "mode" in got:
        text = got["mode"].strip()
        if not text or len(text) > 5 or any(c not in "01234567" for c in text) \
                or int(text, 8) > 0o7777:
            _bad("--mount", value, f"tmpfs-mode {got['mode']!r} is not an octal mode",
                 "example: tmpfs-mode=1777")
        mode = int(text, 8)
    return Tmpfs(dst, size, mode, rw)
