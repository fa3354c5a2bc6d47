"""The runtime's state directory: ROOT/ID/{state.json, exec.fifo}.

ROOT does not depend on the environment (podman calls `state ID` with no
flags and an almost empty one): /run/gpusandbox-oci for real root, else
/run/user/<host uid>/gpusandbox-oci, where <host uid> is the caller's uid
outside every user namespace (rootless podman runs the runtime as uid 0 of
its own namespace), with $XDG_RUNTIME_DIR as the fallback when that
directory does not exist.  --root overrides it.

The container's init is named by its pid and its start time (field 22 of
/proc/PID/stat): a recycled pid never passes for the container.
"""
import json
import os

from ...errors import SandboxError

_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+-")


class NotFound(SandboxError):
    pass


def host_uid():
    """The caller's uid as the initial user namespace sees it."""
    uid = os.geteuid()
    try:
        with open("/proc/self/uid_map") as f:
            for line in f:
                inside, outside, count = (int(x) for x in line.split())
                if inside <= uid < inside + count:
                    return outside + uid - inside
    except (OSError, ValueError):
        pass
    return uid


def default_root():
    uid = host_uid()
    if uid == 0:
        return "/run/gpusandbox-oci"
    run = f"/run/user/{uid}"
    if os.path.isdir(run):
        return run + "/gpusandbox-oci"
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and xdg.startswith("/"):
        return xdg + "/gpusandbox-oci"
    raise SandboxError(f"no state directory for uid {uid}", f"{run} does not exist",
                       "pass --root DIR or set XDG_RUNTIME_DIR")


def check_id(cid):
    if not cid or len(cid) > 1024 or not cid[0].isascii() or not cid[0].isalnum() \
            or not set(cid) <= _ID_CHARS:
        raise SandboxError(f"invalid container id {cid!r}", None,
                           "ids are letters, digits and _ . + - (not starting with one of those)")
    return cid


def container_dir(root, cid):
    return os.path.join(root, check_id(cid))


def start_time(pid):
    """Field 22 of /proc/PID/stat, or None when the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    return int(rest[19]), rest[0].decode()


def load(root, cid):
    d = container_dir(root, cid)
    try:
        with open(os.path.join(d, "state.json")) as f:
            st = json.load(f)
    except (OSError, ValueError):
        raise NotFound(f"container \"{cid}\" does not exist") from None
    st["_dir"] = d
    return st


def save(st):
    d = st["_dir"]
    data = json.dumps({k: v for k, v in st.items() if not k.startswith("_")})
    tmp = os.path.join(d, f".state.json.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(d, "state.json"))


def alive(st):
    """Whether the recorded init still runs (and is not a zombie)."""
    pid = st.get("pid") or 0
    got = start_time(pid) if pid > 0 else None
    return got is not None and got[0] == st.get("start_time") and got[1] not in ("Z", "X")


def status(st):
    if not alive(st):
        return "stopped"
    if os.path.exists(os.path.join(st["_dir"], "exec.fifo")):
        return "created"
    if st.get("cgroup") and _frozen(st["cgroup"]):
        return "paused"
    return "running"


def _frozen(leaf):
    try:
        with open(os.path.join(leaf, "cgroup.freeze")) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def public(st):
    """The OCI state object (runtime-spec runtime.md)."""
    s = status(st)
    return {"ociVersion": "1.0.2", "id": st["id"], "status": s,
            "pid": st["pid"] if s != "stopped" else 0, "bundle": st["bundle"],
            "rootfs": st.get("rootfs", ""), "created": st.get("created", ""),
            "owner": "", "annotations": st.get("annotations") or {}}
