"""doctor, the host driver."""
import os

from gpusandbox.errors import GpuError
from gpusandbox.linux import sys as lsys

from .common import FAIL, PASS, WARN, Check, _read


def _driver_version(opts):
    from gpusandbox.gpu.discover import proc_root
    path = os.path.join(proc_root(opts.driver_root), "proc/driver/nvidia/version")
    text = _read(path)
    if text is None:
        return None, path
    for tok in text.split("\n", 1)[0].split():
        parts = tok.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return tok, path
    return "", path


def _lib_versions(driver_root):
    """{version: [library file]} of libcuda/libnvidia-ml in the driver root's ld.so.cache."""
    from gpusandbox.gpu import ldcache
    try:
        with open(os.path.join(driver_root, "etc/ld.so.cache"), "rb") as f:
            entries = ldcache.parse(f.read())
    except (OSError, ldcache.CacheError):
        return {}
    rootfd = os.open(driver_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    out = {}
    try:
        for e in entries:
            if not (e.name.startswith(b"libcuda.so") or e.name.startswith(b"libnvidia-ml.so")):
                continue
            try:
                fd = lsys.openat2(rootfd, os.fsdecode(e.path).lstrip("/"), lsys.O_PATH)
            except OSError:
                continue
            try:
                real = os.readlink(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
            name = os.path.basename(real)
            ver = name.split(".so.", 1)[1] if ".so." in name else ""
            if ver.count(".") >= 1:
                out.setdefault(ver, []).append(name)
    finally:
        os.close(rootfd)
    return out


def check_driver(opts):
    """Returns (checks, host or None, CUDA ceiling or None)."""
    from gpusandbox.gpu import discover
    out = []
    version, vpath = _driver_version(opts)
    if version is None:
        out.append(Check("driver", "kernel module", FAIL, f"{vpath} does not exist: the NVIDIA "
                         "driver is not loaded", "modprobe nvidia (or name the driver's root "
                         "with --driver-root, e.g. /run/nvidia/driver)"))
        return out, None, None
    if not version:
        out.append(Check("driver", "kernel module", FAIL, f"no version in {vpath}",
                         "--driver-root must name a tree with the driver's /proc files"))
        return out, None, None
    out.append(Check("driver", "kernel module", PASS, f"NVIDIA {version}"))
    try:
        host = discover.discover(opts.driver_root, opts.dev_root, environ={})
    except GpuError as e:
        if e.what.startswith("driver libraries"):
            out.append(_lib_mismatch(opts, version, e))
        else:
            out.append(Check("driver", "GPUs", FAIL, e.line(), e.hint or ""))
        return out, None, None
    bad = [g for g in host.gpus if g.node.problem] + \
        [n for k, n in host.control.items() if k == "nvidiactl" and n.problem]
    if bad:
        probs = "; ".join((b.node if hasattr(b, "node") else b).problem for b in bad)
        out.append(Check("driver", "device nodes", FAIL, probs,
                         "nvidia-modprobe -c=<minor> (or reload the driver) to recreate the nodes"))
    else:
        out.append(Check("driver", "device nodes", PASS,
                         f"/dev/nvidiactl and {len(host.gpus)} GPU node(s) with the right numbers"))
    uvm = host.control.get("nvidia-uvm")
    if host.majors.get("nvidia-uvm") is None:
        out.append(Check("driver", "nvidia-uvm", FAIL, "module not loaded: CUDA cannot start "
                         "(utility-only use such as nvidia-smi still works)",
                         "modprobe nvidia-uvm (or nvidia-modprobe -u -c=0)"))
    elif uvm is None or uvm.problem:
        out.append(Check("driver", "nvidia-uvm", FAIL, uvm.problem if uvm else "no node",
                         "nvidia-modprobe -u -c=0 creates /dev/nvidia-uvm"))
    else:
        out.append(Check("driver", "nvidia-uvm", PASS, f"/dev/nvidia-uvm {uvm.major}:0"))
    cuda = next((lib for lib in host.libs if lib.family == "libcuda"), None)
    out.append(Check("driver", "driver libraries", PASS if cuda else FAIL,
                     f"{len(host.libs)} libraries of {host.version}" +
                     ("" if cuda else ", but no libcuda: CUDA cannot start"),
                     "" if cuda else "install the driver's CUDA library (libcuda)"))
    out += check_pieces(host)
    if "persistenced" in host.ipc:
        out.append(Check("driver", "persistenced", PASS, host.ipc["persistenced"][1]))
    else:
        out.append(Check("driver", "persistenced", WARN, "no nvidia-persistenced socket: every "
                         "launch re-initialises the GPUs (slow first CUDA call)",
                         "systemctl enable --now nvidia-persistenced"))
    if host.firmware:
        out.append(Check("driver", "GSP firmware", PASS, f"{len(host.firmware)} file(s) for {host.version}"))
    else:
        fdir = os.path.join(opts.driver_root, "lib/firmware/nvidia")
        others = sorted(os.listdir(fdir)) if os.path.isdir(fdir) else []
        out.append(Check("driver", "GSP firmware", WARN,
                         f"none for {host.version}" + (f" (found: {', '.join(others)})" if others else "")
                         + ": GPUs that boot GSP firmware cannot be used in the sandbox",
                         "reinstall the driver package so lib/firmware/nvidia/"
                         f"{host.version} exists"))
    from gpusandbox.gpu import ceiling
    c = ceiling.driver_cuda_version(host)
    if c:
        out.append(Check("driver", "CUDA ceiling", PASS, f"driver {host.version} supports CUDA up to "
                         f"{c[0]}.{c[1]}"))
    else:
        out.append(Check("driver", "CUDA ceiling", FAIL, "libcuda did not answer cuDriverGetVersion",
                         "check that libcuda matches the loaded module (reinstall the driver)"))
    return out, host, c


# What a capability loses without each piece of gpusandbox.gpu.inject.PIECES.
_EFFECT = {
    "libnvidia-ptxjitcompiler": "CUDA cannot JIT-compile PTX (programs built without code for "
                                "this GPU fail)",
    "libnvidia-ml": "NVML and nvidia-smi do not work in sandboxes",
    "nvidia-smi": "no nvidia-smi in sandboxes",
    "libnvcuvid": "no hardware video decoding (NVDEC)",
    "libnvidia-encode": "no hardware video encoding (NVENC)",
    "libvdpau_nvidia": "no VDPAU video decoding",
    "libGLX_nvidia": "no OpenGL through GLX",
    "libEGL_nvidia": "no EGL (headless OpenGL)",
    "libnvidia-glcore": "OpenGL cannot start",
    "libnvidia-eglcore": "EGL and OpenGL ES cannot start",
    "/dev/nvidia-modeset": "no modesetting node for display",
    "libnvidia-ngx": "no NGX (DLSS)",
}


def check_pieces(host):
    """Every piece of every capability the driver root lacks, each with its
    fix; libcuda and nvidia-uvm have their own checks above."""
    from gpusandbox.gpu import inject
    missing = [m for m in inject.missing_pieces(host, set(inject.PIECES))
               if m.piece != "libcuda"]
    if not missing:
        return [Check("driver", "capabilities", PASS, "every piece of "
                      + ", ".join(inject.PIECES) + " is present")]
    return [Check("driver", f"{m.piece} ({m.cap})", WARN,
                  f"not found: {_EFFECT.get(m.piece, 'part of ' + m.cap + ' is missing')}; "
                  f"launches with '{m.cap}' go on without it, with a warning", m.fix)
            for m in missing]


def gpu_listing(gpus):
    """GPUs as `nvidia-smi -L` names them (host index, model, UUID), each with
    its PCI bus id."""
    return "; ".join(f"GPU {g.index}: {g.model} (UUID: {g.uuid or 'hidden from this user'}), "
                     f"bus {g.bus_id}" for g in gpus)


def _lib_mismatch(opts, version, err):
    found = _lib_versions(opts.driver_root)
    others = sorted(v for v in found if v != version)
    if others:
        return Check("driver", "driver libraries", FAIL,
                     f"the libraries are version {', '.join(others)} but the loaded kernel module "
                     f"is {version} (a driver upgrade without a reboot)",
                     f"reboot, or unload and reload the nvidia modules so that {others[-1]} runs; "
                     f"or reinstall driver {version}")
    return Check("driver", "driver libraries", FAIL, err.line(), err.hint or "")
