"""json.loads and json.dumps for the OCI runtime's `create` (config.json,
state.json) without importing the json package, whose re and enum imports
cost that once-per-container command more than the config itself.

fastjson runs the same C scanner and encoder as the json package; whatever
it does not take (a byte-order mark, UTF-16, a syntax error, nesting too
deep) goes to the json package itself, so the result or the error is
exactly json.loads'.
"""
from ..fastjson import dumps  # noqa: F401 - json.dumps(obj)'s text
from ..fastjson import loads as _loads


def loads(s):
    try:
        return _loads(s)
    except (ValueError, RecursionError):
        import json
        return json.loads(s)
