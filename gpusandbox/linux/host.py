"""Facts about the caller as the host sees it: its uid outside any user
namespace it runs in, and whether it is real root (the initial user
namespace's uid 0).

Rootless podman and docker run hooks and runtimes as uid 0 of a user
namespace: the euid says root, the host says the user.  Every part that
names a per-user place or picks a privileged path asks here.

Light on purpose: the OCI fast paths import this before anything else
(os only).
"""
import os

INITIAL_UID_MAP = [["0", "0", "4294967295"]]


def uid_map(proc="/proc"):
    """/proc/self/uid_map as rows of strings; [] when unreadable."""
    try:
        with open(f"{proc}/self/uid_map", "rb") as f:
            return [ln.split() for ln in f.read().decode().splitlines() if ln.strip()]
    except OSError:
        return []


def initial_userns(proc="/proc"):
    """Whether the caller runs in the initial user namespace (its map is the
    identity over all ids)."""
    return uid_map(proc) == INITIAL_UID_MAP


def real_root():
    """uid 0 in the initial user namespace: root of the host, not of a
    user namespace."""
    return os.geteuid() == 0 and initial_userns()


def host_uid():
    """The caller's effective uid as the initial user namespace sees it."""
    uid = os.geteuid()
    for row in uid_map():
        try:
            inside, outside, count = (int(x) for x in row)
        except ValueError:
            continue
        if inside <= uid < inside + count:
            return outside + uid - inside
    return uid
