"""A CDI spec for this host's GPUs, from the injection `run` computes.

The files come from gpu/inject.plan() (the one list `run` and `gpusandbox
list` use) and are placed where `run` places them in a Debian-layout image
(inject's library directory, /usr/bin, /lib/firmware/nvidia/VERSION):
spec-level edits carry what every device needs (control nodes, libraries,
binaries, firmware, configs, IPC sockets), each device only its own nodes.
The SONAME links and the loader cache, which CDI cannot express as data,
become NVIDIA-shaped hooks when a hook binary is named (gpusandbox's
consumer does them natively; other runtimes run the binary).
"""
import os

from gpusandbox.errors import UsageError
from gpusandbox.linux import fsutil
from gpusandbox.oci.cdi.spec import LOWEST, VERSIONS, validate, vkey

STRATEGIES = ("index", "uuid", "type-index")
DEFAULT_HOOK = "/usr/bin/nvidia-cdi-hook"


def _opts(opts):
    # "bind" makes runc and crun bind a mount without a type (OCI runtime-spec).
    return [o for o in opts] + ["bind"]


def _names(dev, strategies):
    out = []
    for s in strategies:
        if hasattr(dev, "ci"):
            g = dev.gpu.index
            # g:gi names compute instance 0 of a GPU instance, as --gpus reads it.
            suffix = f":{dev.ci}" if dev.ci else ""
            if s == "index":
                out.append(f"{g}:{dev.gi}{suffix}")
            elif s == "uuid" and dev.uuid:
                out.append(dev.uuid)
            elif s == "type-index":
                out.append(f"mig{g}:{dev.gi}{suffix}")
        else:
            if s == "index":
                out.append(str(dev.index))
            elif s == "uuid" and dev.uuid:
                out.append(dev.uuid)
            elif s == "type-index":
                out.append(f"gpu{dev.index}")
    return list(dict.fromkeys(out))


def _node(n):
    d = {"path": n.path}
    if n.host_path != n.path:
        d["hostPath"] = n.host_path
    d.update(type="c", major=n.major, minor=n.minor)
    return d


def common_edits(host, inj, hook_path):
    """Spec-level containerEdits (dict) and the library folder."""
    from gpusandbox.gpu import inject
    multiarch, _ = inject._LIBDIRS.get(os.uname().machine, inject._LIBDIRS["x86_64"])
    libdir = {64: f"/usr/lib/{multiarch}", 32: "/usr/lib/i386-linux-gnu"}
    mounts, links, folders, sources = [], {}, [], {}
    for lib in inj.libs:
        d = libdir[lib.bits] + (f"/{lib.subdir}" if lib.subdir else "")
        mounts.append((lib.host_path, f"{d}/{lib.name}", inject.RO))
        soname = inject._soname(lib)
        if soname != lib.name and "/" not in soname:
            links[f"{d}/{soname}"] = lib.name
            sources[f"{d}/{soname}"] = lib.host_path
            dev = f"{lib.family}.so"
            if not lib.subdir and soname != dev:
                links[f"{d}/{dev}"] = soname
                sources[f"{d}/{dev}"] = lib.host_path
        if not lib.subdir and libdir[lib.bits] not in folders:
            folders.append(libdir[lib.bits])
    if not hook_path:
        # No hook to make the links: the library itself is bound at its
        # SONAME and development names too.  The multiarch directory is on
        # the loader's built-in search path, so dlopen("libcuda.so.1") and
        # nvidia-smi work without a loader cache entry.
        mounts += [(sources[p], p, inject.RO) for p in links]
    mounts += [(p, f"/usr/bin/{n}", inject.RO) for n, p in inj.bins]
    mounts += [(p, f"/lib/firmware/nvidia/{host.version}/{os.path.basename(p)}", inject.RO)
               for p in inj.firmware]
    mounts += [(hp, cp, opts) for cp, hp, opts in inj.configs + inj.ipc]
    edits = {
        "deviceNodes": [_node(n) for n in inj.nodes],
        "mounts": [{"hostPath": hp, "containerPath": cp, "options": _opts(o)}
                   for hp, cp, o in mounts],
    }
    if hook_path:
        tool = os.path.basename(hook_path)

        def hook(*args):
            return {"hookName": "createContainer", "path": hook_path, "args": [tool, *args],
                    "env": ["NVIDIA_CTK_DEBUG=false"]}
        hooks = []
        if links:
            hooks.append(hook("create-symlinks",
                              *[a for link, t in links.items() for a in ("--link", f"{t}::{link}")]))
        hooks.append(hook("update-ldcache", *[a for f in folders for a in ("--folder", f)]))
        hooks.append(hook("disable-device-node-modification"))
        edits["hooks"] = hooks
    return edits


