"""An image config (OCI / Docker v2) as untrusted data, and its application
to a RunSpec as docker applies it:

  Env         row 3 of the environment table (README "Environment"), in
              place of a bundle's process.env or /etc/environment
  Entrypoint  + Cmd: the command; a CMD given on the command line replaces
              Cmd; --entrypoint replaces Entrypoint and drops Cmd
  WorkingDir  the default -w (normalised as a container path)
  User        honoured where the sandbox represents it (real root in the
              host user namespace: a numeric or /etc/passwd-resolved
              uid:gid); otherwise the command runs as the caller, with a note

The image's NVIDIA_VISIBLE_DEVICES and NVIDIA_DRIVER_CAPABILITIES are plain
rows of the table: GPU selection reads only the caller's environment
(plandev._gpu), so they never widen it."""
from . import digest as digestmod
from . import manifest as mf
from .digest import ImageError
from .. import number
# Defined in the package: `run` of a cached image imports neither this module nor manifest.py.
from . import check_platform, command  # noqa: F401

MAX_ITEMS = 4096
MAX_STR = 1 << 16


def _bad(field, why):
    return ImageError(f"invalid image config: {field}", why,
                      "the image was built wrong or tampered with; rebuild or re-pull it")


def _str(v, field, allow_empty=True):
    if not isinstance(v, str):
        raise _bad(field, f"not a string but {type(v).__name__}")
    if "\0" in v:
        raise _bad(field, "it holds a NUL character")
    if len(v) > MAX_STR:
        raise _bad(field, f"longer than {MAX_STR} characters")
    if not allow_empty and not v:
        raise _bad(field, "empty")
    return v


def _strlist(v, field):
    if v is None:
        return None
    if not isinstance(v, list) or len(v) > MAX_ITEMS:
        raise _bad(field, f"not a list of at most {MAX_ITEMS} strings")
    return [_str(x, field) for x in v]


class ImageConfig:
    __slots__ = ("os", "architecture", "variant", "env", "entrypoint", "cmd", "workdir",
                 "user", "labels", "diff_ids", "created")

    def platform(self):
        return {"os": self.os, "architecture": self.architecture, "variant": self.variant}


def parse(raw):
    """ImageConfig of config blob bytes; every field type- and size-checked."""
    doc = mf.loads(raw, "image config")
    c = ImageConfig()
    c.os = _str(doc.get("os", ""), "os")
    c.architecture = _str(doc.get("architecture", ""), "architecture")
    c.variant = _str(doc["variant"], "variant") if doc.get("variant") is not None else None
    created = doc.get("created")
    c.created = _str(created, "created")[:64] if created is not None else None
    cfg = doc.get("config")
    cfg = {} if cfg is None else cfg
    if not isinstance(cfg, dict):
        raise _bad("config", "not an object")
    env = _strlist(cfg.get("Env"), "Env") or []
    c.env = []
    for item in env:
        key, eq, val = item.partition("=")
        if not eq or not key or not all(ch.isascii() and (ch.isalnum() or ch == "_")
                                        for ch in key):
            raise _bad("Env", f"entry {item[:60]!r} is not KEY=VALUE")
        c.env.append((key, val))
    c.entrypoint = _strlist(cfg.get("Entrypoint"), "Entrypoint")
    c.cmd = _strlist(cfg.get("Cmd"), "Cmd")
    wd = cfg.get("WorkingDir")
    c.workdir = None
    if wd is not None and _str(wd, "WorkingDir"):
        if not wd.startswith("/"):
            # docker resolves a relative WorkingDir against /.
            wd = "/" + wd
        from ..imageroot import container_path
        c.workdir = container_path(wd)
    user = cfg.get("User")
    c.user = (_str(user, "User")[:256] or None) if user is not None else None
    labels = cfg.get("Labels")
    c.labels = {}
    if labels is not None:
        if not isinstance(labels, dict) or len(labels) > MAX_ITEMS:
            raise _bad("Labels", "not an object of strings")
        for key, val in labels.items():
            c.labels[_str(key, "Labels")] = _str(val, "Labels")
    rootfs = doc.get("rootfs")
    if not isinstance(rootfs, dict) or rootfs.get("type") != "layers":
        raise _bad("rootfs", "missing, or its type is not 'layers'")
    ids = rootfs.get("diff_ids")
    if not isinstance(ids, list) or len(ids) > mf.MAX_LAYERS:
        raise _bad("rootfs.diff_ids", "not a list")
    c.diff_ids = [digestmod.validate(d, "diff_id") for d in ids]
    return c


def resolve_user(c, rootfd, read):
    """(uid, gid) of the image's User: numeric UID[:GID], or a name looked up
    in the image's /etc/passwd (and a group in /etc/group) read through
    `read(path, limit)` (bounded, in the image root)."""
    name, _, group = c.user.partition(":")
    uid = number(name)
    gid = None
    if uid is None:
        entry = _lookup(read("/etc/passwd", 4 << 20), name, 7)
        if entry is None:
            raise ImageError(f"the image's User {c.user[:60]!r} is not in its /etc/passwd",
                             None, "pass --user UID:GID")
        uid, gid = number(entry[2]), number(entry[3])
        if uid is None or gid is None:
            raise _bad("User", f"/etc/passwd entry of {name[:60]!r} has no numeric ids")
    if group:
        gid = number(group)
        if gid is None:
            entry = _lookup(read("/etc/group", 4 << 20), group, 4)
            gid = number(entry[2]) if entry else None
            if gid is None:
                raise ImageError(f"the image's User {c.user[:60]!r}: no group {group[:60]!r} "
                                 "in its /etc/group", None, "pass --user UID:GID")
    elif gid is None:
        gid = uid
    if uid > 0xFFFFFFFE or gid > 0xFFFFFFFE:
        raise _bad("User", "uid or gid out of range")
    return uid, gid


def _lookup(data, name, nfields):
    if not data:
        return None
    for line in data.decode("utf-8", "replace").splitlines():
        f = line.split(":")
        if len(f) >= nfields and f[0] == name:
            return f
    return None
