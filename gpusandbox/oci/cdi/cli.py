"""`gpusandbox cdi generate|list|check`: CDI specs out, and a look at those in place."""
import os
import re
import stat
import sys

from gpusandbox.errors import SandboxError, UsageError

USAGE = """usage: gpusandbox cdi generate [--output FILE|DIR|-] [--format json|yaml] [--vendor V]
                              [--class C] [--device-name-strategy index|uuid|type-index]...
                              [--cdi-version V] [--gpu-caps CAPS] [--driver-root DIR]
                              [--dev-root DIR] [--nvidia-cdi-hook-path PATH]
       gpusandbox cdi list [--spec-dir DIR]...
       gpusandbox cdi check [SPEC...] [--driver-root DIR] [--dev-root DIR] [--spec-dir DIR]...

Container Device Interface specs: generate one for this host's GPUs, list the devices
of those in place, check them against the host.

Spec directories (lowest priority first): $GPUSANDBOX_CDI_SPEC_DIRS (colon-separated),
else /etc/cdi then /var/run/cdi.  See docs/cdi.md.
"""
_LIBVER = re.compile(r"\.so\.(\d+\.\d+(?:\.\d+)?)\Z")


_DESCRIPTIONS = {
    "generate": "Write a CDI spec of this host's GPUs (each GPU and MIG device, and all) "
                "for podman --device, containerd or run --device VENDOR/CLASS=NAME.",
    "list": "List the CDI devices the spec directories define, and the file of each.",
    "check": "Check CDI specs (given, else those in the spec directories) against this "
             "host: device nodes, driver files and devices that changed since.  Exit 1 "
             "when one is stale.",
}


def _parser(prog):
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise UsageError(f"{prog}: {message}", None, "run 'gpusandbox cdi --help'")
    return Parser(prog=prog, add_help=True, description=_DESCRIPTIONS[prog.rpartition(" ")[2]])


def _dirs(args):
    from gpusandbox.oci.cdi.registry import spec_dirs
    return args.spec_dir or spec_dirs()


def generate_parser():
    p = _parser("gpusandbox cdi generate")
    p.add_argument("--output", default="-", metavar="FILE|DIR|-",
                   help="where to write the spec: a file, a directory (e.g. /var/run/cdi) "
                        "or - for stdout (default)")
    p.add_argument("--format", choices=("json", "yaml"), default=None,
                   help="the spec's format (default: json for a .json file, else yaml)")
    p.add_argument("--vendor", default="nvidia.com", metavar="V",
                   help="the kind's vendor (default nvidia.com)")
    p.add_argument("--class", dest="cls", default="gpu", metavar="C",
                   help="the kind's class (default gpu)")
    p.add_argument("--device-name-strategy", action="append", dest="strategies",
                   metavar="index|uuid|type-index",
                   help="how devices are named (repeatable; default index and uuid)")
    p.add_argument("--cdi-version", metavar="V",
                   help="the cdiVersion to write (default: the lowest that holds the spec)")
    p.add_argument("--gpu-caps", metavar="CAPS",
                   help="driver capabilities whose files the spec mounts")
    p.add_argument("--driver-root", default=None, metavar="DIR",
                   help="where the host driver lives (default: the driver-root setting, /)")
    p.add_argument("--dev-root", metavar="DIR", help="where its device nodes live")
    p.add_argument("--nvidia-cdi-hook-path", metavar="PATH",
                   help="nvidia-cdi-hook for the spec's hooks (default: its usual path "
                        "when it exists, else no hooks)")
    return p


def main_generate(argv):
    from gpusandbox.oci.cdi import produce as gen
    from gpusandbox import settings
    a = generate_parser().parse_args(argv)
    a.driver_root, a.dev_root = settings.driver_roots(None, a.driver_root, a.dev_root)
    hook = a.nvidia_cdi_hook_path
    if hook is None:
        hook = gen.DEFAULT_HOOK if os.path.exists(gen.DEFAULT_HOOK) else ""
    if hook and not hook.startswith("/"):
        raise UsageError(f"--nvidia-cdi-hook-path {hook}", "must be absolute", None)
    notes = []
    doc = gen.generate(a.driver_root, a.dev_root, a.vendor, a.cls,
                       a.strategies or ("index", "uuid"), a.gpu_caps, a.cdi_version, hook or None,
                       notes=notes)
    for line in notes:
        sys.stderr.write(f"gpusandbox: note: {line}\n")
    fmt = a.format or ("json" if a.output.endswith(".json") else "yaml")
    if a.output == "-":
        sys.stdout.write(gen.dump(doc, fmt))
        return 0
    try:
        if a.output.endswith("/") or a.output in ("/etc/cdi", "/var/run/cdi", "/run/cdi"):
            os.makedirs(a.output, mode=0o755, exist_ok=True)
        out = gen.write(doc, a.output, fmt)
    except OSError as e:
        raise SandboxError(f"cannot write {a.output}", e.strerror,
                           "/etc/cdi and /var/run/cdi need root") from None
    sys.stderr.write(f"gpusandbox: wrote {out} (cdiVersion {doc['cdiVersion']}, "
                     f"{len(doc['devices'])} devices)\n")
    return 0


def list_parser():
    p = _parser("gpusandbox cdi list")
    p.add_argument("--spec-dir", action="append", metavar="DIR",
                   help="a spec directory to read (repeatable; default: the usual ones)")
    return p


