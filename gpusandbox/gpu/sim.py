"""A simulated GPU host: a driver root and a dev root that look real to discovery.

`python -m gpusandbox.gpu.sim create DIR --gpus 4` (or `gpusandbox sim ...`) writes
into DIR what a host with the NVIDIA driver shows (docs: /work/shared/GPU-FACTS.md):
the /proc/driver files, /proc/devices, real character devices in DIR/dev (opening
one fails with ENXIO because no driver sits behind major 195, while a cgroup
device filter makes it fail with EPERM), real shared libraries and programs built
from simsrc/*.c, GSP firmware, the persistenced socket, and an ld.so.cache written
by the real ldconfig (`ldconfig -r DIR`, so cache paths are relative to DIR as
they are relative to / on a real host).  Discovery, injection and the tests use
the same code path as for the real driver: only the roots differ.

The libraries find their root from their own location (simsrc/simcommon.c), so
DIR/usr/bin/nvidia-smi and a ctypes load of DIR/usr/lib/x86_64-linux-gnu/
libcuda.so.1 see DIR's GPUs on the host, and the same files mounted into a
sandbox see the sandbox's /proc and /dev.
"""
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys

from gpusandbox.errors import GpuError, UsageError
from gpusandbox.gpu import simmps

MARKER = ".gpusandbox-sim"
BUILD = ".sim-build"
LIBDIR = "usr/lib/x86_64-linux-gnu"
LIBDIR32 = "usr/lib/i386-linux-gnu"
NVIDIA_MAJOR = 195
UVM_MAJOR = 508   # dynamic majors are handed out from 511 down (fs/char_dev.c)
CAPS_MAJOR = 511
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
GEFORCE_MODEL = "NVIDIA GeForce RTX 4090"
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "simsrc")
_PLACEHOLDER = b"libgpusandbox-sim-soname-" + b"X" * 39  # 64 bytes, see generic.c

# name, SONAME suffix ("v" = the full version), dev link: the driver's installed
# set for the utility, compute, video and graphics capabilities.  The legacy
# libnvidia-fatbinaryloader and libnvidia-compiler left the driver before R500.
_LIBS = """libcuda 1 y; libnvidia-ml 1 y; libnvidia-cfg 1 y; libnvidia-nscq 2 y;
libcudadebugger 1 n; libnvidia-opencl 1 n; libnvidia-gpucomp v n;
libnvidia-ptxjitcompiler 1 y; libnvidia-allocator 1 y; libnvidia-pkcs11 v n;
libnvidia-pkcs11-openssl3 v n; libnvidia-nvvm 4 y; libnvidia-encode 1 y;
libnvcuvid 1 y; libnvidia-opticalflow 1 y; libEGL_nvidia 0 n; libGLX_nvidia 0 n;
libGLESv2_nvidia 2 n; libGLESv1_CM_nvidia 1 n; libnvidia-glcore v n;
libnvidia-eglcore v n; libnvidia-tls v n; libnvidia-glsi v n; libnvidia-fbc 1 y;
libnvidia-rtcore v n; libnvoptix 1 y; libnvidia-glvkspirv v n; libnvidia-ngx 1 y"""
LIBRARIES = [tuple(item.split()) for item in _LIBS.replace("\n", " ").split(";")]
BINARIES = ("nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
            "nvidia-cuda-mps-server")
_VERSION_RE = re.compile(r"^\d{2,4}(\.\d{1,4}){1,3}$")


def gpu_uuid(root, index):
    """The GPU UUID of host GPU `index`: derived from the root, so reruns agree."""
    digest = hashlib.sha1(f"gpusandbox-sim:{os.path.realpath(root)}:{index}".encode()).digest()
    return "GPU-" + _dashed(digest[:16])


def mig_uuid(gpu, gi, ci):
    """MIG-<uuid> of instance gi/ci on GPU `gpu` (a GPU- UUID); simcommon.c agrees."""
    key = f"{gpu}/gi{gi}/ci{ci}".encode()
    return "MIG-" + _dashed(_fnv(key, 0xCBF29CE484222325).to_bytes(8, "big")
                            + _fnv(key, 0x84222325CBF29CE4).to_bytes(8, "big"))