def generate(driver_root="/", dev_root=None, vendor="nvidia.com", cls="gpu",
             strategies=("index", "uuid"), caps=None, cdi_version=None, hook_path=None,
             environ=None, notes=None):
    """The spec (a dict, cdiVersion the lowest its content needs, or the
    pinned `cdi_version`).  Raises UsageError/GpuError.  `notes` (a list)
    gets what discovery left out of the spec and why."""
    from gpusandbox.gpu import discover, inject, select
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad:
        raise UsageError(f"--device-name-strategy {bad[0]}", "unknown strategy",
                         "use index, uuid or type-index")
    if len(vendor) < 2 or len(cls) < 2:
        # Valid CDI, but the reference's name checks (pkg/cdi 0.5.2, inside
        # Debian 12's podman) index past a one-character vendor or class and
        # panic: no spec of ours may crash the runtimes that read it.
        raise UsageError(f"--vendor/--class {vendor}/{cls}",
                         "one-character vendor and class names crash CDI 0.5.2 readers",
                         "use at least two characters, e.g. --class gpu")
    if cdi_version is not None and cdi_version not in VERSIONS:
        raise UsageError(f"--cdi-version {cdi_version}", "not a released CDI version",
                         "use one of " + ", ".join(VERSIONS))
    # The caller's NVIDIA_* selection variables are for a launch, not for a
    # spec of the whole host: they must not change what the spec holds.
    env = {k: v for k, v in (environ if environ is not None else os.environ).items()
           if not k.startswith("NVIDIA_")}
    host = discover.discover(driver_root or "/", dev_root, environ=env)
    everything = inject.plan(host, select.resolve("all", caps, env, host))
    control = {n.path for n in inject.plan(host, select.resolve("none", caps, env, host)).nodes}
    devices = []
    picks = [(g, str(g.index)) for g in host.gpus] + \
        [(m, f"{m.gpu.index}:{m.gi}:{m.ci}") for m in host.migs]
    for dev, selector in picks:
        inj = inject.plan(host, select.resolve(selector, caps, env, host))
        nodes = [_node(n) for n in inj.nodes if n.path not in control]
        for name in _names(dev, strategies):
            devices.append({"name": name, "containerEdits": {"deviceNodes": nodes}})
    all_nodes = [_node(n) for n in everything.nodes if n.path not in control]
    devices.append({"name": "all", "containerEdits": {"deviceNodes": all_nodes}})
    common_inj = inject.plan(host, select.resolve("none", caps, env, host))
    if notes is not None:
        notes += common_inj.skipped
    doc = {"cdiVersion": LOWEST, "kind": f"{vendor}/{cls}", "devices": devices,
           "containerEdits": common_edits(host, common_inj, hook_path)}
    try:
        need = validate(dict(doc, cdiVersion=VERSIONS[-1]))
    except ValueError as e:
        raise UsageError(f"--vendor/--class {vendor}/{cls}", str(e), None) from None
    if cdi_version is not None and vkey(cdi_version) < vkey(need):
        raise UsageError(f"--cdi-version {cdi_version}",
                         f"the spec needs {need} (device names starting with a digit and "
                         "hostPath need 0.5.0, mount types 0.4.0, annotations 0.6.0)",
                         "drop --cdi-version, or use --device-name-strategy type-index and "
                         "the host's own /dev")
    doc["cdiVersion"] = cdi_version or need
    return doc


def dump(doc, fmt):
    if fmt == "json":
        import json
        return json.dumps(doc, indent=2) + "\n"
    import yaml

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True      # shared lists are written out, not as &anchors
    return "---\n" + yaml.dump(doc, Dumper=Dumper, sort_keys=False, default_flow_style=False)


def write(doc, out, fmt):
    """Write atomically (temp file in the same dir, fsync, rename), mode 0644.
    `out` is a file, or a directory that gets nvidia-gpu.{json,yaml}."""
    if os.path.isdir(out):
        vendor, _, cls = doc["kind"].partition("/")
        out = os.path.join(out, f"{vendor.split('.')[0]}-{cls}.{fmt}")
    data = dump(doc, fmt).encode()
    d = os.path.dirname(os.path.abspath(out))
    tmp = os.path.join(d, f".{os.path.basename(out)}.{os.getpid()}.tmp")
    fsutil.write_atomic(out, data, 0o644, tmp=tmp, fsync=True, chmod=True)
    return out
