"""Capabilities of the command, set with capset(2) and prctl(2) directly.

A non-root command ends with every set empty, the bounding set included, so
that even a setuid-root or file-capability binary in the image gains nothing
(no_new_privs blocks the setuid transition, an empty bounding set blocks
file capabilities).  A root command keeps docker's default set minus
CAP_MKNOD: no device nodes may be created in the sandbox (CVE-2021-1056),
and, when it shares the host's network namespace, minus the capabilities
that act on that namespace (HOST_NET_DROPPED).
"""

from . import sys as k

CAP_LAST = 40  # CAP_CHECKPOINT_RESTORE; higher numbers are dropped too when present

# capabilities(7) numbers of docker's default set for a root command.
ROOT_DEFAULT = (
    0,   # CAP_CHOWN
    1,   # CAP_DAC_OVERRIDE
    3,   # CAP_FOWNER
    4,   # CAP_FSETID
    5,   # CAP_KILL
    6,   # CAP_SETGID
    7,   # CAP_SETUID
    8,   # CAP_SETPCAP
    10,  # CAP_NET_BIND_SERVICE
    13,  # CAP_NET_RAW
    18,  # CAP_SYS_CHROOT
    29,  # CAP_AUDIT_WRITE
    31,  # CAP_SETFCAP
)

# Dropped from ROOT_DEFAULT whenever the command shares the host's network
# namespace (--net host, and every rootless --root launch).  Docker can keep
# them because its containers get a private namespace; capabilities act on
# the network namespace the process is in, so here they would act on the
# host's (capabilities(7); a user namespace's root holds them only over
# namespaces that namespace owns, so rootless they are inert but dropped all
# the same, for one rule):
#  - CAP_NET_RAW: AF_PACKET and raw IP sockets on the host's interfaces: sniff
#    every host's traffic on the node, forge packets from the node's
#    addresses (ARP/ND spoofing, the CVE-2020-14386 af_packet class).
#  - CAP_NET_BIND_SERVICE: ports below 1024 on the host's addresses.  Other
#    hosts treat a privileged source port as proof of root on this node
#    (NFS AUTH_SYS with the "secure" export option, the default on HPC
#    clusters; rsh/rlogin), and a command could squat a port a host
#    service (sshd, rpcbind) has not bound yet.
# The rest of docker's set acts on the sandbox's own mount, pid, uts and ipc
# namespaces or on files, never on the network, so it stays: CAP_AUDIT_WRITE
# writes to the audit log whatever the network namespace (audit netlink is
# answered by the kernel for every namespace), CAP_KILL reaches only the
# sandbox's pid namespace.  CAP_NET_ADMIN is not in docker's set at all.
HOST_NET_DROPPED = (
    10,  # CAP_NET_BIND_SERVICE
    13,  # CAP_NET_RAW
)


def root_caps(host_net):
    """The capabilities of a root command (uid 0 inside)."""
    if host_net:
        return tuple(c for c in ROOT_DEFAULT if c not in HOST_NET_DROPPED)
    return ROOT_DEFAULT


class _Hdr(k.Structure):
    _fields_ = [("version", k.c_uint32), ("pid", k.c_int)]


class _Data(k.Structure):
    _fields_ = [("effective", k.c_uint32), ("permitted", k.c_uint32),
                ("inheritable", k.c_uint32)]


_LAST = []


def last_cap():
    """The kernel's highest capability number, read once per process: the
    launcher reads it before the clone (stages/parent.spawn_init), and the
    command stage, a fork of a fork, has it (one kernel, the same value in
    every namespace)."""
    if not _LAST:
        try:
            _LAST.append(int(k.read_file("/proc/sys/kernel/cap_last_cap")))
        except (OSError, ValueError):
            _LAST.append(CAP_LAST)
    return _LAST[0]


def drop_bounding(keep):
    """Drop every capability not in `keep` from the bounding set (needs
    CAP_SETPCAP, so it runs before the uid change)."""
    for cap in range(last_cap() + 1):
        if cap not in keep:
            k.prctl(k.PR_CAPBSET_DROP, cap)


def set_caps(keep):
    """Effective = permitted = keep, inheritable empty, ambient cleared."""
    mask = 0
    for cap in keep:
        mask |= 1 << cap
    hdr = _Hdr(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    data = (_Data * 2)(_Data(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0),
                       _Data(mask >> 32, mask >> 32, 0))
    k.syscall("capset", k.byref(hdr), data)
    k.prctl(k.PR_CAP_AMBIENT, k.PR_CAP_AMBIENT_CLEAR_ALL)


def set_cap_sets(effective, permitted, inheritable, ambient=()):
    """Each set as given (an OCI config's process.capabilities), then the
    ambient capabilities raised one by one (each must be permitted and
    inheritable, prctl(2) PR_CAP_AMBIENT_RAISE)."""
    def mask(caps):
        m = 0
        for cap in caps:
            m |= 1 << cap
        return m
    e, p, i = mask(effective), mask(permitted), mask(inheritable)
    hdr = _Hdr(0x20080522, 0)
    data = (_Data * 2)(_Data(e & 0xFFFFFFFF, p & 0xFFFFFFFF, i & 0xFFFFFFFF),
                       _Data(e >> 32, p >> 32, i >> 32))
    k.syscall("capset", k.byref(hdr), data)
    k.prctl(k.PR_CAP_AMBIENT, k.PR_CAP_AMBIENT_CLEAR_ALL)
    for cap in ambient:
        # The kernel raises only what is permitted and inheritable; runc's
        # own `spec` lists ambient capabilities it leaves out of inheritable,
        # and runc skips those too.
        if cap in permitted and cap in inheritable:
            k.prctl(k.PR_CAP_AMBIENT, 2, cap)   # PR_CAP_AMBIENT_RAISE
