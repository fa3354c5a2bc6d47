"""The network half of the simulated host: PCI topology in DIR/sys, RDMA
adapters (HCAs) with their sysfs class trees and /dev/infiniband nodes, and
the GPUDirect, NVSwitch and IMEX nodes (WAVE3-FACTS.md section 3); and HPE
Slingshot NICs (CXI, cxi-driver's cxi_core/cxi_user: /sys/class/cxi and
/sys/class/cxi_user/cxiN, /dev/cxiN on the dynamic `ucxi` major, the
PCI device's properties/ that libcxi reads).

The layout is the kernel's (Documentation/ABI/stable/sysfs-class-infiniband,
sysfs-bus-pci): every PCI device is a directory under
sys/devices/pci<domain>:<bus>/<root port>/<switch upstream>/<downstream>/<bdf>,
sys/bus/pci/devices/<bdf> links to it, and sys/class/infiniband/<hca> links to
<hca bdf>/infiniband/<hca> (whose `device` link leads back to the PCI device,
the path NCCL reads with realpath).  GPU k and HCA k sit under the same PCIe
switch; the pairs are spread over the NUMA nodes in order, one root complex
per node, as on an 8-GPU/8-HCA server.  The nodes carry the kernel's real
numbers (uverbs 231:192+N, umad 231:N, issm 231:64+N, rdma_cm misc 10), so
opening one fails with ENXIO (no driver behind it) unless a cgroup device
filter says EPERM first: the property the tests check."""
import os

from gpusandbox.errors import UsageError

from .layout import symlink, write

IB_MAJOR = 231          # drivers/infiniband/core/{uverbs_main,user_mad}.c
UVERBS_BASE, ISSM_BASE = 192, 64
MISC_MAJOR = 10
RDMA_CM_MINOR = 122     # misc, dynamic: read from sys/class/misc/rdma_cm/dev
# Dynamic majors, handed out from 511 down after the driver's (layout.py).
GDRDRV_MAJOR = 507
NVFS_MAJOR = 506
NVSWITCH_MAJOR = 505
IMEX_MAJOR = 504
UCXI_MAJOR = 503        # cxi_user's alloc_chrdev_region(..., "ucxi")
NVFS_NODES = 16         # /dev/nvidia-fs0..15
NVSWITCH_CTL_MINOR = 255
MELLANOX = "0x15b3"
HPE, CASSINI_2 = "0x1590", "0x0371"     # cxi-driver cass_core.h
LINKS = ("ib", "roce")


def gpu_bdf(i):
    return f"0000:{6 + i:02x}:00.0"


def hca_bdf(k):
    return f"0000:{0x40 + k:02x}:00.0"


def hca_name(k):
    return f"mlx5_{k}"


def cxi_bdf(k):
    return f"0000:{0x60 + k:02x}:00.0"


def _numa(k, n, nodes):
    return k * nodes // max(n, 1)


def _slot_path(k, n, nodes):
    """PCI path (below sys/devices) of the switch for pair k: root complex of
    its NUMA node, a root port, the switch's upstream port."""
    node = _numa(k, n, nodes)
    rc = f"{node * 0x80:02x}"
    return f"pci0000:{rc}/0000:{rc}:{1 + k:02x}.0/0000:{0xa0 + k:02x}:00.0"


def check(hcas, link, nvswitches, imex_channels, cxis=0):
    if not 0 <= hcas <= 32:
        raise UsageError(f"bad --hcas {hcas}", "expected 0 to 32 (the uverbs minors 192-223)")
    if not 0 <= cxis <= 16:
        raise UsageError(f"bad --cxis {cxis}", "expected 0 to 16")
    if link not in LINKS:
        raise UsageError(f"bad --link {link!r}", "expected ib or roce")
    if not 0 <= nvswitches <= 64:
        raise UsageError(f"bad --nvswitches {nvswitches}", "expected 0 to 64")
    if not 0 <= imex_channels <= 2048:
        raise UsageError(f"bad --imex-channels {imex_channels}",
                         "expected 0 to 2048 (NVreg_ImexChannelCount's default)")


