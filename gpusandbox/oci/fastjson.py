"""JSON for config.json on the runtime wrapper's and the filter's `create`
path, straight from the C accelerator (_json) that the json package wraps.

`import json` costs more than the rest of a cached create together: its
modules compile half a dozen regular expressions (and import re, enum and
functools) at import time.  The C scanner and encoder are the same code
json.loads and json.dumps run; dumps() here gives exactly json.dumps(obj)'s
bytes (ASCII, default separators), loads() accepts what json.loads does
for a document (NaN/Infinity included, duplicate keys: the last wins) and
fails as it does.  Used by the wrapper, the filter and the OCI runtime.
"""
import _json

_WS = " \t\n\r"


class _Ctx:
    """The attributes _json.make_scanner reads from a JSONDecoder."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    memo = None

    @staticmethod
    def parse_constant(name):
        return {"NaN": float("nan"), "Infinity": float("inf"),
                "-Infinity": float("-inf")}[name]


_scan = _json.make_scanner(_Ctx())


def loads(data):
    """json.loads(data) for a document (bytes, UTF-8, or str): the same
    result, and on bad input the same ValueError, since whatever the scanner
    here does not take (a byte-order mark, UTF-16, a syntax error, nesting
    too deep) is handed to the json package itself."""
    try:
        s = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
        if s.startswith("\ufeff"):
            raise ValueError("unexpected UTF-8 BOM")
        i = len(s) - len(s.lstrip(_WS))
        try:
            obj, end = _scan(s, i)
        except StopIteration as e:
            raise ValueError(f"expecting value at char {e.value}") from None
        if s[end:].strip(_WS):
            raise ValueError(f"extra data at char {end}")
        return obj
    except (ValueError, RecursionError):
        import json
        return json.loads(data)


def _default(o):
    raise TypeError(f"object of type {type(o).__name__} is not JSON serializable")


def dumps(obj):
    """json.dumps(obj) (compact separators, ASCII) as a str."""
    enc = _json.make_encoder({}, _default, _json.encode_basestring_ascii, None,
                             ": ", ", ", False, False, True)
    return "".join(enc(obj, 0))
