"""Which fabric devices a launch gets: the request (the --fabric option and
the caller's variables, never the image's) and the per-task HCA choice by
PCI topology.

Precedence for the HCAs: --fabric, else MELLANOX_VISIBLE_DEVICES (enroot's
99-mellanox.sh: all | none | void | indices in name order), else
NVIDIA_MOFED=enabled (the toolkit's: every HCA), else `auto` when the launch
has GPUs, else none.  GPUDirect and NVSwitch nodes follow the toolkit's
NVIDIA_GDRCOPY / NVIDIA_GDS / NVIDIA_NVSWITCH (exactly `enabled`), IMEX
channels NVIDIA_IMEX_CHANNELS (numbers, or `all` for every channel node the
host has).

`auto` is NCCL's rule (graph/topo.cc, WAVE3-FACTS.md section 3): for each of
the task's GPUs, the HCAs with an ACTIVE port at the smallest PCI distance:
under the same PCIe switch, else the same host bridge (root complex), else
the same NUMA node, else every HCA.  The task gets the union, in name order.

HPE Slingshot NICs (CXI) are chosen by the same rule, apart from the HCAs:
--fabric's mode or names apply to both kinds; MELLANOX_VISIBLE_DEVICES and
NVIDIA_MOFED speak of Mellanox HCAs only, so with them the CXI NICs follow
the default (`auto` with GPUs, else none).
"""
from gpusandbox.errors import UsageError

from .discover import gpu_numa, gpu_pci_path

MODES = ("auto", "all", "none")
LEVELS = ("the same PCIe switch", "the same host bridge", "the same NUMA node", "no closer path")
IMEX_MAX = (1 << 20) - 1


class FabricRequest:
    """hcas: "auto" | "all" | "none" | [names or indices]; source: where that
    came from (for messages); gdrcopy, gds, nvswitch: bools; imex: None, "all"
    or [channel numbers]."""
    __slots__ = ("hcas", "cxi", "source", "gdrcopy", "gds", "nvswitch", "imex")

    def __bool__(self):
        return self.hcas != "none" or self.cxi != "none" or self.gdrcopy or self.gds or \
            self.nvswitch or bool(self.imex)


def _list(value):
    return [v.strip() for v in value.split(",") if v.strip()]


def from_caller(option, caller_env, have_gpus):
    """The request from --fabric (option, or None) and the caller's
    variables (its environment and its -e/--env-file rows; the image's rows
    are never passed here, so they cannot widen what the caller allowed)."""
    req = FabricRequest()
    mellanox = caller_env.get("MELLANOX_VISIBLE_DEVICES")
    if option is not None:
        value, req.source = option, "--fabric"
    elif mellanox is not None:
        value, req.source = mellanox, "MELLANOX_VISIBLE_DEVICES"
        if value in ("", "void"):
            value = "none"
    elif caller_env.get("NVIDIA_MOFED") == "enabled":
        value, req.source = "all", "NVIDIA_MOFED=enabled"
    else:
        value, req.source = ("auto" if have_gpus else "none"), "default"
    if value in MODES:
        req.hcas = value
    else:
        req.hcas = _list(value)
        if not req.hcas:
            raise UsageError(f"invalid {req.source} {value!r}",
                             "expected auto, all, none or HCA names (mlx5_0,mlx5_3)",
                             "example: --fabric mlx5_0")
    req.cxi = req.hcas if req.source in ("--fabric", "default") else \
        ("auto" if have_gpus else "none")
    req.gdrcopy = caller_env.get("NVIDIA_GDRCOPY") == "enabled"
    req.gds = caller_env.get("NVIDIA_GDS") == "enabled"
    req.nvswitch = caller_env.get("NVIDIA_NVSWITCH") == "enabled"
    req.imex = _imex(caller_env.get("NVIDIA_IMEX_CHANNELS"))
    return req


def _imex(value):
    if value is None or value.strip() in ("", "none", "void"):
        return None
    if value.strip() == "all":
        return "all"
    out = []
    for item in _list(value):
        if not item.isdigit() or int(item) > IMEX_MAX:
            raise UsageError(f"invalid NVIDIA_IMEX_CHANNELS item {item!r}",
                             f"expected channel numbers 0 to {IMEX_MAX}, or all",
                             "example: NVIDIA_IMEX_CHANNELS=0")
        out.append(int(item))
    return sorted(set(out))


