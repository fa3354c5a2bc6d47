"""Comparing two probe reports (parity_probe.py) aspect by aspect: each
aspect gives a list of differences, one short line each, that the door
parity test (test_door_parity.py) matches against its table of allowed
differences.

    +KEY VALUE      only the door has it
    -KEY VALUE      only the reference has it
    ~KEY REF -> DOOR  both, with different values
"""
import json

ASPECTS = ("mounts", "dev", "device-filter", "env", "ids", "caps", "no_new_privs", "seccomp",
           "cgroup", "network", "bind", "process")
CAPS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def _show(v):
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def diff_maps(ref, door):
    out = []
    for k in sorted(set(ref) | set(door)):
        if k not in door:
            out.append(f"-{k} {_show(ref[k])}")
        elif k not in ref:
            out.append(f"+{k} {_show(door[k])}")
        elif ref[k] != door[k]:
            out.append(f"~{k} {_show(ref[k])} -> {_show(door[k])}")
    return out


def _mount_map(mounts):
    """point (with #N for the Nth mount stacked there) -> what matters of it."""
    out = {}
    for m in mounts:
        key = m["point"] + (f"#{m['stack']}" if m["stack"] else "")
        out[key] = "%s %s [%s] under %s" % (m["type"], ",".join(m["opts"]),
                                            ",".join(m["super"]), m["parent"])
    return out


def _mount_diffs(ref, door):
    out = []
    a, b = _mount_map(ref), _mount_map(door)
    for k in sorted(set(a) | set(b)):
        if k not in b:
            out.append(f"-{k} {a[k]}")
        elif k not in a:
            out.append(f"+{k} {b[k]}")
        elif a[k] != b[k]:
            # field by field, so an allowed difference names only its field
            ta, tb = a[k].split(" ", 2), b[k].split(" ", 2)
            for name, x, y in zip(("type", "opts", "rest"), ta, tb):
                if x != y:
                    out.append(f"~{k} {name} {x} -> {y}")
    return out


def aspect_diffs(aspect, ref, door):
    """The differences of `door`'s report from `ref`'s in one aspect."""
    if aspect == "mounts":
        return _mount_diffs(ref["mounts"], door["mounts"])
    if aspect == "dev":
        return diff_maps(ref["dev"], door["dev"])
    if aspect == "device-filter":
        return diff_maps(ref["gpu"], door["gpu"])
    if aspect == "env":
        return diff_maps(ref["env"], door["env"])
    if aspect == "ids":
        return diff_maps(ref["ids"], door["ids"])
    if aspect == "caps":
        return diff_maps({k: ref["status"][k] for k in CAPS},
                         {k: door["status"][k] for k in CAPS})
    if aspect == "no_new_privs":
        return diff_maps({"NoNewPrivs": ref["status"]["NoNewPrivs"]},
                         {"NoNewPrivs": door["status"]["NoNewPrivs"]})
    if aspect == "seccomp":
        return diff_maps({"Seccomp": ref["status"]["Seccomp"]},
                         {"Seccomp": door["status"]["Seccomp"]})
    if aspect == "cgroup":
        return diff_maps({c["controllers"]: c["root"] for c in ref["cgroup"]},
                         {c["controllers"]: c["root"] for c in door["cgroup"]})
    if aspect == "network":
        return diff_maps(ref["net"], door["net"])
    if aspect == "bind":
        return diff_maps(ref["bind"], door["bind"])
    if aspect == "process":
        keys = ("umask", "cwd", "hostname")
        return diff_maps({k: ref[k] for k in keys}, {k: door[k] for k in keys})
    raise ValueError(aspect)
