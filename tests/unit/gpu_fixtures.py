"""A fake NVIDIA driver root, written by hand for the GPU-layer unit tests.

Independent of gpusandbox.sim on purpose: these files are shaped after
GPU-FACTS.md directly, so the discovery code and the simulator are checked
against the facts, not against each other.

FakeDriver(...).root holds proc/driver/nvidia/{version,params,gpus/<bus>/information},
proc/devices, dev/nvidia* (real character nodes when running as root),
tiny real shared objects built with gcc (SONAMEs, the version suffix; libcuda
answers cuDriverGetVersion, libnvidia-ml answers the NVML MIG calls), an
etc/ld.so.cache written by the real `ldconfig -r`, binaries, GSP firmware,
IPC sockets and, optionally, MIG capability files.
"""
import os
import shutil
import socket
import stat
import subprocess
import tempfile

VERSION = "550.54.15"
UVM_MAJOR = 509
CAPS_MAJOR = 238
LIBDIR = "usr/lib/x86_64-linux-gnu"
LIBDIR32 = "usr/lib/i386-linux-gnu"
# family -> SONAME (None: the SONAME is the versioned file name itself)
LIBS = {
    "libcuda": "libcuda.so.1",
    "libnvidia-ml": "libnvidia-ml.so.1",
    "libnvidia-cfg": "libnvidia-cfg.so.1",
    "libnvidia-ptxjitcompiler": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-nvvm": "libnvidia-nvvm.so.4",
    "libnvidia-opencl": "libnvidia-opencl.so.1",
    "libnvidia-gpucomp": None,
    "libnvidia-encode": "libnvidia-encode.so.1",
    "libnvcuvid": "libnvcuvid.so.1",
    "libGLX_nvidia": "libGLX_nvidia.so.0",
    "libEGL_nvidia": "libEGL_nvidia.so.0",
    "libnvidia-glcore": None,
    "libnvidia-eglcore": None,
    "libnvidia-ngx": "libnvidia-ngx.so.1",
}
# Plugins ldconfig never sees (no ld.so.conf names their directory): found by path.
PLUGINS = {"libvdpau_nvidia": ("vdpau", "libvdpau_nvidia.so.1")}
BINS = ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server")
HAVE_GCC = shutil.which("gcc") is not None
HAVE_LDCONFIG = shutil.which("ldconfig") is not None or os.path.exists("/sbin/ldconfig")
IS_ROOT = os.geteuid() == 0
CUDA_VERSION = 12040

_CUDA_C = """
int cuDriverGetVersion(int *v) { *v = %d; return 0; }
int cuInit(unsigned int flags) { (void)flags; return 0; }
"""

# NVML calls used by gpusandbox.gpu.ceiling; the MIG table is compiled in.
_NVML_C = r"""
#include <string.h>
struct mig { const char *gpu; unsigned gi, ci; const char *uuid; };
static const char *gpus[] = { %(gpus)s 0 };
static const struct mig migs[] = { %(migs)s {0, 0, 0, 0} };
int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetHandleByUUID(const char *uuid, void **h) {
    for (long i = 0; gpus[i]; i++)
        if (!strcmp(gpus[i], uuid)) { *h = (void *)(i + 1); return 0; }
    return 6;
}
int nvmlDeviceGetMaxMigDeviceCount(void *h, unsigned *n) { (void)h; *n = 7; return 0; }
int nvmlDeviceGetMigDeviceHandleByIndex(void *h, unsigned idx, void **out) {
    long g = (long)h - 1; unsigned seen = 0;
    for (long i = 0; migs[i].gpu; i++)
        if (!strcmp(migs[i].gpu, gpus[g]) && seen++ == idx) { *out = (void *)(1000 + i); return 0; }
    return 6;
}
static const struct mig *M(void *h) { return &migs[(long)h - 1000]; }
int nvmlDeviceGetUUID(void *h, char *buf, unsigned len) {
    if ((long)h < 1000) { strncpy(buf, gpus[(long)h - 1], len); return 0; }
    strncpy(buf, M(h)->uuid, len); return 0;
}
int nvmlDeviceGetGpuInstanceId(void *h, unsigned *v) { *v = M(h)->gi; return 0; }
int nvmlDeviceGetComputeInstanceId(void *h, unsigned *v) { *v = M(h)->ci; return 0; }
"""


def gpu_uuid(i):
    return f"GPU-{i:08x}-1111-2222-3333-44445555{i:04x}"


def mig_uuid(minor, gi, ci):
    return f"MIG-{minor:08x}-{gi:04x}-{ci:04x}-aaaa-bbbbccccdddd"


