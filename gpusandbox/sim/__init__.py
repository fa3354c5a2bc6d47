"""A simulated GPU host: a driver root and a dev root that look real to discovery.

`python -m gpusandbox.sim create DIR --gpus 4` (or `gpusandbox sim ...`) writes
into DIR what a host with the NVIDIA driver shows (docs: /work/shared/GPU-FACTS.md):
the /proc/driver files, /proc/devices, real character devices in DIR/dev (opening
one fails with ENXIO because no driver sits behind major 195, while a cgroup
device filter makes it fail with EPERM), real shared libraries and programs built
from src/*.c, GSP firmware, the persistenced socket, and an ld.so.cache written
by the real ldconfig (`ldconfig -r DIR`, so cache paths are relative to DIR as
they are relative to / on a real host).  Discovery, injection and the tests use
the same code path as for the real driver: only the roots differ.

The libraries find their root from their own location (src/simcommon.c), so
DIR/usr/bin/nvidia-smi and a ctypes load of DIR/usr/lib/x86_64-linux-gnu/
libcuda.so.1 see DIR's GPUs on the host, and the same files mounted into a
sandbox see the sandbox's /proc and /dev.

One module per concern: ids (UUIDs, MIG layout and minors), layout (where
files go in DIR), build (compiling src/), kernel (/proc and /dev), install
(the driver's user-space files), host (create and destroy), cli, and mps (the
MPS stand-in, copied into DIR as a program).
"""
from .host import create, destroy
from .ids import DEFAULT_MODEL, GEFORCE_MODEL, gpu_uuid, mig_minor, mig_uuid, parse_mig
from .layout import CAPS_MAJOR, LIBDIR, NVIDIA_MAJOR, UVM_MAJOR

__all__ = ["create", "destroy", "DEFAULT_MODEL", "GEFORCE_MODEL", "gpu_uuid", "mig_minor",
           "mig_uuid", "parse_mig", "CAPS_MAJOR", "LIBDIR", "NVIDIA_MAJOR", "UVM_MAJOR"]