def describe(gpus, hcas, link, gpudirect, nvswitches, imex_channels, cxis=0):
    """The fabric part of the sim's JSON description."""
    n = max(gpus, hcas, cxis)
    nodes = 2 if n >= 2 else 1
    return {
        "numa_nodes": nodes, "link": link, "gpudirect": gpudirect,
        "nvswitches": nvswitches, "imex_channels": imex_channels,
        "gpu_numa": [_numa(i, n, nodes) for i in range(gpus)],
        "hcas": [{"name": hca_name(k), "bus_id": hca_bdf(k), "numa": _numa(k, n, nodes),
                  "uverbs": k, "uverbs_dev": [IB_MAJOR, UVERBS_BASE + k],
                  "umad_dev": [IB_MAJOR, k], "gpu": k if k < gpus else None,
                  "link_layer": "InfiniBand" if link == "ib" else "Ethernet"}
                 for k in range(hcas)],
        "cxis": [{"name": f"cxi{k}", "bus_id": cxi_bdf(k), "numa": _numa(k, n, nodes),
                  "dev": [UCXI_MAJOR, k], "gpu": k if k < gpus else None}
                 for k in range(cxis)],
        "majors": {"infiniband_verbs": IB_MAJOR, "infiniband_mad": IB_MAJOR,
                   **({"ucxi": UCXI_MAJOR} if cxis else {}),
                   **({"gdrdrv": GDRDRV_MAJOR, "nvidia-fs": NVFS_MAJOR} if gpudirect else {}),
                   **({"nvidia-nvswitch": NVSWITCH_MAJOR} if nvswitches else {}),
                   **({"nvidia-caps-imex-channels": IMEX_MAJOR} if imex_channels else {})},
        "rdma_cm": [MISC_MAJOR, RDMA_CM_MINOR] if hcas else None,
    }


def char_devices(fab):
    """(major, name) rows the fabric adds to /proc/devices."""
    return [(major, name) for name, major in fab["majors"].items()
            if fab["hcas"] or not name.startswith("infiniband")]


def _pci_dev(sysd, path, bdf, cls, numa, vendor, device):
    d = f"{sysd}/devices/{path}/{bdf}"
    c = int(cls, 16)
    # The match string providers are chosen by (libibverbs reads device/modalias).
    alias = (f"pci:v{int(vendor, 16):08X}d{int(device, 16):08X}sv{int(vendor, 16):08X}"
             f"sd00000000bc{c >> 16:02X}sc{(c >> 8) & 0xff:02X}i{c & 0xff:02X}")
    for name, val in (("vendor", vendor), ("device", device), ("class", cls), ("modalias", alias),
                      ("numa_node", str(numa)), ("local_cpulist", ""),
                      ("current_link_width", "16"), ("current_link_speed", "32.0 GT/s PCIe")):
        write(f"{d}/{name}", val + "\n", 0o444)
    symlink(f"../../../devices/{path}/{bdf}", f"{sysd}/bus/pci/devices/{bdf}")
    return d


def write_sys(root, gpus, fab):
    """sys/: every GPU and HCA as a PCI device under its switch, and the
    InfiniBand class trees."""
    sysd = os.path.join(root, "sys")
    hcas = fab["hcas"]
    n = max(gpus, len(hcas), len(fab.get("cxis", ())))
    nodes = fab["numa_nodes"]
    for node in range(nodes):
        write(f"{sysd}/devices/system/node/node{node}/cpulist", f"{node * 8}-{node * 8 + 7}\n", 0o444)
    for i in range(gpus):
        sw = _slot_path(i, n, nodes)
        _pci_dev(sysd, f"{sw}/0000:{0xb0 + i:02x}:00.0", gpu_bdf(i), "0x030200",
                 _numa(i, n, nodes), "0x10de", "0x2330")
    _write_cxis(sysd, fab.get("cxis", ()), n, nodes)
    if not hcas:
        return
    write(f"{sysd}/class/infiniband_verbs/abi_version", "6\n", 0o444)
    write(f"{sysd}/class/infiniband_mad/abi_version", "5\n", 0o444)
    eth = fab["link"] == "roce"
    for h in hcas:
        k = h["uverbs"]
        sw = _slot_path(k, n, nodes)
        pci = _pci_dev(sysd, f"{sw}/0000:{0xb0 + k:02x}:01.0", h["bus_id"],
                       "0x020000" if eth else "0x020700", h["numa"], MELLANOX, "0x101b")
        ib = f"{pci}/infiniband/{h['name']}"
        guid = f"b8ce:f603:00{k:02x}:{k:04x}"
        for name, val in (("node_type", "1: CA"), ("node_guid", guid), ("sys_image_guid", guid),
                          ("fw_ver", "20.39.1002"), ("board_id", "MT_0000000223"),
                          ("hca_type", "MT4123"), ("node_desc", f"simhost {h['name']}")):
            write(f"{ib}/{name}", val + "\n", 0o444)
        port = f"{ib}/ports/1"
        for name, val in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"),
                          ("link_layer", h["link_layer"]),
                          ("rate", "200 Gb/sec (4X HDR)"),
                          ("lid", "0x0" if eth else f"0x{k + 1:x}"), ("sm_lid", "0x0" if eth else "0x1"),
                          ("gids/0", "fe80:0000:0000:0000:" + guid)):
            write(f"{port}/{name}", val + "\n", 0o444)
        symlink("../..", f"{ib}/device")
        symlink(f"../../devices/{sw}/0000:{0xb0 + k:02x}:01.0/{h['bus_id']}/infiniband/{h['name']}",
                f"{sysd}/class/infiniband/{h['name']}")
        for cls, node, dev, extra in (
                ("infiniband_verbs", f"uverbs{k}", f"{IB_MAJOR}:{UVERBS_BASE + k}", {"abi_version": "1"}),
                ("infiniband_mad", f"umad{k}", f"{IB_MAJOR}:{k}", {"port": "1"}),
                ("infiniband_mad", f"issm{k}", f"{IB_MAJOR}:{ISSM_BASE + k}", {"port": "1"})):
            d = f"{pci}/{cls}/{node}"
            write(f"{d}/ibdev", h["name"] + "\n", 0o444)
            write(f"{d}/dev", dev + "\n", 0o444)
            for name, val in extra.items():
                write(f"{d}/{name}", val + "\n", 0o444)
            symlink(f"../../devices/{sw}/0000:{0xb0 + k:02x}:01.0/{h['bus_id']}/{cls}/{node}",
                    f"{sysd}/class/{cls}/{node}")
    write(f"{sysd}/devices/virtual/misc/rdma_cm/dev", f"{MISC_MAJOR}:{RDMA_CM_MINOR}\n", 0o444)
    symlink("../../devices/virtual/misc/rdma_cm", f"{sysd}/class/misc/rdma_cm")
    if fab["gpudirect"]:
        # nvidia-peermem registers no node: its module directory is what shows it loaded.
        write(f"{sysd}/module/nvidia_peermem/initstate", "live\n", 0o444)


