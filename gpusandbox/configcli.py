"""`gpusandbox config [--show-origin] [--json] [--keys]`: the effective
settings for this caller and where each came from (docs/config.md).

--keys prints the table itself (settings.KEYS): every key, its kind, its
default, its variable and option, where it is honoured; docs/config.md's
table is checked against it (tests/unit/test_siteconf.py)."""
import json
import sys

from . import settings as settingsmod

def _show(v):
    if v is None:
        return "(unset)"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def rows(s):
    """[(key, value, origin)]: origin is a variable, FILE:LINE or 'default'."""
    out = []
    for name in settingsmod.KEYS:
        value, where = s.lookup(name)
        lock = s.locks().get(name)
        origin = where or "default"
        if lock:
            origin += f" (locked by {lock})"
        out.append((name, value, origin))
    return out


def key_table():
    return [{"key": k.name, "kind": k.kind, "default": k.default, "variable": k.env,
             "option": k.flag, "doors": k.doors, "site_only": k.site_only,
             "doc": k.doc} for k in settingsmod.KEYS.values()]


def parser():
    import argparse
    p = argparse.ArgumentParser(prog="gpusandbox config",
                                description="the effective settings for this caller and "
                                "where each came from (docs/config.md)")
    p.add_argument("--show-origin", action="store_true",
                   help="name the variable, FILE:LINE or default each value came from")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--keys", action="store_true",
                   help="print the table of keys (kind, default, variable, doc)")
    return p


def main(argv):
    a = parser().parse_args(argv)
    if a.keys:
        t = key_table()
        if a.json:
            sys.stdout.write(json.dumps(t, indent=2) + "\n")
        else:
            for k in t:
                sys.stdout.write(f"{k['key']:16} {k['kind']:7} {_show(k['default']):10} "
                                 f"{k['variable'] or '-':28} {k['doc']}\n"
                                 f"{'':16} honoured by: {k['doors']}\n")
        return 0
    s = settingsmod.Settings()
    r = rows(s)
    for w in s.warnings():
        sys.stderr.write(f"gpusandbox: warning: {w}\n")
    if a.json:
        doc = {name: ({"value": v, "origin": o} if a.show_origin else v) for name, v, o in r}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return 0
    for name, v, o in r:
        line = f"{name} = {_show(v)}"
        if a.show_origin:
            line = f"{line:48} # {o}"
        sys.stdout.write(line + "\n")
    return 0