def main_list(argv):
    from gpusandbox.oci.cdi.registry import Registry
    a = list_parser().parse_args(argv)
    reg = Registry(_dirs(a))
    for name in sorted(reg.devices):
        sys.stdout.write(f"{name}\t{reg.devices[name].path}\n")
    for name, paths in sorted(reg.conflicts.items()):
        sys.stderr.write(f"gpusandbox: warning: {name} is defined by {', '.join(paths)} "
                         "(same priority): unusable\n")
    for path, msg in reg.errors:
        sys.stderr.write(f"gpusandbox: warning: {path}: {msg}\n")
    return 0


def _spec_problems(spec, host):
    """Lines naming what in `spec` no longer matches the host."""
    out = []
    edits = [("spec", spec.doc.get("containerEdits", {}))] + \
        [(f"{spec.kind}={d['name']}", d["containerEdits"]) for d in spec.doc["devices"]]
    for where, e in edits:
        for n in e.get("deviceNodes", ()):
            hp = n.get("hostPath") or n["path"]
            try:
                st = os.stat(hp)
            except OSError as err:
                out.append(f"{where}: device node {hp}: {err.strerror}")
                continue
            if not stat.S_ISCHR(st.st_mode):
                out.append(f"{where}: device node {hp}: not a character device")
                continue
            have = (os.major(st.st_rdev), os.minor(st.st_rdev))
            said = (n.get("major", have[0]), n.get("minor", have[1]))
            if have != said:
                out.append(f"{where}: device node {hp} is {have[0]}:{have[1]} on the host, "
                           f"the spec says {said[0]}:{said[1]}")
        for m in e.get("mounts", ()):
            hp = m["hostPath"]
            if m.get("type", "bind") != "bind" and "bind" not in m.get("options", ()):
                continue
            ver = _LIBVER.search(hp)
            base = os.path.basename(hp)
            if host is not None and ver and base.startswith(("libcuda", "libnvidia")) and \
                    ver.group(1) != host.version:
                out.append(f"{where}: {hp} is of driver {ver.group(1)}, the host runs "
                           f"{host.version}")
            if not os.path.exists(hp):
                out.append(f"{where}: {hp}: no such file")
    return out


def _strategy(name):
    if name.startswith(("GPU-", "MIG-")):
        return "uuid"
    if re.match(r"(gpu|mig)\d", name):
        return "type-index"
    return "all" if name == "all" else "index"


def _device_changes(spec, fresh):
    """Device names the spec has that the host lost, and the host's new ones
    (in the naming strategies the spec uses)."""
    have = {d["name"] for d in spec.doc["devices"]}
    now = {d["name"] for d in fresh["devices"]}
    used = {_strategy(n) for n in have}
    out = [f"{spec.kind}={n}: no such device on this host any more"
           for n in sorted(have - now)]
    out += [f"{spec.kind}={n}: on this host but not in the spec"
            for n in sorted(now - have) if _strategy(n) in used]
    return out


def check_parser():
    p = _parser("gpusandbox cdi check")
    p.add_argument("specs", nargs="*", metavar="SPEC", help="spec files to check (default: "
                   "those of the spec directories)")
    p.add_argument("--driver-root", default=None, metavar="DIR",
                   help="where the host driver lives (default: the driver-root setting, /)")
    p.add_argument("--dev-root", metavar="DIR", help="where its device nodes live")
    p.add_argument("--spec-dir", action="append", metavar="DIR",
                   help="a spec directory to read (repeatable; default: the usual ones)")
    return p


def main_check(argv):
    from gpusandbox.oci.cdi.registry import Registry, Spec
    from gpusandbox.oci.cdi.spec import parse
    from gpusandbox import settings
    a = check_parser().parse_args(argv)
    a.driver_root, a.dev_root = settings.driver_roots(None, a.driver_root, a.dev_root)
    if a.specs:
        specs = []
        for path in a.specs:
            try:
                with open(path, "rb") as f:
                    doc, version = parse(f.read(), path)
            except OSError as e:
                raise UsageError(f"cannot read {path}", e.strerror, None) from None
            specs.append(Spec(path, 0, doc, version))
        errors = []
    else:
        reg = Registry(_dirs(a))
        specs, errors = reg.specs, reg.errors
    host = fresh = None
    try:
        from gpusandbox.gpu import discover
        host = discover.discover(a.driver_root, a.dev_root)
    except SandboxError as e:
        sys.stderr.write(f"gpusandbox: warning: no GPU driver to compare with: {e.line()}\n")
    stale = bool(errors)
    for path, msg in errors:
        sys.stdout.write(f"{path}: invalid: {msg}\n")
    for spec in specs:
        problems = _spec_problems(spec, host)
        if host is not None and spec.kind.startswith("nvidia.com/"):
            from gpusandbox.oci.cdi.produce import generate
            vendor, _, cls = spec.kind.partition("/")
            try:
                fresh = generate(a.driver_root, a.dev_root, vendor, cls,
                                 ("index", "uuid", "type-index"), None, None, None)
                problems += _device_changes(spec, fresh)
            except SandboxError as e:
                problems.append(f"the host's devices cannot be listed: {e.line()}")
        if problems:
            stale = True
            for line in problems:
                sys.stdout.write(f"{spec.path}: stale: {line}\n")
        else:
            sys.stdout.write(f"{spec.path}: up to date ({len(spec.doc['devices'])} devices)\n")
    if stale:
        sys.stdout.write("hint: regenerate it: gpusandbox cdi generate --output "
                         "/var/run/cdi (with the --driver-root/--dev-root it was made "
                         "with); nvidia-ctk specs: nvidia-ctk cdi generate\n")
        return 1
    return 0


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 125
    cmd, rest = argv[0], argv[1:]
    fn = {"generate": main_generate, "list": main_list, "check": main_check}.get(cmd)
    if fn is None:
        raise UsageError(f"unknown cdi command {cmd!r}", None, "use generate, list or check")
    return fn(rest)
