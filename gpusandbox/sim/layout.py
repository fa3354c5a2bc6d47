"""Where the simulated host puts things in DIR, and how it writes them."""
import os

MARKER = ".gpusandbox-sim"
BUILD = ".sim-build"
LIBDIR = "usr/lib/x86_64-linux-gnu"
LIBDIR32 = "usr/lib/i386-linux-gnu"
NVIDIA_MAJOR = 195
UVM_MAJOR = 508   # dynamic majors are handed out from 511 down (fs/char_dev.c)
CAPS_MAJOR = 511


def write(path, data, mode=0o644):
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        os.fchmod(f.fileno(), mode)


def symlink(target, path):
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    os.symlink(target, path)



def read(path):
    with open(path, "rb") as f:
        return f.read()