def bus_id(i):
    return f"0000:{0x06 + 0x20 * i:02x}:00.0"


def _cc(src, out, soname=None, m32=False):
    args = ["gcc", "-shared", "-fPIC", "-O0", "-o", out, "-x", "c", "-"]
    if soname:
        args.append(f"-Wl,-soname,{soname}")
    if m32:
        args[1:1] = ["-m32", "-nostdlib"]
    subprocess.run(args, input=src.encode(), check=True, capture_output=True)


class FakeDriver:
    """gpus: number of GPUs; minors are assigned in reverse bus order so that
    index (bus order) and minor differ.  mig: {gpu index: [(gi, ci), ...]}."""

    def __init__(self, gpus=2, version=VERSION, mig=None, nodes=True, frontend="nvidia",
                 uvm=True, compat32=False, filler=0, stale_libs=True, mps=True):
        self.version = version
        self.root = tempfile.mkdtemp(prefix="gpusandbox-fake-", dir="/tmp")
        self.count = gpus
        self.mig = mig or {}
        try:
            self._proc(frontend, uvm)
            if nodes and IS_ROOT:
                self._nodes(uvm)
            self._libs(compat32, filler, stale_libs)
            self._files(mps)
        except BaseException:
            self.cleanup()
            raise

    # -- helpers ----------------------------------------------------------------
    def p(self, rel):
        return os.path.join(self.root, rel.lstrip("/"))

    def write(self, rel, text, mode=0o644):
        path = self.p(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w" if isinstance(text, str) else "wb") as f:
            f.write(text)
        os.chmod(path, mode)
        return path

    def minor(self, i):
        return self.count - 1 - i

    def cleanup(self):
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()

    # -- pieces -----------------------------------------------------------------
    def _proc(self, frontend, uvm):
        self.write("proc/driver/nvidia/version",
                   f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {self.version}  "
                   "Tue Mar  5 19:30:09 UTC 2024\nGCC version:  gcc version 12.2.0\n")
        self.write("proc/driver/nvidia/params",
                   "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n")
        for i in range(self.count):
            self.write(f"proc/driver/nvidia/gpus/{bus_id(i)}/information",
                       f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 35\n"
                       f"GPU UUID: \t {gpu_uuid(i)}\nVideo BIOS: \t 96.00.99.00.01\n"
                       f"Bus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                       f"Bus Location: \t {bus_id(i)}\nDevice Minor: \t {self.minor(i)}\n")
        chars = ["  1 mem", f"{195:3d} {frontend}", "226 drm"]
        if uvm:
            chars.append(f"{UVM_MAJOR} nvidia-uvm")
        chars.append(f"{CAPS_MAJOR} nvidia-caps")
        self.write("proc/devices", "Character devices:\n" + "\n".join(chars)
                   + "\n\nBlock devices:\n  8 sd\n195 notnvidia\n")
        if self.mig:
            minors = ["config 1", "monitor 2"]
            self.write("proc/driver/nvidia/capabilities/mig/config",
                       "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n")
            self.write("proc/driver/nvidia/capabilities/mig/monitor",
                       "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
            for i, pairs in self.mig.items():
                m = self.minor(i)
                for gi, ci in pairs:
                    base = f"proc/driver/nvidia/capabilities/gpu{m}/mig/gi{gi}"
                    gmin, cmin = self.cap_minors(i, gi, ci)
                    self.write(f"{base}/access", f"DeviceFileMinor: {gmin}\nDeviceFileMode: 292\n")
                    self.write(f"{base}/ci{ci}/access",
                               f"DeviceFileMinor: {cmin}\nDeviceFileMode: 292\n")
                    minors += [f"gpu{m}/gi{gi}/access {gmin}", f"gpu{m}/gi{gi}/ci{ci}/access {cmin}"]
            self.write("proc/driver/nvidia-caps/mig-minors", "\n".join(minors) + "\n")

    def cap_minors(self, i, gi, ci):
        m = self.minor(i)
        return 3 + m * 100 + gi * 10, 3 + m * 100 + gi * 10 + 1 + ci

    def mknod(self, rel, major, minor):
        path = self.p(rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))

    def _nodes(self, uvm):
        for i in range(self.count):
            self.mknod(f"dev/nvidia{self.minor(i)}", 195, self.minor(i))
        self.mknod("dev/nvidiactl", 195, 255)
        self.mknod("dev/nvidia-modeset", 195, 254)
        if uvm:
            self.mknod("dev/nvidia-uvm", UVM_MAJOR, 0)
            self.mknod("dev/nvidia-uvm-tools", UVM_MAJOR, 1)
        if self.mig:
            self.mknod("dev/nvidia-caps/nvidia-cap1", CAPS_MAJOR, 1)
            self.mknod("dev/nvidia-caps/nvidia-cap2", CAPS_MAJOR, 2)
            for i, pairs in self.mig.items():
                for gi, ci in pairs:
                    for mn in self.cap_minors(i, gi, ci):
                        self.mknod(f"dev/nvidia-caps/nvidia-cap{mn}", CAPS_MAJOR, mn)

    def _libs(self, compat32, filler, stale_libs):
        os.makedirs(self.p(LIBDIR))
        ver = self.version
        gpus = "".join(f'"{gpu_uuid(i)}", ' for i in range(self.count))
        migs = "".join(f'{{"{gpu_uuid(i)}", {gi}, {ci}, "{mig_uuid(self.minor(i), gi, ci)}"}}, '
                       for i, pairs in self.mig.items() for gi, ci in pairs)
        for fam, soname in LIBS.items():
            if fam == "libcuda":
                src = _CUDA_C % CUDA_VERSION
            elif fam == "libnvidia-ml":
                src = _NVML_C % {"gpus": gpus, "migs": migs}
            else:
                src = f"int {fam.replace('-', '_')}_marker(void) {{ return 1; }}\n"
            real = f"{fam}.so.{ver}"
            _cc(src, self.p(f"{LIBDIR}/{real}"), soname or real)
            if soname:
                # One absolute link, as some driver installers write them: it
                # must resolve inside the driver root, not on the host.
                target = f"/{LIBDIR}/{real}" if fam == "libnvidia-cfg" else real
                os.symlink(target, self.p(f"{LIBDIR}/{soname}"))
                os.symlink(soname, self.p(f"{LIBDIR}/{fam}.so"))
        for fam, (sub, soname) in PLUGINS.items():
            os.makedirs(self.p(f"{LIBDIR}/{sub}"))
            _cc(f"int {fam}_marker(void) {{ return 1; }}\n",
                self.p(f"{LIBDIR}/{sub}/{fam}.so.{ver}"), soname)
            os.symlink(f"{fam}.so.{ver}", self.p(f"{LIBDIR}/{sub}/{soname}"))
        if stale_libs:
            # Leftovers of an older driver and an unrelated library: never injected.
            _cc("int old(void){return 0;}\n", self.p(f"{LIBDIR}/libnvidia-fbc.so.535.104.05"),
                "libnvidia-fbc.so.1")
            os.symlink("libnvidia-fbc.so.535.104.05", self.p(f"{LIBDIR}/libnvidia-fbc.so.1"))
            _cc("int foo(void){return 0;}\n", self.p(f"{LIBDIR}/libfoo.so.{ver}"), "libfoo.so.1")
            os.symlink(f"libfoo.so.{ver}", self.p(f"{LIBDIR}/libfoo.so.1"))
        if compat32:
            os.makedirs(self.p(LIBDIR32))
            _cc("int cuDriverGetVersion(int *v){*v=12040;return 0;}\n",
                self.p(f"{LIBDIR32}/libcuda.so.{ver}"), "libcuda.so.1", m32=True)
            os.symlink(f"libcuda.so.{ver}", self.p(f"{LIBDIR32}/libcuda.so.1"))
        if filler:
            fdir = self.p("usr/lib/filler")
            os.makedirs(fdir)
            _cc("int f(void){return 0;}\n", os.path.join(fdir, "seed"))
            for n in range(filler):
                # No SONAME: ldconfig keys each copy by its file name.
                os.link(os.path.join(fdir, "seed"), os.path.join(fdir, f"libfill{n}.so.{n % 7}"))
            os.unlink(os.path.join(fdir, "seed"))
        self.write("etc/ld.so.conf", f"/{LIBDIR}\n/{LIBDIR32}\n/usr/lib/filler\n")
        # -X: keep the links written above exactly as they are.
        subprocess.run(["ldconfig", "-X", "-r", self.root], check=True, capture_output=True)

    def _files(self, mps):
        for b in BINS:
            self.write(f"usr/bin/{b}", "#!/bin/sh\necho fake\n", 0o755)
        for fw in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
            self.write(f"lib/firmware/nvidia/{self.version}/{fw}", b"\0" * 16)
        self.write(f"lib/firmware/nvidia/{self.version}/README", "not firmware")
        self.write("etc/OpenCL/vendors/nvidia.icd", "libnvidia-opencl.so.1\n")
        os.makedirs(self.p("var/run/nvidia-persistenced"))
        s = socket.socket(socket.AF_UNIX)
        s.bind(self.p("var/run/nvidia-persistenced/socket"))
        s.close()
        if mps:
            os.makedirs(self.p("tmp/nvidia-mps"))