def _parts(path):
    return path.split("/devices/", 1)[-1].split("/")[:-1] if path else None


def distance(gpu_path, gnuma, hca):
    """Index into LEVELS of the PCI distance between a GPU and an HCA."""
    g, h = _parts(gpu_path), _parts(hca.pci_path)
    if g and h and g[0] == h[0]:
        common = 0
        for a, b in zip(g, h):
            if a != b:
                break
            common += 1
        # A bridge below the root complex in common: both sit under one
        # switch (NCCL's PIX/PXB); the root complex alone: PHB.
        return 0 if common >= 2 else 1
    if gnuma >= 0 and gnuma == hca.numa:
        return 2
    return 3


def _usable(nic):
    if hasattr(nic, "usable"):
        return nic.usable()
    return nic.uverbs is not None and bool(nic.active_ports())


def nearest(host, gpus, nics=None, kind="HCA"):
    """[(nic, why)] for the task's GPUs (gpu.discover.Gpu list) by `auto`,
    among `nics` (default: the host's HCAs)."""
    usable = [h for h in (host.hcas if nics is None else nics) if _usable(h)]
    if not usable:
        return []
    if not gpus:
        return [(h, f"no GPU to be near: every {kind}") for h in usable]
    chosen = {}
    for g in gpus:
        path = gpu_pci_path(host.sys_root, g.bus_id)
        numa = gpu_numa(path)
        dist = {h.name: distance(path, numa, h) for h in usable}
        best = min(dist.values())
        for h in usable:
            if dist[h.name] == best and h.name not in chosen:
                chosen[h.name] = f"{LEVELS[best]} as GPU {g.index} ({g.bus_id})" if best < 3 \
                    else f"no {kind} near GPU {g.index}: every {kind}"
    return [(h, chosen[h.name]) for h in usable if h.name in chosen]


def choose_hcas(req, host, gpus):
    """[(hca, why)] the request names on this host; raises UsageError for a
    name or index the host lacks."""
    if req.hcas == "none":
        return []
    if req.hcas == "auto":
        return nearest(host, gpus)
    if req.hcas == "all":
        return [(h, f"{req.source}: all") for h in host.hcas if h.uverbs is not None]
    names = host.by_name()
    cxis = {c.name for c in host.cxis}
    out = []
    for item in req.hcas:
        if req.source == "MELLANOX_VISIBLE_DEVICES" and item.isdigit():
            h = host.hcas[int(item)] if int(item) < len(host.hcas) else None
        elif item in cxis:
            continue            # a Slingshot NIC: choose_cxis
        else:
            h = names.get(item)
        if h is None:
            have = ", ".join(list(names) + sorted(cxis, key=lambda n: int(n[3:]))) or "none"
            raise UsageError(f"{req.source}: unknown HCA {item!r}", f"this host has {have}",
                             "name one of them, or pass --fabric auto|all|none")
        if h.uverbs is None:
            raise UsageError(f"{req.source}: HCA {h.name}", "it has no /dev/infiniband uverbs "
                             "node on this host", "load ib_uverbs (modprobe ib_uverbs)")
        if all(h is not o for o, _ in out):
            out.append((h, f"{req.source}"))
    return out


def choose_cxis(req, host, gpus):
    """[(cxi, why)]: the Slingshot NICs the request gives (names the host
    lacks are refused by choose_hcas, which sees every name first)."""
    if req.cxi == "none" or not host.cxis:
        return []
    if req.cxi == "auto":
        return nearest(host, gpus, host.cxis, "CXI NIC")
    if req.cxi == "all":
        return [(c, f"{req.source}: all") for c in host.cxis if c.node is not None]
    out = []
    for c in host.cxis:
        if c.name in req.cxi:
            if c.node is None:
                raise UsageError(f"{req.source}: CXI NIC {c.name}", f"it has no /dev/{c.name} "
                                 "node on this host", "load cxi_user (modprobe cxi-user)")
            out.append((c, req.source))
    return out