def mig_minor(gpu, gi, ci=None):
    """The nvidia-caps minor of gpuN/giM/access (ci None) or gpuN/giM/ciK/access.

    nv-caps.c numbers one static table in order: fabric-mgmt 0, mig/config 1,
    mig/monitor 2, then per GPU (32) per GI (15) the GI entry and its 8 CIs.
    """
    base = 3 + gpu * 135 + gi * 9
    return base if ci is None else base + 1 + ci


def _fnv(data, h):
    mask = 0xFFFFFFFFFFFFFFFF
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & mask
    h = ((h ^ (h >> 33)) * 0xFF51AFD7ED558CCD) & mask
    h = ((h ^ (h >> 33)) * 0xC4CEB9FE1A85EC53) & mask
    return h ^ (h >> 33)


def _dashed(raw):
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _write(path, data, mode=0o644):
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        os.fchmod(f.fileno(), mode)


def _symlink(target, path):
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    os.symlink(target, path)


def parse_mig(spec, gpus, model):
    """'0:1:0,0:2:0[:profile]' -> {gpu: {gi: profile}}, {gpu: [(gi, ci)]}."""
    instances, profiles = {}, {}
    for item in filter(None, (spec or "").split(",")):
        parts = item.strip().split(":")
        try:
            gpu, gi, ci = (int(p) for p in parts[:3])
            profile = parts[3] if len(parts) == 4 else None
            if len(parts) not in (3, 4) or not (0 <= gpu < gpus and 0 <= gi < 15 and 0 <= ci < 8) \
                    or (profile is not None and not re.match(r"^\d+g\.\d+gb(\+[a-z]+)?$", profile)):
                raise ValueError
        except ValueError:
            raise UsageError(f"bad --mig item {item!r}", "expected GPU:GI:CI[:PROFILE] with "
                             f"GPU < {gpus}, GI 0-14, CI 0-7, PROFILE like 3g.40gb",
                             hint="e.g. --mig 0:1:0,0:2:0") from None
        instances.setdefault(gpu, []).append((gi, ci))
        if profile:
            profiles.setdefault(gpu, {})[gi] = profile
    total = int(m.group(1)) if (m := re.search(r"(\d+)\s*GB", model, re.I)) else 80
    for gpu, pairs in instances.items():
        gis = sorted({gi for gi, _ in pairs})
        if len(gis) > 7 or len(pairs) > 7:
            raise UsageError(f"bad --mig for GPU {gpu}", "a GPU holds at most 7 MIG devices")
        slices = max(s for s in (1, 2, 3, 4, 7) if s * len(gis) <= 7)
        eighths = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}[slices]
        for gi in gis:
            profiles.setdefault(gpu, {}).setdefault(gi, f"{slices}g.{total * eighths // 8}gb")
        instances[gpu] = sorted(set(pairs))
    return instances, profiles


def _check_target(root):
    if os.geteuid() != 0:
        raise GpuError(f"cannot create a simulated GPU host in {root}",
                       "the simulated host needs root for real device nodes (mknod)",
                       hint="run `gpusandbox sim create` as root once; the tree is then usable by everyone")
    probe = root
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if os.statvfs(probe).f_flag & os.ST_NODEV:
        raise GpuError(f"cannot create a simulated GPU host in {root}",
                       "its filesystem is mounted nodev, so its device nodes could never be opened",
                       hint="pick a directory on a filesystem mounted without nodev (e.g. under /var/tmp)")
    created = not os.path.exists(root)
    if created:
        os.makedirs(root, mode=0o755)
    elif os.path.isfile(os.path.join(root, MARKER)):
        _refuse_mounts_below(root)
        created = _marker_created(os.path.join(root, MARKER))
        _remove_contents(root, keep=BUILD)
    elif not os.path.isdir(root) or os.listdir(root):
        raise UsageError(f"cannot create a simulated GPU host in {root}",
                         "it exists and is not an empty directory or an earlier simulated host",
                         hint="pick a new or empty directory")
    os.chmod(root, 0o755)
    return created


