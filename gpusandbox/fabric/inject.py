"""Fabric injection as data: a FabricRequest on a FabricHost -> ContainerEdits,
the device filter's rules and the variables NCCL and UCX read.

Each chosen HCA gets its /dev/infiniband/uverbsN node (what libibverbs opens;
it lists a device only when that node exists), plus /dev/infiniband/rdma_cm
(librdmacm, UCX's rdmacm and NCCL's connection setup).  umad and issm nodes
are never given: they reach the subnet's management, which the reference
stack keeps from containers too.  Every node is given by number and the
filter allows exactly these numbers, so an HCA bound in by another path
stays unusable (EPERM).  The sandbox's /sys lists the chosen HCAs only
(sysview.py).

HPE Slingshot NICs (CXI) the same way: /dev/cxiN for each chosen one (what
libcxi opens), FI_PROVIDER=cxi and FI_CXI_DEVICE_NAME (libfabric's cxi
provider restricted to them) unless the caller set them.
"""
from gpusandbox.edits import ContainerEdits, DeviceNode
from gpusandbox.errors import UsageError

from . import sysview
from .select import choose_cxis, choose_hcas


class Result:
    """edits (ContainerEdits), rules [(type, major, minor, access)],
    hcas [(Hca, why)], cxis [(Cxi, why)], warnings [str], notes [str]."""
    __slots__ = ("edits", "rules", "hcas", "cxis", "warnings", "notes")

    def __init__(self):
        self.edits = ContainerEdits()
        self.rules = []
        self.hcas = []
        self.cxis = []
        self.warnings = []
        self.notes = []

    def add(self, node):
        if any(n.path == node.path for n in self.edits.device_nodes):
            return
        self.edits.device_nodes.append(DeviceNode(node.path, node.host_path, node.major,
                                                  node.minor, "rw"))
        self.rules.append(("c", node.major, node.minor, "rw"))


def hca_ports(hcas):
    """NAME:PORT for every ACTIVE port of the chosen HCAs (the first port
    when none is active, so the names still say which HCA)."""
    out = []
    for h, _ in hcas:
        ports = h.active_ports() or [p for p, _, _ in h.ports[:1]]
        out += [f"{h.name}:{p}" for p in ports]
    return out


def build(req, host, gpus, caller_env):
    """Result for the request; raises UsageError when it names what the host
    lacks (an HCA, an IMEX channel)."""
    res = Result()
    res.hcas = choose_hcas(req, host, gpus)
    res.cxis = choose_cxis(req, host, gpus)
    if req.hcas not in ("auto", "none") and not host.hcas and not host.cxis:
        res.warnings.append(f"warning: {req.source} asks for RDMA adapters, but this host has "
                            "none (/sys/class/infiniband is empty): NCCL and MPI will use TCP")
    for h, _ in res.hcas:
        res.add(h.uverbs)
    for c, _ in res.cxis:
        res.add(c.node)
    if res.cxis:
        names = ",".join(c.name for c, _ in res.cxis)
        for var, value in (("FI_PROVIDER", "cxi"), ("FI_CXI_DEVICE_NAME", names)):
            if var not in caller_env:
                res.edits.env[var] = value
        res.notes += [f"fabric: {c.name} ({c.bus_id}, Slingshot CXI): {why}"
                      for c, why in res.cxis]
    hide, notes = sysview.view(host, [h for h, _ in res.hcas] + [c for c, _ in res.cxis])
    res.edits.extend(hide)
    res.notes += notes
    if res.hcas:
        if host.rdma_cm is not None:
            res.add(host.rdma_cm)
        else:
            res.notes.append("fabric: no /dev/infiniband/rdma_cm on this host (modprobe "
                             "rdma_ucm): RDMA connection manager unavailable")
        ports = hca_ports(res.hcas)
        # The caller's own word wins (its environment passes NCCL_* and UCX_*
        # into the sandbox; -e rows override these later anyway).
        if "NCCL_IB_HCA" not in caller_env:
            res.edits.env["NCCL_IB_HCA"] = "=" + ",".join(ports)
        if "UCX_NET_DEVICES" not in caller_env:
            res.edits.env["UCX_NET_DEVICES"] = ",".join(ports)
        res.notes += [f"fabric: {h.name} ({h.bus_id}, {h.link() or 'link unknown'}): {why}"
                      for h, why in res.hcas]
    for flag, var, nodes in ((req.gdrcopy, "NVIDIA_GDRCOPY", [host.gdrdrv] if host.gdrdrv else []),
                             (req.gds, "NVIDIA_GDS", host.nvfs),
                             (req.nvswitch, "NVIDIA_NVSWITCH", host.nvswitch)):
        if not flag:
            continue
        if not nodes:
            res.warnings.append(f"warning: {var}=enabled but this host has no such device "
                                "node: nothing injected for it")
        for n in nodes:
            res.add(n)
    if req.imex == "all":
        for num in sorted(host.imex):
            res.add(host.imex[num])
        if not host.imex:
            res.warnings.append("warning: NVIDIA_IMEX_CHANNELS=all but this host has no IMEX "
                                "channel node: fabric-handle CUDA calls will be refused")
    elif req.imex:
        for num in req.imex:
            if num not in host.imex:
                raise UsageError(f"NVIDIA_IMEX_CHANNELS: channel {num}",
                                 f"{host.dev_root}/nvidia-caps-imex-channels/channel{num} "
                                 "does not exist on this host",
                                 "ask the administrator to create it (nvidia-modprobe, or mknod "
                                 "with the major of nvidia-caps-imex-channels in /proc/devices)")
            res.add(host.imex[num])
    return res
