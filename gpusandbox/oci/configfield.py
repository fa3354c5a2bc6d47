"""The OCI config's field reader: each value checked as data of the expected
type, a wrong one refused in one line naming the field.  Below config.py
and confighost.py, which both read fields through it."""
from ..errors import UsageError


def _bad(path, why, hint=None):
    return UsageError(f"OCI config {path}", why, hint)


def _get(obj, key, typ, where, default=None):
    v = obj.get(key) if isinstance(obj, dict) else None
    if v is None:
        return default
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise _bad(where, f"{key} has the wrong type ({type(v).__name__})")
    return v


def _strs(v, where):
    if not isinstance(v, list) or not all(isinstance(x, str) and "\0" not in x for x in v):
        raise _bad(where, "must be a list of strings")
    return v