def create(root, gpus=4, driver_version="550.54.15", cuda_version="12.4", model=DEFAULT_MODEL,
           mig=None, uvm=True, pad_ldcache=0, lib_version=None):
    """Write a simulated host into `root`; return a JSON-able description of it."""
    root = os.path.abspath(root)
    lib_version = lib_version or driver_version
    for name, value in (("--driver-version", driver_version), ("--lib-version", lib_version)):
        if not _VERSION_RE.match(value):
            raise UsageError(f"bad {name} {value!r}", "expected a driver version such as 550.54.15")
    if not re.match(r"^\d+\.\d$", cuda_version):
        raise UsageError(f"bad --cuda-version {cuda_version!r}", "expected MAJOR.MINOR such as 12.4")
    if not 0 <= gpus <= 32:
        raise UsageError(f"bad --gpus {gpus}", "the driver handles 0 to 32 GPUs")
    if not 0 <= pad_ldcache <= 100000:
        raise UsageError(f"bad --pad-ldcache {pad_ldcache}", "expected 0 to 100000")
    instances, profiles = parse_mig(mig, gpus, model)
    created = _check_target(root)
    info = {"root": root, "dev_root": os.path.join(root, "dev"), "driver_version": driver_version,
            "lib_version": lib_version, "cuda_version": cuda_version,
            "cuda_driver_version": int(cuda_version.split(".")[0]) * 1000 + int(cuda_version.split(".")[1]) * 10,
            "majors": {"nvidia": NVIDIA_MAJOR, "nvidia-uvm": UVM_MAJOR if uvm else None,
                       "nvidia-caps": CAPS_MAJOR},
            "libdir": os.path.join(root, LIBDIR), "created_dir": created, "gpus": []}
    _write(os.path.join(root, MARKER), json.dumps({"created_dir": created}))
    try:
        for i in range(gpus):
            uuid = gpu_uuid(root, i)
            info["gpus"].append({
                "index": i, "minor": i, "model": model, "uuid": uuid, "bus_id": f"0000:{6 + i:02x}:00.0",
                "mig": [{"gi": gi, "ci": ci, "profile": profiles[i][gi], "uuid": mig_uuid(uuid, gi, ci),
                         "gi_minor": mig_minor(i, gi), "ci_minor": mig_minor(i, gi, ci)}
                        for gi, ci in instances.get(i, [])]})
        build = _build(root, lib_version, info["cuda_driver_version"], profiles)
        _write_proc(root, info, uvm)
        _write_dev(root, info, uvm)
        _install(root, info, build, pad_ldcache)
        _ldconfig(root)
        _world_readable(root)
    except BaseException:
        destroy(root)
        raise
    _write(os.path.join(root, MARKER), json.dumps(info, indent=1) + "\n")
    return info


def destroy(root):
    """Remove a simulated host made by create(); refuse any other directory."""
    root = os.path.abspath(root)
    marker = os.path.join(root, MARKER)
    if not os.path.isfile(marker) or os.path.islink(marker):
        raise UsageError(f"refusing to remove {root}", "it is not a simulated GPU host (no marker file)",
                         hint="only directories made by `gpusandbox sim create` can be destroyed")
    created = _marker_created(marker)
    _refuse_mounts_below(root)
    _remove_contents(root)
    if created:
        os.rmdir(root)


def _marker_created(marker):
    try:
        with open(marker) as f:
            return bool(json.load(f).get("created_dir"))
    except (OSError, ValueError, AttributeError):
        return False


