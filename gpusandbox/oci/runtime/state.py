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
import os

from ...errors import SandboxError
from .. import fastjson as json

# Removed first on delete: the shell entry answers from it, else falls back.
FILES = ("state.fast", "exec.fifo", "state.json")
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
            st = json.loads(f.read())
    except (OSError, ValueError):
        raise NotFound(f"container \"{cid}\" does not exist") from None
    st["_dir"] = d
    return st


def _write(d, name, data):
    # Renamed into place, so a reader sees the old or the new file whole.
    # No fsync: the state names live processes, which a crash of the
    # machine (the only thing that loses unsynced data) ends too.
    tmp = os.path.join(d, f".{name}.{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(data)
    os.rename(tmp, os.path.join(d, name))


def save(st):
    d = st["_dir"]
    _write(d, "state.json", json.dumps({k: v for k, v in st.items() if not k.startswith("_")}))
    fast = _fast(st)
    if fast is not None:
        _write(d, "state.fast", fast)


_S, _P, _MID = "\x00status\x00", "\x00pid\x00", ', "pid": '


def _fast(st):
    """state.fast, which bin/gpusandbox-oci answers `state` from without
    Python: a magic line, pid, start time and cgroup leaf, then the public
    object as one ASCII JSON line split around its status and pid (the only
    values that change), then `plain` where `start` and `delete` of a
    stopped container are no more than the entry does (no poststart or
    poststop hook, no cgroup or a cgroup2 leaf), else `python`.  None (no
    file: the entry falls back to Python) where a line would not survive
    the shell's `read`."""
    pid, start, leaf = st.get("pid") or 0, st.get("start_time"), st.get("cgroup") or ""
    if not isinstance(pid, int) or pid <= 0 or not isinstance(start, int) \
            or not isinstance(leaf, str) or not leaf.isascii() or "\n" in leaf:
        return None
    obj = public(st)
    obj["status"], obj["pid"] = _S, _P
    text = json.dumps(obj)    # ensure_ascii: no newline, no NUL in the line
    s, p = json.dumps(_S), json.dumps(_P)
    # ociVersion and the checked id precede status: its first match is it.
    i = text.index(s)
    j = i + len(s)
    if text[j:j + len(_MID) + len(p)] != _MID + p:
        return None
    head, tail = text[:i] + '"', text[j + len(_MID) + len(p):]
    hooks = st.get("hooks") or {}
    plain = not hooks.get("poststart") and not hooks.get("poststop") \
        and (not leaf or st.get("cgroup_version") == 2)
    return (f"gsbx-state-fast 1\n{pid}\n{start}\n{leaf}\n{head}\n{tail}\n"
            f"{'plain' if plain else 'python'}\n")


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
