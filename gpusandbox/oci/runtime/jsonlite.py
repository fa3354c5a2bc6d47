"""json.loads and json.dumps (default arguments) through CPython's own C
accelerator (_json), without importing the json package: its decoder and
encoder import re, and re imports enum, which together cost `create` (the
command that runs once per container, in a fresh Python) more than it spends
on the config itself.

The results are the json package's: the same C scanner and encoder with the
json package's default settings.  Anything the fast form does not take as it
is (bytes that are not plain UTF-8, a byte-order mark, a syntax error) goes
to the json package itself, so its result or its error (json.JSONDecodeError,
a ValueError) is exactly json.loads'.
"""
import _json


class _Context:
    # The attributes _json.make_scanner reads (json.decoder.JSONDecoder's
    # defaults: strict, no hooks, float/int, the three named constants).
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"),
                      "NaN": float("nan")}.__getitem__


_scan = _json.make_scanner(_Context())
_WS = " \t\n\r"


def _default(o):
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


def loads(s):
    if isinstance(s, (bytes, bytearray)):
        # json.detect_encoding: UTF-16/32 and a BOM are the json package's.
        if s[:1] in (b"\xef", b"\xfe", b"\xff") or b"\x00" in s[:4]:
            return _slow(s)
        try:
            s = s.decode("utf-8")
        except UnicodeDecodeError:
            return _slow(s)
    if type(s) is not str or s.startswith("\ufeff"):
        return _slow(s)
    try:
        obj, end = _scan(s, len(s) - len(s.lstrip(_WS)))
    except Exception:   # noqa: BLE001 - the json package words the error
        return _slow(s)
    if s[end:].strip(_WS):
        return _slow(s)   # "Extra data"
    return obj


def _slow(s):
    import json
    return json.loads(s)


def dumps(obj):
    """json.dumps(obj) with its defaults (ASCII, ', ' and ': ', circular
    references refused, NaN and infinities allowed)."""
    encode = _json.make_encoder({}, _default, _json.encode_basestring_ascii, None,
                                ": ", ", ", False, False, True)
    return "".join(encode(obj, 0))
