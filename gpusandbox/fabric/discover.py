"""Fabric discovery: the host's RDMA adapters (HCAs) and NVIDIA fabric nodes,
read from files through the same roots as GPU discovery.

    host = discover(driver_root="/", dev_root=None)        # FabricHost, never raises

Roots: /proc and /sys come from the driver root when it holds a snapshot of
them (a simulated host, gpu.discover.proc_root), else the host's own; nodes
from the dev root (default <driver root>/dev).  Nothing here opens a node:
each is stat()ed and kept only when it is a character device with the
numbers the kernel's files name (WAVE3-FACTS.md section 3).

FabricHost: sys_root, dev_root, proc_root; hcas [Hca] in name order; cxis
    [Cxi] (HPE Slingshot NICs) in number order;
    rdma_cm (Node or None); gdrdrv (Node or None); nvfs [Node]; nvswitch [Node]
    (nvidia-nvswitchctl first); imex {channel number: Node}; peermem (bool:
    nvidia-peermem loaded, GPUDirect RDMA possible); problems [str].
Hca: name, bus_id, pci_path (realpath of class/infiniband/<name>/device, the
    path NCCL reads), numa (-1 unknown), ports [(number, state, link_layer)],
    uverbs (Node or None), umad [Node], index (position in name order).
Cxi: name (cxiN), bus_id, pci_path, numa, node (/dev/cxiN: Node or None),
    link_up (properties/link; None when unknown), index.
Node: path (in the sandbox), host_path, major, minor.
"""
import os
import stat

from . import NIC_CLASSES

IB_CLASS, CXI_CLASS = NIC_CLASSES


class Node:
    __slots__ = ("path", "host_path", "major", "minor")

    def __init__(self, path, host_path, major, minor):
        self.path, self.host_path, self.major, self.minor = path, host_path, major, minor

    def __repr__(self):
        return f"Node({self.path} {self.major}:{self.minor})"


class Hca:
    __slots__ = ("name", "bus_id", "pci_path", "numa", "ports", "uverbs", "umad", "index")

    def active_ports(self):
        return [p for p, state, _ in self.ports if state.endswith("ACTIVE")]

    def link(self):
        """"InfiniBand", "Ethernet" (RoCE) or "" when no port says."""
        return next((ll for _, _, ll in self.ports if ll), "")

    def __repr__(self):
        return f"Hca({self.name} {self.bus_id} numa={self.numa})"


class Cxi:
    """An HPE Slingshot NIC (cxi-driver): /sys/class/cxi_user/cxiN names its
    node's numbers and leads to its PCI device, as libcxi reads it
    (cxil_get_device_list opens /dev/cxiN for each cxi_user entry)."""
    __slots__ = ("name", "bus_id", "pci_path", "numa", "node", "link_up", "index")

    def usable(self):
        return self.node is not None and self.link_up is not False

    def link(self):
        return "Slingshot"

    def __repr__(self):
        return f"Cxi({self.name} {self.bus_id} numa={self.numa})"


class FabricHost:
    __slots__ = ("sys_root", "dev_root", "proc_root", "hcas", "cxis", "rdma_cm", "gdrdrv",
                 "nvfs", "nvswitch", "imex", "peermem", "problems", "majors")

    def __init__(self):
        self.hcas, self.cxis = [], []

    def sys(self, p):
        return self.sys_root.rstrip("/") + "/" + p.lstrip("/")

    def by_name(self):
        return {h.name: h for h in self.hcas}

    def nics(self):
        """Every network adapter a task may be given: HCAs, then CXI NICs."""
        return list(self.hcas) + list(self.cxis)

    def __bool__(self):
        return bool(self.hcas or self.cxis or self.gdrdrv or self.nvfs or self.nvswitch
                    or self.imex)


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _devnum(text):
    major, sep, minor = (text or "").partition(":")
    if sep and major.isdigit() and minor.isdigit():
        return int(major), int(minor)
    return None


def roots(driver_root="/", dev_root=None):
    """(proc root, sys root, dev root) for a driver root."""
    from gpusandbox.gpu.discover import proc_root
    root = os.path.abspath(driver_root or "/")
    proc = proc_root(root)
    sysr = "/sys" if proc == "/" else os.path.join(proc, "sys")
    dev = os.path.abspath(dev_root) if dev_root else os.path.join(root, "dev")
    return proc, sysr, dev


def majors(proc_root):
    """Character device majors by name from /proc/devices (names may repeat:
    231 is both infiniband_verbs and infiniband_mad)."""
    out = {}
    text = _read_all(os.path.join(proc_root, "proc/devices")) or ""
    for line in text.split("Block devices:", 1)[0].splitlines():
        num, _, name = line.strip().partition(" ")
        if num.isdigit():
            out.setdefault(name, int(num))
    return out


def _read_all(path):
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        return None


def _node(host, rel, major, minor):
    """The node dev_root/rel when it is a character device major:minor, else
    None (a mismatch is recorded in host.problems)."""
    host_path = os.path.join(host.dev_root, rel)
    try:
        st = os.stat(host_path)
    except OSError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        host.problems.append(f"{host_path} is not a character device")
        return None
    got = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if major is not None and got != (major, minor):
        host.problems.append(f"{host_path} is {got[0]}:{got[1]}, expected {major}:{minor}")
        return None
    return Node("/dev/" + rel, host_path, got[0], got[1])


