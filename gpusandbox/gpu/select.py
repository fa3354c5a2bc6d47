"""GPU selection: a GpuRequest (gpu/request.py) resolved on a host -> a Selection.

The request says what was asked and where it came from (the caller's
--gpus / NVIDIA_VISIBLE_DEVICES / a Slurm step, or a config.json's
process.env); this module only matches it against the host's devices.

Selector items: "all", "none", "void", a GPU index, "GPU-<uuid>", a PCI bus
id ("06:00.0", "0000:06:00.0", case-insensitive), a MIG pair "<gpu>:<gi>"
(GPU index and GPU-instance id: every compute instance of that GI) or triple
"<gpu>:<gi>:<ci>", "MIG-<uuid>" (resolved through NVML, only when given) and
the legacy "MIG-GPU-<uuid>/<gi>/<ci>".
"""
from gpusandbox.errors import GpuError, UsageError
from gpusandbox.gpu.request import SLURM, from_caller
from gpusandbox import isdigits

class Selection:
    """What a launch gets.  gpus: whole GPUs (list of discover.Gpu);
    migs: MIG devices (list of discover.MigDevice); caps: requested driver
    capabilities (tuple, canonical order); none: True for "none" (driver
    files, no GPU node); visible: the NVIDIA_VISIBLE_DEVICES value the
    sandbox sees; source: where the selector came from (for messages);
    mig_config / mig_monitor: whether the MIG config/monitor capability nodes
    are granted (the request asked: NVIDIA_MIG_CONFIG_DEVICES /
    NVIDIA_MIG_MONITOR_DEVICES=all, as with the reference stack)."""
    __slots__ = ("gpus", "migs", "caps", "none", "visible", "source",
                 "mig_config", "mig_monitor")

    def __init__(self, gpus, migs, caps, none, visible, source,
                 mig_config=False, mig_monitor=False):
        self.gpus, self.migs, self.caps = gpus, migs, caps
        self.none, self.visible, self.source = none, visible, source
        self.mig_config, self.mig_monitor = mig_config, mig_monitor

    def node_gpus(self):
        """GPUs whose /dev/nvidia<minor> the sandbox needs: the selected ones
        and the parents of selected MIG devices, in index order."""
        seen = {g.index: g for g in self.gpus}
        for m in self.migs:
            seen.setdefault(m.gpu.index, m.gpu)
        return [seen[i] for i in sorted(seen)]

    def device_count(self):
        return len(self.gpus) + len(self.migs)

    def __repr__(self):
        return f"Selection({self.visible!r} caps={','.join(self.caps)})"


def _auto(environ, host):
    try:
        from gpusandbox import slurm
    except ModuleNotFoundError as e:
        if e.name != "gpusandbox.slurm":
            raise
        slurm = None
    if slurm is not None:
        return slurm.resolve_auto(environ, host) or "none", "slurm"
    for var in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        val = (environ.get(var) or "").strip()
        if val.lower() not in ("", "void"):
            return val, var
    return "none", "--gpus auto"


def resolve(gpus_opt, caps_opt, environ, host):
    """A caller's door in one call: the Selection for --gpus / --gpu-caps and
    the caller's environment (request.from_caller), or None when the launch
    has no GPU support."""
    return for_request(from_caller(gpus_opt, caps_opt, (), environ), host, environ)


def for_request(req, host, environ=None):
    """The Selection of a GpuRequest on this host, or None when it asks for
    no GPU support.  `environ` (the caller's) is read only to resolve
    `--gpus auto` (a Slurm step's allocation)."""
    if req.devices is None:
        return None
    value, source = req.devices, req.source.get("devices", "NVIDIA_VISIBLE_DEVICES")
    err = UsageError if source == "--gpus" else GpuError
    if source in ("--gpus", SLURM) and value.lower() == "auto":
        value, source = _auto(environ or {}, host)
        err = GpuError
    sel = _select(value, source, err, req.caps, host)
    sel.mig_config, sel.mig_monitor = req.mig_config, req.mig_monitor
    return sel


