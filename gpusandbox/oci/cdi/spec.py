"""CDI specs as data: strict parsing, validation, the version rules.

A spec is kept as the plain dict it was decoded from (JSON or YAML), every
field checked here against the schema of the CDI specification
(container-device-interface SPEC.md, specs-go/config.go): unknown fields are
errors, as the reference parser's strict decoding makes them, and each field
needs the cdiVersion that introduced it (specs-go/version.go).  Nothing here
touches the host: host paths are only checked for form (absolute, no `..`).
"""
import json
import re

from gpusandbox.errors import SandboxError

# Released spec versions, oldest first; a spec names one of them.
VERSIONS = ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0",
            "1.0.0", "1.1.0")
# The lowest version gpusandbox writes: 0.3.0 is the first whose
# containerEdits the reference still treats as current (env, deviceNodes,
# mounts, hooks); 0.1/0.2 only parse for compatibility.
LOWEST = "0.3.0"
HOOK_NAMES = ("prestart", "createRuntime", "createContainer", "startContainer",
              "poststart", "poststop")
MAX_SPEC_BYTES = 4 << 20

_VENDOR = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
_CLASS = re.compile(r"[A-Za-z](?:[A-Za-z0-9_-]*[A-Za-z0-9])?\Z")
_CLASS_DOT = re.compile(r"[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?\Z")
_DEVICE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?\Z")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

# field -> (type check, minimum version)
_SPEC = {"cdiVersion": (str, "0.1.0"), "kind": (str, "0.1.0"), "devices": (list, "0.1.0"),
         "containerEdits": (dict, "0.1.0"), "annotations": (dict, "0.6.0")}
_DEVICE_FIELDS = {"name": (str, "0.1.0"), "containerEdits": (dict, "0.1.0"),
                  "annotations": (dict, "0.6.0")}
_EDITS = {"env": (list, "0.1.0"), "deviceNodes": (list, "0.1.0"), "hooks": (list, "0.1.0"),
          "mounts": (list, "0.1.0"), "intelRdt": (dict, "0.7.0"),
          "additionalGids": (list, "0.7.0"), "netDevices": (list, "1.1.0")}
_NODE = {"path": (str, "0.1.0"), "hostPath": (str, "0.5.0"), "type": (str, "0.1.0"),
         "major": (int, "0.1.0"), "minor": (int, "0.1.0"), "fileMode": (int, "0.1.0"),
         "permissions": (str, "0.1.0"), "uid": (int, "0.1.0"), "gid": (int, "0.1.0")}
_MOUNT = {"hostPath": (str, "0.1.0"), "containerPath": (str, "0.1.0"),
          "options": (list, "0.1.0"), "type": (str, "0.4.0")}
_HOOK = {"hookName": (str, "0.1.0"), "path": (str, "0.1.0"), "args": (list, "0.1.0"),
         "env": (list, "0.1.0"), "timeout": (int, "0.1.0")}
_RDT = {"closID": (str, "0.7.0"), "l3CacheSchema": (str, "0.7.0"),
        "memBwSchema": (str, "0.7.0"), "enableCMT": (bool, "0.7.0"),
        "enableMBM": (bool, "0.7.0"), "schemata": (list, "1.1.0"),
        "enableMonitoring": (bool, "1.1.0")}
_NETDEV = {"hostInterfaceName": (str, "1.1.0"), "name": (str, "1.1.0")}


class SpecError(SandboxError):
    """A CDI spec that is not valid: `what` names the file, `why` the field."""


def vkey(version):
    return tuple(int(p) for p in version.split("."))


