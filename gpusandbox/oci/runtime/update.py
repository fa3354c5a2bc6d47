"""`update [flags] [-r FILE | -r -] ID`: runc's command, new limits for a
running (or created, or paused) container's cgroups.

-r/--resources reads an OCI resources object (config.json's
linux.resources: what `podman update` sends on stdin); each flag then
overrides its field.  The values go through linux/cgroupres.Limits, as at
`create`, and linux/cgroupupdate.update writes them to the container's v1
leaves or its cgroup2 leaf.  Exit 0 when every setting was applied; a bad
value is a usage error (exit 1, one line naming the flag or field); a
setting the container's cgroups cannot take fails with exit 1 too.
"""
import sys

from ...errors import SandboxError, UsageError
from .args import _one, _split

# runc's flag -> the Limits field it sets (--cpu-share: runc's own spelling;
# --cpu-shares: docker's and crun's).
FLAGS = {"--memory": "memory", "--memory-swap": "memory_swap",
         "--memory-reservation": "memory_reservation", "--pids-limit": "pids",
         "--cpu-shares": "cpu_shares", "--cpu-share": "cpu_shares",
         "--cpu-quota": "cpu_quota", "--cpu-period": "cpu_period",
         "--cpuset-cpus": "cpuset_cpus", "--cpuset-mems": "cpuset_mems",
         "--blkio-weight": "blkio_weight"}
# runc's flags for what gpusandbox has no counterpart of: refused by name.
UNSUPPORTED = {"--kernel-memory", "--kernel-memory-tcp", "--cpu-rt-period", "--cpu-rt-runtime",
               "--l3-cache-schema", "--mem-bw-schema", "--cpu-idle"}
MAX_RESOURCES = 1 << 20


def main_update(root, rest):
    opts, pos = _split(rest, set(FLAGS) | UNSUPPORTED | {"-r", "--resources"}, set())
    if len(pos) != 1:
        raise UsageError("update: needs exactly one container id",
                         hint="gpusandbox-oci update [--memory N ...] [-r FILE|-] ID")
    cid = pos[0]
    for flag in UNSUPPORTED:
        if _one(opts, flag) is not None:
            raise UsageError(f"update {flag}: not supported by gpusandbox",
                             hint="drop the flag; see docs/oci.md for the supported ones")
    from ...linux import cgroupres
    src = _one(opts, "-r") or _one(opts, "--resources")
    limits = cgroupres.Limits()
    if src is not None:
        limits = cgroupres.from_oci(_read_resources(src), "resources")
    for flag, field in FLAGS.items():
        val = _one(opts, flag)
        if val is not None:
            if val == "":
                raise UsageError(f"update {flag}: empty value", hint=f"give {flag} VALUE")
            setattr(limits, field, val)
    from . import state
    st = state.load(root, cid)
    if not state.alive(st):
        raise SandboxError(f"update {cid}: the container is not running", None,
                           "start it first; a stopped container has no cgroup to change")
    if limits.empty():
        return 0
    if not st.get("cgroup") and not st.get("cgroup_v1"):
        raise SandboxError(f"update {cid}: the container has no cgroup", None,
                           "create the container as root or in a delegated cgroup")
    from ...linux import cgroupupdate
    leaves = list(st.get("cgroup_v1") or ())

    def record(leaf):
        # Kept in the state before it exists: `delete` removes it whatever
        # happens after.
        leaves.append(leaf)
        st["cgroup_v1"] = leaves
        state.save(st)

    cgroupupdate.update(st.get("cgroup"), st.get("cgroup_version"), leaves, limits,
                        pid=st.get("pid"), record=record)
    return 0


def _read_resources(src):
    """The JSON object of -r FILE (or '-': stdin), size-bounded."""
    import json
    try:
        if src == "-":
            data = sys.stdin.buffer.read(MAX_RESOURCES + 1)
        else:
            with open(src, "rb") as f:
                data = f.read(MAX_RESOURCES + 1)
    except OSError as e:
        raise UsageError(f"update --resources {src}: {e.strerror}",
                         hint="give a readable JSON file, or - for stdin") from None
    if len(data) > MAX_RESOURCES:
        raise UsageError(f"update --resources {src}: larger than {MAX_RESOURCES} bytes",
                         hint="give the linux.resources object alone")
    try:
        return json.loads(data)
    except ValueError as e:
        raise UsageError(f"update --resources {src}: not JSON ({e})",
                         hint="give the linux.resources object of an OCI config") from None
