"""The driver's user-space files in DIR: libraries under their SONAMEs,
programs, firmware, vendor files, the persistenced socket and the loader
cache."""
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess

from gpusandbox.errors import GpuError

from . import mps
from .build import with_soname
from .layout import LIBDIR, LIBDIR32, read, symlink, write

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


def _other(version, choices):
    return next(v for v in choices if v != version)


def install(root, info, build, pad):
    ver, cuda = info["lib_version"], info["cuda_version"]
    conf = {"x86_64-linux-gnu": ["# Multiarch support", "/usr/local/lib/x86_64-linux-gnu",
                                 "/lib/x86_64-linux-gnu", "/" + LIBDIR]}
    for libdir, sub in ((LIBDIR, ""), (LIBDIR32, "32")):
        src = os.path.join(build, sub)
        if sub and not os.path.isfile(os.path.join(src, "generic.so")):
            continue
        if sub:
            conf["i386-linux-gnu"] = ["# Multiarch support", "/lib/i386-linux-gnu", "/" + LIBDIR32]
        generic, dst = read(os.path.join(src, "generic.so")), os.path.join(root, libdir)
        for stem, suffix, dev in LIBRARIES:
            soname, fname = f"{stem}.so.{ver if suffix == 'v' else suffix}", f"{stem}.so.{ver}"
            built = {"libcuda": "cuda.so", "libnvidia-ml": "nvml.so"}.get(stem)
            write(os.path.join(dst, fname),
                   read(os.path.join(src, built)) if built else with_soname(generic, soname), 0o755)
            if soname != fname:
                symlink(fname, os.path.join(dst, soname))
            if dev == "y":
                symlink(soname, os.path.join(dst, stem + ".so"))
        # libvdpau's plugin directory, which no ld.so.conf names: discovery
        # finds it by path, as on a real host.
        write(os.path.join(dst, "vdpau", f"libvdpau_nvidia.so.{ver}"),
               with_soname(generic, "libvdpau_nvidia.so.1"), 0o755)
        symlink(f"libvdpau_nvidia.so.{ver}", os.path.join(dst, "vdpau", "libvdpau_nvidia.so.1"))
    # Decoys discovery must reject by version: a leftover NVML of an older driver
    # next to the real one, and a CUDA forward-compat libcuda in the loader cache.
    generic = read(os.path.join(build, "generic.so"))
    old = _other(ver, ("535.183.01", "535.161.08"))
    write(os.path.join(root, LIBDIR, f"libnvidia-ml.so.{old}"),
          with_soname(generic, "libnvidia-ml.so.1"), 0o755)
    compat, new = f"usr/local/cuda-{cuda}/compat", _other(ver, ("560.35.03", "560.28.03"))
    for stem in ("libcuda", "libnvidia-ptxjitcompiler"):
        write(os.path.join(root, compat, f"{stem}.so.{new}"), with_soname(generic, f"{stem}.so.1"), 0o755)
        symlink(f"{stem}.so.{new}", os.path.join(root, compat, f"{stem}.so.1"))
    conf["cuda-compat"] = ["/" + compat]
    for i in range(pad):
        name = f"libgpusandbox-pad{i:05d}.so.1"
        write(os.path.join(root, LIBDIR, "pad", name), with_soname(generic, name), 0o755)
    if pad:
        conf["zz-gpusandbox-pad"] = ["/" + LIBDIR + "/pad"]
    write(os.path.join(root, "etc/ld.so.conf"), "include /etc/ld.so.conf.d/*.conf\n\n")
    for name, lines in conf.items():
        write(os.path.join(root, f"etc/ld.so.conf.d/{name}.conf"), "\n".join(lines) + "\n")

    write(os.path.join(root, "usr/bin/nvidia-smi"), read(os.path.join(build, "smi")), 0o755)
    tool = read(os.path.join(build, "tool"))
    for name in BINARIES:
        write(os.path.join(root, "usr/bin", name), tool, 0o755)
    mps.install(root, write)     # nvidia-cuda-mps-control: the MPS stand-in
    for name in ("gsp_ga10x.bin", "gsp_tu10x.bin"):
        write(os.path.join(root, "lib/firmware/nvidia", info["driver_version"], name),
               hashlib.shake_256(f"{name}:{info['driver_version']}".encode()).digest(8192))
    write(os.path.join(root, "etc/OpenCL/vendors/nvidia.icd"), "libnvidia-opencl.so.1\n")
    write(os.path.join(root, "usr/share/glvnd/egl_vendor.d/10_nvidia.json"), json.dumps(
        {"file_format_version": "1.0.0", "ICD": {"library_path": "libEGL_nvidia.so.0"}}, indent=4) + "\n")
    write(os.path.join(root, "etc/vulkan/icd.d/nvidia_icd.json"), json.dumps(
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


def ldconfig(root):
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


def world_readable(root):
    """Tests run the CLI as an unprivileged user too: every file readable, dirs searchable."""
    for dirpath, _dirs, files in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in files:
            path = os.path.join(dirpath, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode) and (mode & 0o444 != 0o444 or mode & 0o100 and mode & 0o011 != 0o011):
                os.chmod(path, stat.S_IMODE(mode) | 0o444 | (0o111 if mode & 0o100 else 0))