def _fields(obj, schema, where, need):
    """Check obj's keys and value types against schema; record in `need`
    the versions its fields require."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object")
    for key, value in obj.items():
        if key not in schema:
            raise ValueError(f"{where}: unknown field {key!r}")
        kind, since = schema[key]
        # bool is an int in Python; the schema's integers are never booleans.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{where}.{key}: expected {kind.__name__}")
        need.append(since)


def _strings(value, where):
    if not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: expected a list of strings")


def check_path(path, where):
    """A path a spec names: absolute, one line, no `..` component."""
    if not path.startswith("/") or "\0" in path or "\n" in path or \
            ".." in path.split("/"):
        raise ValueError(f"{where}: {path!r} must be an absolute path without '..'")


def _edits(edits, where, need):
    _fields(edits, _EDITS, where, need)
    for i, item in enumerate(edits.get("env", ())):
        if not isinstance(item, str) or not _ENV_KEY.match(item.partition("=")[0]) \
                or "=" not in item or "\0" in item:
            raise ValueError(f"{where}.env[{i}]: expected KEY=VALUE")
    for i, node in enumerate(edits.get("deviceNodes", ())):
        w = f"{where}.deviceNodes[{i}]"
        _fields(node, _NODE, w, need)
        if "path" not in node:
            raise ValueError(f"{w}: missing path")
        check_path(node["path"], w + ".path")
        if "hostPath" in node:
            check_path(node["hostPath"], w + ".hostPath")
        if node.get("type", "c") not in ("b", "c", "u", "p"):
            raise ValueError(f"{w}.type: {node['type']!r} is not b, c, u or p")
        perms = node.get("permissions", "")
        if not set(perms) <= set("rwm"):
            raise ValueError(f"{w}.permissions: {perms!r} is not made of r, w, m")
        for k in ("major", "minor", "uid", "gid", "fileMode"):
            if node.get(k, 0) < 0:
                raise ValueError(f"{w}.{k}: negative")
    for i, mnt in enumerate(edits.get("mounts", ())):
        w = f"{where}.mounts[{i}]"
        _fields(mnt, _MOUNT, w, need)
        for k in ("hostPath", "containerPath"):
            if k not in mnt:
                raise ValueError(f"{w}: missing {k}")
        check_path(mnt["containerPath"], w + ".containerPath")
        if mnt.get("type", "bind") == "bind" or "bind" in mnt.get("options", ()) \
                or "rbind" in mnt.get("options", ()):
            check_path(mnt["hostPath"], w + ".hostPath")
        _strings(mnt.get("options", ()), w + ".options")
    for i, hook in enumerate(edits.get("hooks", ())):
        w = f"{where}.hooks[{i}]"
        _fields(hook, _HOOK, w, need)
        if hook.get("hookName") not in HOOK_NAMES:
            raise ValueError(f"{w}.hookName: {hook.get('hookName')!r} is not one of "
                             + ", ".join(HOOK_NAMES))
        if "path" not in hook:
            raise ValueError(f"{w}: missing path")
        check_path(hook["path"], w + ".path")
        _strings(hook.get("args", ()), w + ".args")
        _strings(hook.get("env", ()), w + ".env")
        if hook.get("timeout", 1) <= 0:
            raise ValueError(f"{w}.timeout: must be > 0")
    if "intelRdt" in edits:
        _fields(edits["intelRdt"], _RDT, where + ".intelRdt", need)
    gids = edits.get("additionalGids", ())
    if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gids):
        raise ValueError(f"{where}.additionalGids: expected non-negative integers")
    for i, nd in enumerate(edits.get("netDevices", ())):
        _fields(nd, _NETDEV, f"{where}.netDevices[{i}]", need)


def _annotations(obj, where):
    ann = obj.get("annotations", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in ann.items()):
        raise ValueError(f"{where}.annotations: expected string keys and values")


def validate(doc):
    """Check a decoded spec; return the lowest cdiVersion its content needs.

    Raises ValueError naming the first bad field: unknown fields, wrong
    types, bad names, bad paths, and fields newer than the spec's own
    cdiVersion are all invalid."""
    need = [LOWEST]
    _fields(doc, _SPEC, "spec", need)
    for key in ("cdiVersion", "kind", "devices"):
        if key not in doc:
            raise ValueError(f"spec: missing {key}")
    version = doc["cdiVersion"]
    if version not in VERSIONS:
        raise ValueError(f"cdiVersion {version!r} is not a released version "
                         f"({', '.join(VERSIONS)})")
    vendor, slash, cls = doc["kind"].partition("/")
    if not slash or not _VENDOR.match(vendor) or not _CLASS_DOT.match(cls):
        raise ValueError(f"kind {doc['kind']!r}: expected VENDOR/CLASS (letters, digits, "
                         "'_', '-', '.' in the vendor)")
    if not _CLASS.match(cls):
        need.append("0.6.0")      # '.' in the class
    _annotations(doc, "spec")
    if "containerEdits" in doc:
        _edits(doc["containerEdits"], "spec.containerEdits", need)
    if not doc["devices"]:
        raise ValueError("spec.devices: no device")
    seen = set()
    for i, dev in enumerate(doc["devices"]):
        w = f"devices[{i}]"
        _fields(dev, _DEVICE_FIELDS, w, need)
        name = dev.get("name")
        if not isinstance(name, str) or not _DEVICE.match(name):
            raise ValueError(f"{w}.name: {name!r} is not a device name (letters, digits, "
                             "'_', '-', '.', ':'; starting and ending with a letter or digit)")
        if name in seen:
            raise ValueError(f"{w}.name: {name!r} named twice")
        seen.add(name)
        if name[0].isdigit():
            need.append("0.5.0")
        if "containerEdits" not in dev:
            raise ValueError(f"{w}: missing containerEdits")
        _annotations(dev, w)
        _edits(dev["containerEdits"], f"{w}.containerEdits", need)
    lowest = max(need, key=vkey)
    if vkey(version) < vkey(lowest):
        raise ValueError(f"cdiVersion {version} is too low for the spec's content, "
                         f"which needs {lowest}")
    return lowest


def decode(data, name):
    """bytes -> dict: JSON when the file is named *.json, else YAML (a JSON
    document is YAML too).  Duplicate keys are errors in both."""
    if len(data) > MAX_SPEC_BYTES:
        raise ValueError(f"larger than {MAX_SPEC_BYTES} bytes")
    text = data.decode("utf-8")
    if name.endswith(".json"):
        def pairs(items):
            out = {}
            for k, v in items:
                if k in out:
                    raise ValueError(f"duplicate key {k!r}")
                out[k] = v
            return out
        return json.loads(text, object_pairs_hook=pairs)
    import yaml

    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader, node):
        out = {}
        for knode, vnode in node.value:
            key = loader.construct_object(knode, deep=True)
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = loader.construct_object(vnode, deep=True)
        return out

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        return yaml.load(text, Loader=Strict)
    except yaml.YAMLError as e:
        raise ValueError(str(e).replace("\n", " ")) from None


def parse(data, name):
    """A spec file's bytes -> (doc, lowest version); SpecError on any fault."""
    try:
        doc = decode(data, name)
        lowest = validate(doc)
    except (ValueError, UnicodeDecodeError) as e:
        raise SpecError(f"CDI spec {name}", str(e),
                        hint="the CDI specification (SPEC.md) lists the fields of each "
                             "cdiVersion") from None
    return doc, lowest
