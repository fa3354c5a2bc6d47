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
    or None when libcuda is absent or does not answer."""
    path = _lib(host, "libcuda")
    if path is None:
        return None
    try:
        res = _helper(_CUDA_CODE, [path])
    except (OSError, ValueError):
        return None
    fields = res.stdout.split()
    if res.returncode != 0 or len(fields) != 2 or fields[0] != "0" or not fields[1].isdigit():
        return None
    v = int(fields[1])
    return (v // 1000, (v % 1000) // 10)


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
        if len(f) == 4 and f[0] in by_uuid and f[1].isdigit() and f[2].isdigit():
            out[(by_uuid[f[0]].minor, int(f[1]), int(f[2]))] = f[3]
    return out
