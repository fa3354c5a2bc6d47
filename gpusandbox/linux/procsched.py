"""Per-process scheduling settings, for the calling process only:
sched_setattr(2), ioprio_set(2), set_mempolicy(2), sched_setaffinity(2).
All are inherited across execve(2), so the command stage sets them on itself
just before it runs the workload."""
import ctypes
import os

from .sys import libc

# Numbers local to this module: glibc (2.36) has no wrapper for any of them.
_NR = {"x86_64": {"sched_setattr": 314, "ioprio_set": 251, "set_mempolicy": 238},
       "aarch64": {"sched_setattr": 274, "ioprio_set": 30, "set_mempolicy": 237}
       }.get(os.uname().machine, {})
_IOPRIO_WHO_PROCESS = 1


class _SchedAttr(ctypes.Structure):
    # struct sched_attr, SCHED_ATTR_SIZE_VER0 (48 bytes): sched_setattr(2).
    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32),
                ("sched_flags", ctypes.c_uint64), ("sched_nice", ctypes.c_int32),
                ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
                ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64)]


def _call(name, *args):
    if name not in _NR:
        raise OSError(38, f"{name}: no syscall number known for {os.uname().machine}")
    res = libc.syscall(ctypes.c_long(_NR[name]), *args)
    if res == -1:
        e = ctypes.get_errno()
        raise OSError(e, f"{name} failed: {os.strerror(e)}")
    return res


def set_scheduler(policy, flags, nice, prio, runtime, deadline, period):
    attr = _SchedAttr(ctypes.sizeof(_SchedAttr), policy, flags, nice, prio, runtime, deadline,
                      period)
    _call("sched_setattr", ctypes.c_int(0), ctypes.byref(attr), ctypes.c_uint(0))


def set_ioprio(value):
    _call("ioprio_set", ctypes.c_int(_IOPRIO_WHO_PROCESS), ctypes.c_int(0), ctypes.c_int(value))


def set_mempolicy(mode, flags, nodes):
    """mode | flags over a node mask of `nodes` (an empty mask for the modes
    that take none; the kernel refuses one they need)."""
    bits = 64
    words = (max(nodes) // bits + 1) if nodes else 1
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        mask[n // bits] |= 1 << (n % bits)
    # maxnode counts bits, and the kernel reads one fewer (set_mempolicy(2)).
    maxnode = words * bits + 1 if nodes else 0
    _call("set_mempolicy", ctypes.c_int(mode | flags),
          mask if nodes else None, ctypes.c_ulong(maxnode))


def set_affinity(cpus):
    os.sched_setaffinity(0, cpus)


def set_personality(domain):
    if libc.personality(ctypes.c_ulong(domain)) == -1:
        e = ctypes.get_errno()
        raise OSError(e, f"personality failed: {os.strerror(e)}")