def _refuse_mounts_below(root):
    """shutil.rmtree would descend into a filesystem mounted below root and empty it."""
    with open("/proc/self/mountinfo") as f:
        below = [p for p in (_unescape(line.split()[4]) for line in f) if p.startswith(root + "/")]
    if below:
        raise GpuError(f"refusing to remove {root}", f"{below[0]} is mounted below it",
                       hint=f"unmount it first (umount {below[0]})")


def _unescape(field):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _remove_contents(root, keep=None):
    for name in os.listdir(root):
        if name in (keep, MARKER):
            continue
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    os.unlink(os.path.join(root, MARKER))


def _build(root, lib_version, cuda, profiles):
    """Compile simsrc once per (sources, versions, MIG profiles) into root/.sim-build/KEY."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise GpuError("cannot build the simulated driver libraries", "no C compiler (gcc) on PATH",
                       hint="install gcc and the libc headers (Debian: apt-get install gcc libc6-dev)")
    mig = ";".join(f"{g}:{gi}:{p}" for g, d in sorted(profiles.items()) for gi, p in sorted(d.items()))
    flags = ["-O2", "-Wall", "-std=gnu11", f'-DSIM_LIB_VERSION="{lib_version}"',
             f"-DSIM_CUDA_VERSION={cuda}", f'-DSIM_MIG_PROFILES="{mig}"']
    digest = hashlib.sha256(json.dumps(flags).encode())
    for name in sorted(os.listdir(SRC)):
        with open(os.path.join(SRC, name), "rb") as f:
            digest.update(name.encode() + f.read())
    out = os.path.join(root, BUILD, digest.hexdigest()[:16])
    lib = ["-shared", "-fPIC"]
    jobs = {
        "cuda.so": lib + ["-Wl,-soname,libcuda.so.1", "cuda.c"],
        "nvml.so": lib + ["-Wl,-soname,libnvidia-ml.so.1", "nvml.c"],
        # No libc and no separate code segment keep each padding copy near 5 KB.
        "generic.so": lib + ["-nostdlib", "-s", "-Wl,-z,noseparate-code",
                             "-Wl,-soname," + _PLACEHOLDER.decode(), "generic.c"],
        # DT_RPATH (not RUNPATH) so dlopen("libnvidia-ml.so.1") from the program
        # takes the NVML next to it, on the host side as in a sandbox, before
        # LD_LIBRARY_PATH or a real driver's NVML on the host.
        "smi": ["-Wl,--disable-new-dtags,-rpath,$ORIGIN/../lib/x86_64-linux-gnu:$ORIGIN/../lib64", "smi.c"],
        "tool": ["tool.c"],
    }
    for old in os.listdir(os.path.dirname(out)) if os.path.isdir(os.path.dirname(out)) else ():
        if old != os.path.basename(out):
            shutil.rmtree(os.path.join(os.path.dirname(out), old))
    if os.path.isdir(out):
        return out
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "32"), mode=0o755)
    _compile(cc, flags, tmp, jobs, required=True)
    # 32-bit copies only where the compiler has a multilib (gcc-multilib).
    if _compile(cc, flags + ["-m32"], os.path.join(tmp, "32"),
                {k: v for k, v in jobs.items() if k.endswith(".so")}, required=False):
        shutil.rmtree(os.path.join(tmp, "32"))
    os.rename(tmp, out)
    return out


def _compile(cc, flags, out, jobs, required):
    """Run the compiler jobs in parallel; return the first failure's stderr, or ''."""
    procs = {name: subprocess.Popen([cc, *flags, "-o", os.path.join(out, name), *args], cwd=SRC,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for name, args in jobs.items()}
    failed = ""
    for name, proc in procs.items():
        err = proc.communicate()[1].decode(errors="replace").strip()
        if proc.returncode != 0 and not failed:
            failed = err or f"{cc} exited with status {proc.returncode}"
            if required:
                raise GpuError(f"cannot build the simulated driver ({name})", failed.splitlines()[-1],
                               hint="install gcc and the libc headers (Debian: apt-get install gcc libc6-dev)")
    return failed


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


def _write_proc(root, info, uvm):
    proc = os.path.join(root, "proc")
    nv = os.path.join(proc, "driver/nvidia")
    ver = info["driver_version"]
    _write(f"{nv}/version", f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {ver}  "
           "Tue Mar  5 19:30:09 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n")
    _write(f"{nv}/params", PARAMS)
    for g in info["gpus"]:
        _write(f"{nv}/gpus/{g['bus_id']}/information",
               f"Model: \t\t {g['model']}\nIRQ:   \t\t {150 + g['minor']}\nGPU UUID: \t {g['uuid']}\n"
               "Video BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
               f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {g['bus_id']}\n"
               f"Device Minor: \t {g['minor']}\nGPU Firmware: \t {ver}\nGPU Excluded:\t No\n")
        for m in g["mig"]:
            base = f"{nv}/capabilities/gpu{g['minor']}/mig/gi{m['gi']}"
            _write(f"{base}/access", _cap_file(m["gi_minor"], 0o444))
            _write(f"{base}/ci{m['ci']}/access", _cap_file(m["ci_minor"], 0o444))
    for name, minor in (("config", 1), ("monitor", 2)):
        _write(f"{nv}/capabilities/mig/{name}", _cap_file(minor, _CAP_MODE[name]))
    # The whole static table, as nv-caps.c prints it whatever MIG state the GPUs are in.
    rows = ["config 1", "monitor 2"]
    for gpu in range(32):
        for gi in range(15):
            rows.append(f"gpu{gpu}/gi{gi}/access {mig_minor(gpu, gi)}")
            rows += [f"gpu{gpu}/gi{gi}/ci{ci}/access {mig_minor(gpu, gi, ci)}" for ci in range(8)]
    caps = os.path.join(proc, "driver/nvidia-caps")
    _write(f"{caps}/mig-minors", "\n".join(rows) + "\n")
    _write(f"{caps}/nvlink-minors", "fabric-mgmt 0\n")
    _write(f"{caps}/sys-minors", f"fabric-imex-mgmt {mig_minor(32, 0)}\n")
    # The 195 region was "nvidia-frontend" until the R550 driver renamed it.
    front = "nvidia" if int(ver.split(".")[0]) >= 550 else "nvidia-frontend"
    chars = _CHAR_DEVICES + [(NVIDIA_MAJOR, front), (CAPS_MAJOR, "nvidia-caps")]
    chars += [(UVM_MAJOR, "nvidia-uvm")] if uvm else []
    _write(f"{proc}/devices", "Character devices:\n"
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


def _write_dev(root, info, uvm):
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


def _soname(body, soname):
    """generic.so with `soname` written over its placeholder SONAME string."""
    name = soname.encode()
    if body.count(_PLACEHOLDER) != 1 or len(name) >= len(_PLACEHOLDER):
        raise GpuError(f"cannot give the simulated library the SONAME {soname}",
                       "the placeholder is missing or too short", hint="rebuild: remove DIR/.sim-build")
    return body.replace(_PLACEHOLDER, name.ljust(len(_PLACEHOLDER), b"\0"))


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _other(version, choices):
    return next(v for v in choices if v != version)


def _install(root, info, build, pad):
    ver, cuda = info["lib_version"], info["cuda_version"]
    conf = {"x86_64-linux-gnu": ["# Multiarch support", "/usr/local/lib/x86_64-linux-gnu",
                                 "/lib/x86_64-linux-gnu", "/" + LIBDIR]}
    for libdir, sub in ((LIBDIR, ""), (LIBDIR32, "32")):
        src = os.path.join(build, sub)
        if sub and not os.path.isfile(os.path.join(src, "generic.so")):
            continue
        if sub:
            conf["i386-linux-gnu"] = ["# Multiarch support", "/lib/i386-linux-gnu", "/" + LIBDIR32]
        generic, dst = _read(os.path.join(src, "generic.so")), os.path.join(root, libdir)
        for stem, suffix, dev in LIBRARIES:
            soname, fname = f"{stem}.so.{ver if suffix == 'v' else suffix}", f"{stem}.so.{ver}"
            built = {"libcuda": "cuda.so", "libnvidia-ml": "nvml.so"}.get(stem)
            _write(os.path.join(dst, fname),
                   _read(os.path.join(src, built)) if built else _soname(generic, soname), 0o755)
            if soname != fname:
                _symlink(fname, os.path.join(dst, soname))
            if dev == "y":
                _symlink(soname, os.path.join(dst, stem + ".so"))
        # libvdpau's plugin directory, which no ld.so.conf names: discovery
        # finds it by path, as on a real host.
        _write(os.path.join(dst, "vdpau", f"libvdpau_nvidia.so.{ver}"),
               _soname(generic, "libvdpau_nvidia.so.1"), 0o755)
        _symlink(f"libvdpau_nvidia.so.{ver}", os.path.join(dst, "vdpau", "libvdpau_nvidia.so.1"))
    # Decoys discovery must reject by version: a leftover NVML of an older driver
    # next to the real one, and a CUDA forward-compat libcuda in the loader cache.
    generic = _read(os.path.join(build, "generic.so"))
    old = _other(ver, ("535.183.01", "535.161.08"))
    _write(os.path.join(root, LIBDIR, f"libnvidia-ml.so.{old}"), _soname(generic, "libnvidia-ml.so.1"), 0o755)
    compat, new = f"usr/local/cuda-{cuda}/compat", _other(ver, ("560.35.03", "560.28.03"))
    for stem in ("libcuda", "libnvidia-ptxjitcompiler"):
        _write(os.path.join(root, compat, f"{stem}.so.{new}"), _soname(generic, f"{stem}.so.1"), 0o755)
        _symlink(f"{stem}.so.{new}", os.path.join(root, compat, f"{stem}.so.1"))
    conf["cuda-compat"] = ["/" + compat]
    for i in range(pad):
        name = f"libgpusandbox-pad{i:05d}.so.1"
        _write(os.path.join(root, LIBDIR, "pad", name), _soname(generic, name), 0o755)
    if pad:
        conf["zz-gpusandbox-pad"] = ["/" + LIBDIR + "/pad"]
    _write(os.path.join(root, "etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n\n")
    for name, lines in conf.items():
        _write(os.path.join(root, f"etc/ld.so.conf.d/{name}.conf"), "\n".join(lines) + "\n")

    _write(os.path.join(root, "usr/bin/nvidia-smi"), _read(os.path.join(build, "smi")), 0o755)
    tool = _read(os.path.join(build, "tool"))
    for name in BINARIES:
        _write(os.path.join(root, "usr/bin", name), tool, 0o755)
    simmps.install(root, _write)     # nvidia-cuda-mps-control: the MPS stand-in
    for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        _write(os.path.join(root, "lib/firmware/nvidia", info["driver_version"], name),
               hashlib.shake_256(f"{name}:{info['driver_version']}".encode()).digest(8192))
    _write(os.path.join(root, "etc/OpenCL/vendors/nvidia.icd"), "libnvidia-opencl.so.1\n")
    _write(os.path.join(root, "usr/share/glvnd/egl_vendor.d/10_nvidia.json"), json.dumps(
        {"file_format_version": "1.0.0", "ICD": {"library_path": "libEGL_nvidia.so.0"}}, indent=4) + "\n")
    _write(os.path.join(root, "etc/vulkan/icd.d/nvidia_icd.json"), json.dumps(
        {"file_format_version": "1.0.0",
         "ICD": {"library_path": "libGLX_nvidia.so.0", "api_version": "1.3.277"}}, indent=4) + "\n")
    _socket(os.path.join(root, "var/run/nvidia-persistenced/socket"))


def _socket(path):
    """A socket inode with no listener, as after nvidia-persistenced has stopped."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    dfd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            # sun_path holds 108 bytes; a long DIR is reached through the dir fd.
            s.bind(path if len(path) < 100 else f"/proc/self/fd/{dfd}/socket")
    finally:
        os.close(dfd)
    os.chmod(path, 0o666)


def _ldconfig(root):
    exe = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None)
    if not exe:
        raise GpuError("cannot write the simulated host's ld.so.cache", "ldconfig not found",
                       hint="install libc-bin (Debian) or glibc (RHEL)")
    # -r: chroot into DIR, so the cache names paths as the loader in DIR sees
    # them; -X: keep the SONAME links written above (ldconfig would point
    # libnvidia-ml.so.1 at the highest version, the decoy included).
    res = subprocess.run([exe, "-X", "-r", root], capture_output=True, text=True)
    if res.returncode != 0:
        raise GpuError("ldconfig failed for the simulated host",
                       (res.stderr.strip().splitlines() or ["exit status %d" % res.returncode])[-1],
                       hint=f"run `{exe} -X -r {root}` to see the full output")


def _world_readable(root):
    """Tests run the CLI as an unprivileged user too: every file readable, dirs searchable."""
    for dirpath, _dirs, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in files:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode) and (mode & 0o444 != 0o444 or mode & 0o100 and mode & 0o011 != 0o011):
                os.chmod(path, stat.S_IMODE(mode) | 0o444 | (0o111 if mode & 0o100 else 0))


def main(argv=None):
    """`gpusandbox sim create|destroy ...`; raises SandboxError for the CLI to print."""
    import argparse
    parser = argparse.ArgumentParser(prog="gpusandbox sim", description="A simulated GPU host for "
                                     "tests and demos on machines without a GPU.")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="write a simulated host into DIR (needs root once)")
    c.add_argument("dir", metavar="DIR")
    c.add_argument("--gpus", type=int, default=4)
    c.add_argument("--driver-version", default="550.54.15")
    c.add_argument("--cuda-version", default="12.4")
    c.add_argument("--model")
    c.add_argument("--brand", choices=("datacenter", "geforce"), default="datacenter")
    c.add_argument("--mig", metavar="GPU:GI:CI[:PROFILE],...", help="MIG devices to create")
    c.add_argument("--no-uvm", action="store_true", help="as if nvidia-uvm were not loaded")
    c.add_argument("--pad-ldcache", type=int, default=0, metavar="N",
                   help="add N small libraries to the loader cache")
    c.add_argument("--lib-version", help="version of the user-space libraries (default: the driver's)")
    c.add_argument("--json", action="store_true", help="print the description as JSON")
    d = sub.add_parser("destroy", help="remove a simulated host made by create")
    d.add_argument("dir", metavar="DIR")
    args = parser.parse_args(argv)
    if args.command == "destroy":
        destroy(args.dir)
        return 0
    info = create(args.dir, gpus=args.gpus, driver_version=args.driver_version,
                  cuda_version=args.cuda_version, mig=args.mig,
                  model=args.model or (GEFORCE_MODEL if args.brand == "geforce" else DEFAULT_MODEL),
                  uvm=not args.no_uvm, pad_ldcache=args.pad_ldcache, lib_version=args.lib_version)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"simulated GPU host in {info['root']}: {len(info['gpus'])} GPU(s), driver "
          f"{info['driver_version']}, CUDA {info['cuda_version']}")
    for g in info["gpus"]:
        print(f"  GPU {g['index']}  /dev/nvidia{g['minor']}  {g['bus_id']}  {g['model']}  {g['uuid']}")
        for m in g["mig"]:
            print(f"    MIG {m['profile']:<10} gi {m['gi']} ci {m['ci']}  {m['uuid']}")
    print(f"driver root: {info['root']}  dev root: {info['dev_root']}\n"
          f"try: {info['root']}/usr/bin/nvidia-smi -L")
    return 0


if __name__ == "__main__":
    from gpusandbox.errors import SandboxError
    try:
        sys.exit(main(sys.argv[1:]))
    except SandboxError as e:
        print(f"gpusandbox: error: {e.line()}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        sys.exit(e.code)