def _select(value, source, err, caps, host):
    items = [i.strip() for i in value.split(",") if i.strip()]
    low = [i.lower() for i in items]
    if "none" in low or not items:
        return Selection([], [], caps, True, "none", source)
    if "all" in low:
        return Selection(list(host.gpus), list(host.migs), caps, False, "all", source)
    if source == "--gpus" and low[0].startswith("count="):
        return _count(value, int(low[0][6:]), caps, host)
    gpus, migs = [], []
    mig_by_uuid = None
    for item in items:
        found = _match(item, host)
        if found is None and item.upper().startswith("MIG-"):
            if mig_by_uuid is None:
                mig_by_uuid = _nvml_migs(host, err, source)
            m = mig_by_uuid.get(item.lower())
            found = [m] if m is not None else None
        if found is None:
            hint = "this host has: " + describe(host)
            if source == "--gpus" and len(items) == 1 and isdigits(item) and len(item) <= 4:
                n = int(item)
                hint += f"; for {n} GPU{'s' if n > 1 else ''} (docker's meaning) use " \
                        f"--gpus count={n}"
            raise err(f"{source} {value!r}", f"unknown device {item!r}", hint=hint)
        for dev in found:
            target = migs if hasattr(dev, "ci") else gpus
            if dev not in target:
                target.append(dev)
            elif source == "--gpus":
                # The caller's own list: a device named twice (an index and
                # its UUID, a MIG instance and its GI) is a mistake to say,
                # not one to hide.
                raise UsageError(f"invalid --gpus {value!r}",
                                 f"{item!r} names {_name(dev)} again",
                                 hint="name each GPU once; this host has: " + describe(host))
    gpus.sort(key=lambda g: g.index)
    return Selection(gpus, migs, caps, False, _visible(gpus, migs), source)


def _count(value, n, caps, host):
    """docker's count=N: the first N GPUs by index."""
    if n > len(host.gpus):
        raise UsageError(f"--gpus {value}", f"this host has {len(host.gpus)} GPU"
                         f"{'' if len(host.gpus) == 1 else 's'}",
                         hint="this host has: " + (describe(host) or "no GPU"))
    gpus = sorted(host.gpus, key=lambda g: g.index)[:n]
    return Selection(gpus, [], caps, False, _visible(gpus, []), "--gpus")


def _name(dev):
    if hasattr(dev, "ci"):
        return f"MIG device {dev.gpu.index}:{dev.gi}:{dev.ci}"
    return f"GPU {dev.index}"


def _bus(s):
    s = s.lower()
    parts = s.split(":")
    if len(parts) == 2:
        s = "0000:" + s
    elif len(parts) == 3 and len(parts[0]) > 4:
        s = parts[0][-4:] + ":" + parts[1] + ":" + parts[2]   # nvidia-smi prints 8 domain digits
    return s


def _match(item, host):
    """Devices an item names (list), or None when it names nothing here."""
    low = item.lower()
    if isdigits(item) and len(item) < 10:
        i = int(item)
        return [host.gpus[i]] if i < len(host.gpus) else None
    if low.startswith("gpu-"):
        return [g for g in host.gpus if g.uuid and g.uuid.lower() == low] or None
    if low.startswith("mig-gpu-"):
        uuid, _, rest = low[4:].partition("/")
        gi, _, ci = rest.partition("/")
        return [m for m in host.migs if m.gpu.uuid and m.gpu.uuid.lower() == uuid
                and str(m.gi) == gi and str(m.ci) == ci] or None
    parts = low.split(":")
    if 2 <= len(parts) <= 3 and all(isdigits(p) and len(p) < 10 for p in parts):
        g, gi = int(parts[0]), int(parts[1])
        ci = int(parts[2]) if len(parts) == 3 else None
        return [m for m in host.migs if m.gpu.index == g and m.gi == gi
                and (ci is None or m.ci == ci)] or None
    if ":" in low and "." in low:
        bus = _bus(low)
        return [g for g in host.gpus if g.bus_id == bus] or None
    return None


def _nvml_migs(host, err, source):
    from gpusandbox.gpu import ceiling
    try:
        table = ceiling.mig_uuids(host)
    except GpuError as e:
        raise err(f"{source}: MIG-<uuid> needs NVML", e.why or e.what, hint=e.hint) from None
    out = {}
    for m in host.migs:
        uuid = table.get((m.gpu.minor, m.gi, m.ci))
        if uuid:
            m.uuid = uuid
            out[uuid.lower()] = m
    return out


def _visible(gpus, migs):
    """Names for NVIDIA_VISIBLE_DEVICES inside: UUIDs where known, so the value
    stays meaningful without the host's numbering."""
    names = [g.uuid or str(g.index) for g in gpus]
    for m in migs:
        if m.uuid:
            names.append(m.uuid)
        elif m.gpu.uuid:
            names.append(f"MIG-{m.gpu.uuid}/{m.gi}/{m.ci}")
        else:
            names.append(f"{m.gpu.index}:{m.gi}:{m.ci}")
    return ",".join(names)


def describe(host):
    """One line listing the selectable devices, for error hints."""
    parts = [f"{g.index} ({g.uuid or 'uuid hidden'}, {g.bus_id})" for g in host.gpus]
    parts += [f"{m.gpu.index}:{m.gi}:{m.ci}" for m in host.migs]
    return "; ".join(parts)
