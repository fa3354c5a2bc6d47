"""The kernel layer: ctypes calls (sys), the caller's host facts and
namespaces (host), mounts, id maps, capabilities, cgroups and their reaper,
the BPF device filter, seccomp.

This file holds the one table of namespace types, which both host.py (os
only, for the OCI fast paths) and sys.py (the ctypes layer) name: the
package is loaded whenever any of its modules is, so the table costs a
launch no module import of its own, and neither module imports the other
at load time (host.join_ns loads sys when it is called)."""

# Every namespace type: (OCI linux.namespaces type, name under /proc/PID/ns,
# CLONE_NEW* flag), in the order they are joined: the user namespace first
# (it grants the capabilities the other joins need), pid after ipc, uts and
# net (it only applies to children), the mount namespace last (it changes
# root and cwd).
NAMESPACES = (
    ("user", "user", 0x10000000),
    ("ipc", "ipc", 0x08000000),
    ("uts", "uts", 0x04000000),
    ("network", "net", 0x40000000),
    ("pid", "pid", 0x20000000),
    ("cgroup", "cgroup", 0x02000000),
    ("mount", "mnt", 0x00020000),
)
NS_FLAGS = {t: flag for t, _, flag in NAMESPACES}
NS_PROC = {t: name for t, name, _ in NAMESPACES}
NS_RANK = {t: i for i, (t, _, _) in enumerate(NAMESPACES)}
CLONE_NEWUSER, CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWCGROUP, \
    CLONE_NEWNS = (flag for _, _, flag in NAMESPACES)
