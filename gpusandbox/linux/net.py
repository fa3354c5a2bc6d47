"""The network of a sandbox with its own network namespace.

A new network namespace holds only a loopback device, down
(network_namespaces(7)).  Bringing it up is two ioctls on any socket
(netdevice(7): SIOCGIFFLAGS, SIOCSIFFLAGS with IFF_UP): no netlink library
is imported, so a root launch, which gets a private namespace by default,
pays nothing for it."""
import ctypes
import os
import struct

from . import sys as k

_AF_INET, _SOCK_DGRAM, _SOCK_CLOEXEC = 2, 2, 0o2000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS = 0x8913, 0x8914
_IFF_UP = 0x1
_IFREQ = 40          # struct ifreq: char ifr_name[16] + a 24-byte union


def loopback_up():
    """Set IFF_UP on `lo` in the caller's network namespace."""
    fd = k.libc.socket(_AF_INET, _SOCK_DGRAM | _SOCK_CLOEXEC, 0)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"socket(AF_INET) failed: {os.strerror(e)}")
    try:
        req = ctypes.create_string_buffer(b"lo", _IFREQ)
        for cmd in (_SIOCGIFFLAGS, _SIOCSIFFLAGS):
            if cmd == _SIOCSIFFLAGS:
                flags = struct.unpack_from("=h", req, 16)[0]
                struct.pack_into("=h", req, 16, flags | _IFF_UP)
            if k.libc.ioctl(fd, cmd, req) < 0:
                e = ctypes.get_errno()
                raise OSError(e, f"ioctl({cmd:#x}) on lo failed: {os.strerror(e)}")
    finally:
        os.close(fd)