def _write_cxis(sysd, cxis, n, nodes):
    """Slingshot NICs: the PCI device (with the properties/ libcxi reads),
    its cxi (core) and cxi_user (the node's) class devices, the hsn netdev."""
    for c in cxis:
        k = c["dev"][1]
        sw = _slot_path(k, n, nodes)
        parent = f"{sw}/0000:{0xb0 + k:02x}:02.0"
        pci = _pci_dev(sysd, parent, c["bus_id"], "0x020000", c["numa"], HPE, CASSINI_2)
        for name, val in (("nid", f"0x{k + 1:x}"), ("link", "1"), ("cassini_version", "2.0"),
                          ("speed", "200000"), ("hpc_mtu", "2048")):
            write(f"{pci}/properties/{name}", val + "\n", 0o444)
        write(f"{pci}/net/hsn{k}/address", f"02:00:00:00:00:{k + 1:02x}\n", 0o444)
        for cls in ("cxi", "cxi_user"):
            d = f"{pci}/{cls}/{c['name']}"
            if cls == "cxi_user":
                write(f"{d}/dev", f"{c['dev'][0]}:{k}\n", 0o444)
            symlink("../..", f"{d}/device")
            symlink(f"../../devices/{parent}/{c['bus_id']}/{cls}/{c['name']}",
                    f"{sysd}/class/{cls}/{c['name']}")


def write_dev(root, fab, node):
    """dev/: the HCAs' uverbs, umad and issm nodes with the kernel's modes
    (uverbs and rdma_cm 0666 by udev's rdma-core rules, umad/issm root-only),
    and the GPUDirect, NVSwitch and IMEX nodes."""
    dev = os.path.join(root, "dev")
    for h in fab["hcas"]:
        k = h["uverbs"]
        node(f"{dev}/infiniband/uverbs{k}", IB_MAJOR, UVERBS_BASE + k, 0o666)
        node(f"{dev}/infiniband/umad{k}", IB_MAJOR, k, 0o600)
        node(f"{dev}/infiniband/issm{k}", IB_MAJOR, ISSM_BASE + k, 0o600)
    if fab["rdma_cm"]:
        node(f"{dev}/infiniband/rdma_cm", MISC_MAJOR, RDMA_CM_MINOR, 0o666)
    for c in fab.get("cxis", ()):
        node(f"{dev}/{c['name']}", *c["dev"], 0o666)       # cxi_user's devnode: 0666
    if fab["gpudirect"]:
        node(f"{dev}/gdrdrv", GDRDRV_MAJOR, 0, 0o666)
        for i in range(NVFS_NODES):
            node(f"{dev}/nvidia-fs{i}", NVFS_MAJOR, i, 0o666)
    if fab["nvswitches"]:
        node(f"{dev}/nvidia-nvswitchctl", NVSWITCH_MAJOR, NVSWITCH_CTL_MINOR, 0o666)
        for i in range(fab["nvswitches"]):
            node(f"{dev}/nvidia-nvswitch{i}", NVSWITCH_MAJOR, i, 0o666)
    for i in range(fab["imex_channels"]):
        node(f"{dev}/nvidia-caps-imex-channels/channel{i}", IMEX_MAJOR, i, 0o666)

