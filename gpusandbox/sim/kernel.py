"""The kernel side of the simulated host: /proc/driver/nvidia, /proc/devices
and real character devices in DIR/dev."""
import os
import stat

from gpusandbox.errors import GpuError

from .ids import mig_minor
from .layout import CAPS_MAJOR, NVIDIA_MAJOR, UVM_MAJOR, write


# /proc/driver/nvidia/params of an R550 driver with default module options.
PARAMS = "".join(f"{item.replace('=', ': ')}\n" for item in """ResmanDebugLevel=4294967295
RmLogonRC=1 ModifyDeviceFiles=1 DeviceFileUID=0 DeviceFileGID=0 DeviceFileMode=438
InitializeSystemMemoryAllocations=1 UsePageAttributeTable=4294967295 EnableMSI=1
EnablePCIeGen3=0 MemoryPoolSize=0 KMallocHeapMaxSize=0 VMallocHeapMaxSize=0 IgnoreMMIOCheck=0
EnableStreamMemOPs=0 EnableUserNUMAManagement=1 NvLinkDisable=0 RmProfilingAdminOnly=1
PreserveVideoMemoryAllocations=0 EnableS0ixPowerManagement=0 DynamicPowerManagement=3
RegisterPCIDriver=1 EnablePCIERelaxedOrderingMode=0 EnableResizableBar=0 EnableGpuFirmware=18
EnableGpuFirmwareLogs=2 EnableDbgBreakpoint=0 OpenRmEnableUnsupportedGpus=0 DmaRemapPeerMmio=1
RegistryDwords="" RegistryDwordsPerDevice="" RmMsg="" GpuBlacklist="" TemporaryFilePath=""
ExcludedGpus=""
""".split())
_CHAR_DEVICES = [(1, "mem"), (4, "/dev/vc/0"), (4, "tty"), (4, "ttyS"), (5, "/dev/tty"),
                 (5, "/dev/console"), (5, "/dev/ptmx"), (7, "vcs"), (10, "misc"), (13, "input"),
                 (21, "sg"), (29, "fb"), (89, "i2c"), (128, "ptm"), (136, "pts"), (180, "usb"),
                 (189, "usb_device"), (226, "drm"), (240, "hidraw"), (241, "wwan_port"),
                 (248, "bsg"), (249, "watchdog"), (250, "ptp"), (251, "pps"), (252, "rtc"),
                 (253, "dax"), (254, "gpiochip")]
_BLOCK_DEVICES = [(7, "loop"), (8, "sd"), (9, "md"), (11, "sr"), (65, "sd"), (66, "sd"),
                  (253, "device-mapper"), (254, "mdp"), (259, "blkext")]
_CAP_MODE = {"config": 0o400, "monitor": 0o444}  # nv-caps: config is root-only


def _cap_file(minor, mode):
    return f"DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n"


def write_proc(root, info, uvm):
    proc = os.path.join(root, "proc")
    nv = os.path.join(proc, "driver/nvidia")
    ver = info["driver_version"]
    write(f"{nv}/version", f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {ver}  "
           "Tue Mar  5 19:30:09 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n")
    write(f"{nv}/params", PARAMS)
    for g in info["gpus"]:
        write(f"{nv}/gpus/{g['bus_id']}/information",
               f"Model: \t\t {g['model']}\nIRQ:   \t\t {150 + g['minor']}\nGPU UUID: \t {g['uuid']}\n"
               "Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
               f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {g['bus_id']}\n"
               f"Device Minor: \t {g['minor']}\nGPU Firmware: \t {ver}\nGPU Excluded:\t No\n")
        for m in g["mig"]:
            base = f"{nv}/capabilities/gpu{g['minor']}/mig/gi{m['gi']}"
            write(f"{base}/access", _cap_file(m["gi_minor"], 0o444))
            write(f"{base}/ci{m['ci']}/access", _cap_file(m["ci_minor"], 0o444))
    for name, minor in (("config", 1), ("monitor", 2)):
        write(f"{nv}/capabilities/mig/{name}", _cap_file(minor, _CAP_MODE[name]))
    # The whole static table, as nv-caps.c prints it whatever MIG state the GPUs are in.
    rows = ["config 1", "monitor 2"]
    for gpu in range(32):
        for gi in range(15):
            rows.append(f"gpu{gpu}/gi{gi}/access {mig_minor(gpu, gi)}")
            rows += [f"gpu{gpu}/gi{gi}/ci{ci}/access {mig_minor(gpu, gi, ci)}" for ci in range(8)]
    caps = os.path.join(proc, "driver/nvidia-caps")
    write(f"{caps}/mig-minors", "\n".join(rows) + "\n")
    write(f"{caps}/nvlink-minors", "fabric-mgmt 0\n")
    write(f"{caps}/sys-minors", f"fabric-imex-mgmt {mig_minor(32, 0)}\n")
    # The 195 region was "nvidia-frontend" until the R550 driver renamed it.
    front = "nvidia" if int(ver.split(".")[0]) >= 550 else "nvidia-frontend"
    chars = _CHAR_DEVICES + [(NVIDIA_MAJOR, front), (CAPS_MAJOR, "nvidia-caps")]
    chars += [(UVM_MAJOR, "nvidia-uvm")] if uvm else []
    if info.get("fabric"):
        from .fabric import char_devices
        chars += char_devices(info["fabric"])
    write(f"{proc}/devices", "Character devices:\n"
           + "".join(f"{n:3d} {name}\n" for n, name in sorted(chars, key=lambda c: c[0]))
           + "\nBlock devices:\n" + "".join(f"{n:3d} {name}\n" for n, name in _BLOCK_DEVICES))


def _node(path, major, minor, mode):
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    try:
        os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    except PermissionError:
        raise GpuError(f"cannot create the device node {path}",
                       "the simulated host needs root for real device nodes (mknod)",
                       hint="run `gpusandbox sim create` as real root once (not in a user namespace); "
                            "the tree is then usable by everyone") from None
    os.chmod(path, mode)


def write_dev(root, info, uvm):
    dev = os.path.join(root, "dev")
    for g in info["gpus"]:
        _node(f"{dev}/nvidia{g['minor']}", NVIDIA_MAJOR, g["minor"], 0o666)
    _node(f"{dev}/nvidiactl", NVIDIA_MAJOR, 255, 0o666)
    _node(f"{dev}/nvidia-modeset", NVIDIA_MAJOR, 254, 0o666)
    if uvm:
        _node(f"{dev}/nvidia-uvm", UVM_MAJOR, 0, 0o666)
        _node(f"{dev}/nvidia-uvm-tools", UVM_MAJOR, 1, 0o666)
    migs = [m for g in info["gpus"] for m in g["mig"]]
    if migs:
        minors = {1: 0o400, 2: 0o444}
        minors.update({m[k]: 0o444 for m in migs for k in ("gi_minor", "ci_minor")})
        for minor, mode in sorted(minors.items()):
            _node(f"{dev}/nvidia-caps/nvidia-cap{minor}", CAPS_MAJOR, minor, mode)
