"""--profile untrusted: defaults for running code one does not trust (a
package's install, a model's code, an AI coding agent) on a project in the
current directory (docs/workstation.md).  Each default gives way to an
option the caller spelled out: the profile only fills what was left unsaid.

  -v $PWD:$PWD -w $PWD   the current directory is the one writable host place
  --net none             no network, and no host daemon on an abstract socket
  host sockets           --env-host passes none of HOST_SOCKET_VARS (only -e
                         does); with the host's root as the image, every path
                         socket is hidden or covered in any case (hostroot.py)
"""
import os

from .errors import UsageError
from .spec import Bind

PROFILES = ("untrusted",)
# Variables that name a way to a host daemon: an agent, a bus, a display, a
# container engine, a credential cache.
HOST_SOCKET_VARS = frozenset((
    "SSH_AUTH_SOCK", "SSH_AGENT_PID", "GPG_AGENT_INFO", "DBUS_SESSION_BUS_ADDRESS",
    "DBUS_SYSTEM_BUS_ADDRESS", "DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY",
    "XDG_RUNTIME_DIR", "DOCKER_HOST", "CONTAINER_HOST", "KRB5CCNAME", "PULSE_SERVER",
    "GNOME_KEYRING_CONTROL", "TMUX", "ATSPI_BUS_ADDRESS"))


def parse(value):
    if value not in PROFILES:
        raise UsageError(f"unknown --profile {value!r}", None,
                         f"use {' or '.join(PROFILES)} (docs/workstation.md)")
    return value


def apply(spec, warnings):
    """Fill the profile's defaults into spec (before the plan reads it)."""
    if spec.profile != "untrusted":
        return
    try:
        cwd = os.getcwd()
    except OSError as e:
        raise UsageError("--profile untrusted: the current directory", e.strerror,
                         "cd into the project directory first") from None
    if cwd == "/":
        raise UsageError("--profile untrusted: the current directory is /",
                         "it would be writable in the sandbox, and the whole host with it",
                         "cd into the project directory first: it is the one writable place")
    if spec.net is None:
        spec.net = "none"
    if spec.workdir is None:
        spec.workdir = cwd
    if not any(b.dst == cwd for b in spec.binds):
        spec.binds.insert(0, Bind(cwd, cwd, True))
    if os.geteuid() == 0 and spec.user is None:
        warnings.append("warning: --profile untrusted under root without --user: the command "
                        "is uid 0 and can read every file the sandbox shows; add --user "
                        "UID:GID")
