"""The specs on this host: every *.json / *.yaml in the spec directories.

As the reference cache does (pkg/cdi/cache.go): a directory's priority is
its place in the list, so /var/run/cdi (generated at boot) overrides
/etc/cdi (static); a device named by two specs of the same priority is a
conflict.  The reference drops such devices silently; here resolving one is
an error that names both files.  A spec that fails to parse is skipped, and
its error is kept so that a name it would have defined is reported with it.
"""
import os

from gpusandbox.errors import SandboxError, UsageError
from gpusandbox.oci.cdi.spec import MAX_SPEC_BYTES, SpecError, parse

DEFAULT_DIRS = ("/etc/cdi", "/var/run/cdi")
ENV_DIRS = "GPUSANDBOX_CDI_SPEC_DIRS"
_SUFFIXES = (".json", ".yaml", ".yml")


def spec_dirs(environ=None):
    """The spec directories, lowest priority first: GPUSANDBOX_CDI_SPEC_DIRS
    (colon-separated) when set, else /etc/cdi then /var/run/cdi."""
    value = (environ if environ is not None else os.environ).get(ENV_DIRS)
    if value is None:
        return list(DEFAULT_DIRS)
    return [d for d in value.split(":") if d]


class Spec:
    """One parsed spec file: path, priority, doc (the dict), version (the
    lowest its content needs), vendor, cls."""
    __slots__ = ("path", "priority", "doc", "version", "vendor", "cls")

    def __init__(self, path, priority, doc, version):
        self.path, self.priority, self.doc, self.version = path, priority, doc, version
        self.vendor, _, self.cls = doc["kind"].partition("/")

    @property
    def kind(self):
        return self.doc["kind"]

    def device(self, name):
        return next(d for d in self.doc["devices"] if d["name"] == name)


class Registry:
    """devices: qualified name -> Spec; conflicts: name -> [paths];
    errors: [(path, message)] of specs that could not be used."""

    def __init__(self, dirs):
        self.dirs = list(dirs)
        self.specs = []
        self.devices = {}
        self.conflicts = {}
        self.errors = []
        for prio, d in enumerate(self.dirs):
            for path in _files(d, self.errors):
                try:
                    with open(path, "rb") as f:
                        data = f.read(MAX_SPEC_BYTES + 1)
                    doc, version = parse(data, path)
                except OSError as e:
                    self.errors.append((path, e.strerror))
                    continue
                except SpecError as e:
                    self.errors.append((path, e.why))
                    continue
                self._add(Spec(path, prio, doc, version))

    def _add(self, spec):
        self.specs.append(spec)
        for dev in spec.doc["devices"]:
            name = f"{spec.kind}={dev['name']}"
            old = self.devices.get(name)
            if old is None or old.priority < spec.priority:
                self.devices[name] = spec
                self.conflicts.pop(name, None)
            elif old.priority == spec.priority:
                self.conflicts.setdefault(name, [old.path]).append(spec.path)

    def lookup(self, name):
        """(Spec, device dict) for a qualified name; SandboxError when no
        usable spec defines it or two of equal priority do."""
        if name in self.conflicts:
            raise SandboxError(f"CDI device {name}", "defined by more than one spec of the "
                               "same priority: " + ", ".join(self.conflicts[name]),
                               hint="remove the stale spec, or move one to a higher-priority "
                                    "directory (" + " < ".join(self.dirs) + ")")
        spec = self.devices.get(name)
        if spec is None:
            kind, _, dev = name.partition("=")
            have = sorted(n for n in self.devices if n.startswith(kind + "="))
            why = "no spec in " + ", ".join(self.dirs) + " defines it"
            if self.errors:
                why += " (unusable: " + "; ".join(f"{p}: {m}" for p, m in self.errors) + ")"
            hint = (f"this host has {', '.join(have)}" if have else
                    "write a spec with 'gpusandbox cdi generate --output /var/run/cdi' or "
                    "'nvidia-ctk cdi generate'; 'gpusandbox cdi list' shows the known devices")
            raise SandboxError(f"CDI device {name}", why, hint=hint)
        return spec, spec.device(name.partition("=")[2])


def _files(d, errors):
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return []
    except OSError as e:
        errors.append((d, e.strerror))
        return []
    return [os.path.join(d, n) for n in names if n.endswith(_SUFFIXES)
            and os.path.isfile(os.path.join(d, n))]


def parse_name(value):
    """'VENDOR/CLASS=NAME' -> the same string, checked; UsageError if malformed."""
    from gpusandbox.oci.cdi.spec import _CLASS_DOT, _DEVICE, _VENDOR
    kind, eq, name = value.partition("=")
    vendor, slash, cls = kind.partition("/")
    if not (eq and slash and _VENDOR.match(vendor) and _CLASS_DOT.match(cls)
            and _DEVICE.match(name)):
        raise UsageError(f"invalid CDI device name {value!r}", "expected VENDOR/CLASS=NAME",
                         "example: --device nvidia.com/gpu=0")
    return value
