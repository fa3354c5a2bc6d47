"""Cheap reads for `run` of a cached image.

images/<hex>/run.rec: what `run` of a store image needs from its config
(config digest, platform, Entrypoint, Cmd, User, Env, WorkingDir), written
by the pull from the checked ImageConfig and read back without the json
module (which, with the `re` it imports, cost a cached `run` more than the
rest of the launch's image handling).  The platform check and the
Entrypoint/Cmd rule live here too (config.py and manifest.py re-export
them): a cached `run` imports neither of those modules.

The format is NUL-separated text fields (a config string never holds NUL:
config.parse refuses one), ending in NUL:

  gsbx-run-1 CONFIG-DIGEST OPT(os) OPT(arch) OPT(variant) OPT(user)
  OPT(workdir) LIST(entrypoint) LIST(cmd) LIST(env KEY=VALUE)

OPT is '-' for none or '=' + the string; LIST is '-' for none or a decimal
count followed by that many fields.  The file is still data read back from
disk (a site store is another user's): the read is bounded, the layout
exact and every field checked again as config.parse checks it; anything
else returns None, and the caller falls back to parsing the config blob."""
from . import digest as digestmod
from .digest import ImageError

MAGIC = "gsbx-run-1"
NAME = "run.rec"
MAX_FILE = 8 << 20          # a config is at most 4 MiB (manifest.MAX_DOC)
MAX_ITEMS = 4096            # as config.MAX_ITEMS
MAX_STR = 1 << 16           # as config.MAX_STR


_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x",
         "armv7l": "arm", "i686": "386", "riscv64": "riscv64"}


def host_platform():
    import os
    arch = os.uname().machine
    return {"os": "linux", "architecture": _ARCH.get(arch, arch),
            "variant": "v8" if arch == "aarch64" else None}


def check_platform(c, want, asked):
    """Refuse an image of another OS or architecture than `want` unless the
    user asked for that platform (--platform); an image that omits them is
    taken as it is."""
    if c.os and c.os != want["os"] or \
            c.architecture and c.architecture != want["architecture"]:
        from .manifest import format_platform
        got = format_platform(c.platform())
        if asked:
            raise ImageError(f"the image is for {got}, not the {format_platform(want)} "
                             "asked for with --platform", None)
        raise ImageError(f"the image is for {got}; this host runs "
                         f"{format_platform(want)}", None,
                         f"to run it anyway (emulated), pass --platform {got}")


def command(c, argv, entrypoint):
    """argv of the run: docker's Entrypoint/Cmd rules.  `entrypoint` is the
    --entrypoint value (None when not given; '' clears it)."""
    if entrypoint is not None:
        ep = [entrypoint] if entrypoint else []
        return ep + list(argv)
    ep = c.entrypoint or []
    return ep + (list(argv) if argv else (c.cmd or []))


class RunConfig:
    """The fields of an ImageConfig that `run` uses (config.command,
    config.check_platform, config.resolve_user accept it)."""
    __slots__ = ("config", "os", "architecture", "variant", "user", "workdir",
                 "entrypoint", "cmd", "env")

    def platform(self):
        return {"os": self.os, "architecture": self.architecture, "variant": self.variant}


def dump(config_digest, conf):
    """The record bytes of a parsed ImageConfig."""
    def opt(v):
        return ["-"] if v is None else ["=" + v]

    def lst(v):
        return ["-"] if v is None else [str(len(v))] + list(v)
    fields = [MAGIC, digestmod.validate(config_digest)] + opt(conf.os) + \
        opt(conf.architecture) + opt(conf.variant) + opt(conf.user) + opt(conf.workdir) + \
        lst(conf.entrypoint) + lst(conf.cmd) + lst([f"{k}={v}" for k, v in conf.env])
    if any("\0" in f for f in fields):
        raise ImageError("invalid image config", "a field holds a NUL character")
    return ("\0".join(fields) + "\0").encode()


def load(data):
    """A RunConfig of record bytes, or None when they are not exactly a
    record this module writes."""
    if not isinstance(data, bytes) or len(data) > MAX_FILE or not data.endswith(b"\0"):
        return None
    try:
        fields = data[:-1].decode("utf-8").split("\0")
    except UnicodeDecodeError:
        return None
    it = iter(fields)
    try:
        if next(it) != MAGIC:
            return None
        r = RunConfig()
        r.config = digestmod.validate(next(it))
        r.os, r.architecture, r.variant, r.user, r.workdir = (_opt(it) for _ in range(5))
        r.entrypoint, r.cmd, env = _list(it), _list(it), _list(it)
        if next(it, None) is not None or r.os is None or r.architecture is None \
                or env is None:
            return None
    except (StopIteration, ValueError, ImageError):
        return None
    if r.user is not None and (not r.user or len(r.user) > 256):
        return None
    if r.workdir is not None:
        from ..imageroot import container_path
        if not r.workdir.startswith("/") or container_path(r.workdir) != r.workdir:
            return None
    r.env = []
    for item in env:
        key, eq, val = item.partition("=")
        if not eq or not key or not all(ch.isascii() and (ch.isalnum() or ch == "_")
                                        for ch in key):
            return None
        r.env.append((key, val))
    return r


def _opt(it):
    f = next(it)
    if f == "-":
        return None
    if not f.startswith("=") or len(f) > MAX_STR + 1:
        raise ValueError(f)
    return f[1:]


def _list(it):
    f = next(it)
    if f == "-":
        return None
    if not (f.isascii() and f.isdigit() and len(f) <= 5) or int(f) > MAX_ITEMS:
        raise ValueError(f)
    out = [next(it) for _ in range(int(f))]
    if any(len(x) > MAX_STR for x in out):
        raise ValueError("too long")
    return out


def ref_fast(data, name):
    """The ref record set_ref writes, read without the json module when its
    bytes are exactly what json.dumps gives for a name of plain printable
    ASCII (every validated reference is): {"name": "N", "digest": "D"}.
    None means "not that exact form": the caller parses it as JSON."""
    if not name.isascii() or not name.isprintable() or '"' in name or "\\" in name:
        return None
    head = b'{"name": "' + name.encode() + b'", "digest": "'
    if not data.startswith(head) or not data.endswith(b'"}'):
        return None
    dig = data[len(head):-2]
    if not dig.isascii() or b'"' in dig or b"\\" in dig:
        return None
    return {"name": name, "digest": dig.decode()}