def _hcas(host):
    verbs = {}
    for name in _listdir(host.sys("class/infiniband_verbs")):
        d = host.sys(f"class/infiniband_verbs/{name}")
        ibdev, num = _read(f"{d}/ibdev"), _devnum(_read(f"{d}/dev"))
        if ibdev and num and name.startswith("uverbs"):
            verbs[ibdev] = (name, num)
    mads = {}
    for name in _listdir(host.sys("class/infiniband_mad")):
        d = host.sys(f"class/infiniband_mad/{name}")
        ibdev, num = _read(f"{d}/ibdev"), _devnum(_read(f"{d}/dev"))
        if ibdev and num and name.startswith("umad"):
            mads.setdefault(ibdev, []).append((name, num))
    out = []
    for name in _listdir(host.sys(IB_CLASS)):
        cdir = host.sys(f"class/infiniband/{name}")
        h = Hca()
        h.name, h.index = name, len(out)
        _pci(host, h, cdir)
        h.ports = []
        for p in _listdir(f"{cdir}/ports"):
            if p.isdigit():
                h.ports.append((int(p), _read(f"{cdir}/ports/{p}/state") or "",
                                _read(f"{cdir}/ports/{p}/link_layer") or ""))
        h.ports.sort()
        h.uverbs = None
        if name in verbs:
            node, (major, minor) = verbs[name]
            h.uverbs = _node(host, f"infiniband/{node}", major, minor)
        h.umad = [n for n in (_node(host, f"infiniband/{node}", major, minor)
                              for node, (major, minor) in mads.get(name, ())) if n]
        if h.uverbs is None:
            # libibverbs skips a device whose uverbs node is absent
            # (try_access_device): useless to a sandbox too.
            host.problems.append(f"{name}: no /dev/infiniband uverbs node")
        out.append(h)
    return out


def _pci(host, nic, cdir):
    nic.pci_path = os.path.realpath(f"{cdir}/device")
    nic.bus_id = os.path.basename(nic.pci_path)
    numa = _read(f"{nic.pci_path}/numa_node")
    nic.numa = int(numa) if numa and numa.lstrip("-").isdigit() else -1


def _cxis(host):
    """Slingshot NICs from /sys/class/cxi_user (the class whose devices are
    the /dev/cxiN nodes, on the `ucxi` major of /proc/devices)."""
    out = []
    names = [n for n in _listdir(host.sys(CXI_CLASS))
             if n.startswith("cxi") and n[3:].isdigit()]
    for name in sorted(names, key=lambda n: int(n[3:])):
        cdir = host.sys(f"class/cxi_user/{name}")
        c = Cxi()
        c.name, c.index = name, len(out)
        _pci(host, c, cdir)
        link = _read(f"{c.pci_path}/properties/link")
        c.link_up = None if link is None else link == "1"
        num = _devnum(_read(f"{cdir}/dev"))
        major = host.majors.get("ucxi")
        c.node = None
        if num is None or major is None or num[0] != major:
            host.problems.append(f"{name}: /sys/class/cxi_user/{name}/dev does not name a "
                                 "device of the ucxi major (cxi_user not loaded?)")
        else:
            c.node = _node(host, name, *num)
            if c.node is None:
                host.problems.append(f"{name}: no /dev/{name} node")
        out.append(c)
    return out


def discover(driver_root="/", dev_root=None):
    host = FabricHost()
    host.proc_root, host.sys_root, host.dev_root = roots(driver_root, dev_root)
    host.problems = []
    host.majors = m = majors(host.proc_root)
    host.hcas = _hcas(host)
    host.cxis = _cxis(host)
    cm = _devnum(_read(host.sys("class/misc/rdma_cm/dev")))
    host.rdma_cm = _node(host, "infiniband/rdma_cm", *(cm or (None, None)))
    host.gdrdrv = _node(host, "gdrdrv", m["gdrdrv"], 0) if "gdrdrv" in m else None
    host.nvfs = []
    if "nvidia-fs" in m:
        for name in _listdir(host.dev_root):
            if name.startswith("nvidia-fs") and name[9:].isdigit():
                n = _node(host, name, m["nvidia-fs"], int(name[9:]))
                if n:
                    host.nvfs.append(n)
        host.nvfs.sort(key=lambda n: n.minor)
    host.nvswitch = []
    if "nvidia-nvswitch" in m:
        ctl = _node(host, "nvidia-nvswitchctl", m["nvidia-nvswitch"], 255)
        sw = [n for n in (_node(host, name, m["nvidia-nvswitch"], int(name[15:]))
                          for name in _listdir(host.dev_root)
                          if name.startswith("nvidia-nvswitch") and name[15:].isdigit()) if n]
        host.nvswitch = ([ctl] if ctl else []) + sorted(sw, key=lambda n: n.minor)
    host.imex = {}
    if "nvidia-caps-imex-channels" in m:
        major = m["nvidia-caps-imex-channels"]
        for name in _listdir(os.path.join(host.dev_root, "nvidia-caps-imex-channels")):
            if name.startswith("channel") and name[7:].isdigit():
                n = _node(host, f"nvidia-caps-imex-channels/{name}", major, int(name[7:]))
                if n:
                    host.imex[int(name[7:])] = n
    host.peermem = os.path.isdir(host.sys("module/nvidia_peermem")) or \
        os.path.isdir(host.sys("module/nv_peer_mem"))
    return host


def gpu_pci_path(sys_root, bus_id):
    """realpath of a GPU's PCI device in sysfs, or None when sysfs lacks it."""
    path = os.path.join(sys_root, "bus/pci/devices", bus_id.lower())
    return os.path.realpath(path) if os.path.exists(path) else None


def gpu_numa(pci_path):
    if not pci_path:
        return -1
    v = _read(os.path.join(pci_path, "numa_node"))
    return int(v) if v and v.lstrip("-").isdigit() else -1
