"""Questions only the driver's own libraries can answer, asked in a helper.

The highest CUDA version the driver supports (cuDriverGetVersion) and the
UUIDs of MIG devices (NVML) are not in any file.  Loading libcuda or
libnvidia-ml into the launcher would map a vendor library into a process
that later forks the sandbox, so each question runs in a short-lived helper:
    [sys.executable, -I, -S, -c, CODE, <absolute host library path>, ...]
with env={} and cwd="/", so nothing of the caller's or the image's
environment (LD_PRELOAD, LD_LIBRARY_PATH, PYTHONPATH: CVE-2025-23266) reaches
it, and it loads only host files named by absolute path.
"""
import sys

from gpusandbox.errors import GpuError
from gpusandbox import isdigits

_CUDA_CODE = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
v = ctypes.c_int(0)
rc = lib.cuDriverGetVersion(ctypes.byref(v))
print(rc, v.value)
"""

# argv: libnvidia-ml path, then the UUIDs of the GPUs discovery found.  Prints
# "<gpu uuid> <gi> <ci> <mig uuid>" per MIG device.  Slots without a device
# answer NVML_ERROR_NOT_FOUND and are skipped.
_NVML_CODE = r"""
import ctypes, sys
nvml = ctypes.CDLL(sys.argv[1])
rc = nvml.nvmlInit_v2()
if rc:
    sys.exit("nvmlInit_v2 failed: %d" % rc)
try:
    for gpu_uuid in sys.argv[2:]:
        h = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByUUID(gpu_uuid.encode(), ctypes.byref(h)):
            continue
        count = ctypes.c_uint(7)
        if hasattr(nvml, "nvmlDeviceGetMaxMigDeviceCount"):
            nvml.nvmlDeviceGetMaxMigDeviceCount(h, ctypes.byref(count))
        for i in range(count.value):
            mh = ctypes.c_void_p()
            if nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i, ctypes.byref(mh)):
                continue
            buf = ctypes.create_string_buffer(96)
            gi, ci = ctypes.c_uint(), ctypes.c_uint()
            if (nvml.nvmlDeviceGetUUID(mh, buf, 96)
                    or nvml.nvmlDeviceGetGpuInstanceId(mh, ctypes.byref(gi))
                    or nvml.nvmlDeviceGetComputeInstanceId(mh, ctypes.byref(ci))):
                continue
            print(gpu_uuid, gi.value, ci.value, buf.value.decode())
finally:
    nvml.nvmlShutdown()
"""


def _lib(host, family):
    for lib in host.libs:
        if lib.family == family and lib.bits == 64:
            return lib.host_path
    return None


def _helper(code, args, timeout=20):
    import subprocess
    return subprocess.run([sys.executable, "-I", "-S", "-c", code, *args], env={}, cwd="/",
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, close_fds=True)


def driver_cuda_version(host):
    """(major, minor) of the highest CUDA version the host driver supports,
    or None when libcuda is absent or does not answer.

    The answer depends only on the libcuda file, so it is kept in the user's
    cache keyed by the driver version, the library's path and its identity
    (device, inode, mtime, size): a launch of a CUDA image then starts no
    helper unless the driver changed."""
    path = _lib(host, "libcuda")
    if path is None:
        return None
    key = _cache_key(host, path)
    hit = _cache_get(key)
    if hit is not None:
        return hit
    try:
        res = _helper(_CUDA_CODE, [path])
    except (OSError, ValueError):
        return None
    fields = res.stdout.split()
    if res.returncode != 0 or len(fields) != 2 or fields[0] != "0" or not isdigits(fields[1]) \
            or len(fields[1]) > 9:
        return None
    v = int(fields[1])
    got = (v // 1000, (v % 1000) // 10)
    _cache_put(key, got)
    return got


# --- the per-user cache of driver_cuda_version --------------------------------------
# One small file per key under <XDG_CACHE_HOME or ~/.cache>/gpusandbox/ceiling,
# in a directory only the user can write (the seccomp cache's rules).  Its
# content is read as untrusted data: our own regular file, small, ASCII,
# exactly "<key>\n<major>.<minor>\n" with the current key; anything else means
# "ask the helper".

def _cache_key(host, path):
    import os
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (f"v1 {getattr(host, 'version', None)} {path} {st.st_dev} {st.st_ino} "
           f"{st.st_mtime_ns} {st.st_size}")
    return key if key.isprintable() and key.isascii() and len(key) < 2048 else None


def _cache_file(key, create=False):
    import os
    import zlib
    from gpusandbox.linux import seccomp
    d = os.path.join(os.path.dirname(seccomp.cache_dir()), "ceiling")
    if create and not seccomp._private_dir(d):
        return None
    return os.path.join(d, f"cuda-{zlib.crc32(key.encode()):08x}")


def _cache_get(key):
    import os
    import stat
    if key is None:
        return None
    try:
        fd = os.open(_cache_file(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                or st.st_mode & 0o022 or st.st_size > 4096):
            return None
        data = os.read(fd, 4097)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        lines = data.decode("ascii").split("\n")
    except UnicodeDecodeError:
        return None
    if len(lines) != 3 or lines[0] != key or lines[2] != "":
        return None
    major, dot, minor = lines[1].partition(".")
    if not (dot and isdigits(major) and isdigits(minor) and len(major) <= 3 and len(minor) <= 3):
        return None
    return int(major), int(minor)


def _cache_put(key, value):
    """Write atomically (a temporary file renamed over the entry); a failure
    only costs the next launch a helper."""
    from gpusandbox.linux import fsutil
    entry = _cache_file(key, create=True) if key is not None else None
    if entry is None:
        return
    fsutil.write_atomic(entry, f"{key}\n{value[0]}.{value[1]}\n".encode(), 0o644,
                        best_effort=True)


def mig_uuids(host):
    """{(gpu minor, gi, ci): "MIG-<uuid>"} for every MIG device NVML reports.
    Raises GpuError when NVML cannot be asked."""
    path = _lib(host, "libnvidia-ml")
    if path is None:
        raise GpuError("MIG UUID lookup", "libnvidia-ml is not among the driver libraries",
                       hint="select MIG devices as <gpu>:<gi> instead")
    by_uuid = {g.uuid: g for g in host.gpus if g.uuid}
    try:
        res = _helper(_NVML_CODE, [path, *by_uuid])
    except Exception as e:   # a timeout or an exec failure: both mean "no answer"
        raise GpuError("MIG UUID lookup", f"NVML helper failed: {e}",
                       hint="select MIG devices as <gpu>:<gi> instead") from None
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
        raise GpuError("MIG UUID lookup", f"NVML: {why}",
                       hint="select MIG devices as <gpu>:<gi> instead")
    out = {}
    for line in res.stdout.splitlines():
        f = line.split()
        if len(f) == 4 and f[0] in by_uuid and isdigits(f[1]) and isdigits(f[2]):
            out[(by_uuid[f[0]].minor, int(f[1]), int(f[2]))] = f[3]
    return out
