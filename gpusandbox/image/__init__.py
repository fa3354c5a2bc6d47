"""Images: references and transports (ref), the registry client (registry,
auth), the shared store (store), secure layer unpacking (unpack), local
archives and layouts (archive), image config -> RunSpec (config), and
squashfs image files (squash, squashfuse: run FILE.sqsh; sqshout: pull -o).

Nothing here is imported by `run` of a plain directory: the launch path
pays for an image module only when IMAGE is an image reference.

This file holds what every image module and a cached `run` need: the
error, the digest check, the reference grammar (digest.py and ref.py
re-export them under their own names), the platform and Entrypoint/Cmd
rules, and the format of a shared store's seal.  The package is loaded whenever
any image module is, so code here costs a cached `run` no module import of
its own (each costs about as much as the lookup itself); the store's read
path (storeread.py) is the only other image module that `run` loads.

Content digests are untrusted input: a digest comes from a manifest, an
index, a registry header or a file name in an archive, all image-controlled,
and is used as a file name in the store, so it must be exactly `sha256:` +
64 lowercase hex digits (or `sha512:` + 128) before anything else looks at
it: `sha256:../x`, a wrong length or upper case are refused, never
normalised.

Image references, as containers-transports(5) spells them:

  docker://[HOST[:PORT]/]REPO[:TAG|@sha256:HEX]   a registry (pulled on a miss)
  oci:DIR[:TAG]                                   an OCI image layout directory
  oci-archive:FILE[:TAG]                          a tar of an OCI image layout
  docker-archive:FILE[:NAME[:TAG]]                `docker save` / `podman save`
  NAME[:TAG|@DIGEST]                              an image already in the store

Docker's short-name rule: a first component without '.' or ':' that is not
`localhost` is part of the repository on docker.io, and a one-component
repository there lives under `library/` (`ubuntu` is
`docker.io/library/ubuntu:latest`).  Everything here is plain string
checking: a reference comes from the command line or from an archive's
manifest.json, and names a file in the store (refs/), so it is validated
exactly, never normalised into something else."""
import os

from ..errors import SandboxError

ALGORITHMS = {"sha256": 64, "sha512": 128}
_HEX = frozenset("0123456789abcdef")


class ImageError(SandboxError):
    """An image, layer, manifest, registry or store failure (exit 125)."""


def parse_digest(text, what="digest"):
    """(algorithm, hex) of a digest string, or ImageError."""
    if not isinstance(text, str):
        raise ImageError(f"invalid {what}", f"not a string: {type(text).__name__}")
    alg, sep, hexpart = text.partition(":")
    want = ALGORITHMS.get(alg)
    if not sep or want is None or len(hexpart) != want or not _HEX.issuperset(hexpart):
        raise ImageError(f"invalid {what} {text[:80]!r}",
                         "expected sha256: followed by 64 lowercase hex digits")
    return alg, hexpart


def validate_digest(text, what="digest"):
    parse_digest(text, what)
    return text


DEFAULT_HOST = "docker.io"
DEFAULT_TAG = "latest"
TRANSPORTS = ("docker", "oci", "oci-archive", "docker-archive")
MAX_REF = 4096

# The distribution spec's grammar (reference/regexp.go), checked by hand:
# `re` alone costs a cached `run` more than the rest of the image lookup.
_LOWER_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_ALNUM = _LOWER_ALNUM | frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_TAG_FIRST = _ALNUM | {"_"}
_TAG_REST = _TAG_FIRST | {".", "-"}
_LABEL = _ALNUM | {"-"}
_IPV6_CHARS = frozenset("0123456789abcdefABCDEF:.")


def _component_ok(c):
    """[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*: alphanumeric runs joined by
    '.', '_', '__' or one or more '-'."""
    if not c or c[0] not in _LOWER_ALNUM or c[-1] not in _LOWER_ALNUM:
        return False
    sep = ""
    for ch in c:
        if ch in _LOWER_ALNUM:
            if sep and sep not in (".", "_", "__") and sep.strip("-"):
                return False
            sep = ""
        else:
            sep += ch
            if ch not in "._-" or len(sep) > 2 and sep.strip("-"):
                return False
    return True


def _tag_ok(t):
    """[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"""
    return 0 < len(t) <= 128 and t[0] in _TAG_FIRST and _TAG_REST.issuperset(t)


def _label_ok(lb):
    """A host label: alphanumerics and '-', not starting or ending with '-'."""
    return bool(lb) and lb[0] in _ALNUM and lb[-1] in _ALNUM and _LABEL.issuperset(lb)


def _ipv6_ok(name):
    """\\[[0-9A-Fa-f:.]+\\]"""
    return len(name) > 2 and name[0] == "[" and name[-1] == "]" and \
        _IPV6_CHARS.issuperset(name[1:-1])


MAX_NAME = 255


class ImageRef:
    __slots__ = ("transport", "host", "repo", "tag", "digest", "path", "short")

    def __init__(self, transport, host=None, repo=None, tag=None, digest=None, path=None,
                 short=None):
        self.transport = transport  # docker | oci | oci-archive | docker-archive | store
        self.host = host
        self.repo = repo
        self.tag = tag
        self.digest = digest
        self.path = path            # the directory or file of a local transport
        # A registry or store name given without a host (`ubuntu`, `nvidia/cuda`):
        # the name as typed, which unqualified-search-registries may resolve
        # (image/registries.py); None for a qualified name.
        self.short = short

    @property
    def name(self):
        """HOST/REPO of a registry or store reference."""
        return f"{self.host}/{self.repo}" if self.repo else None

    def canonical(self):
        """The full reference: the key of refs/ in the store."""
        if self.transport in ("docker", "store"):
            out = self.name
            if self.tag:
                out += ":" + self.tag
            if self.digest:
                out += "@" + self.digest
            return out
        return f"{self.transport}:{self.path}" + (f":{self.tag}" if self.tag else "")

    def __eq__(self, other):
        return isinstance(other, ImageRef) and all(
            getattr(self, s) == getattr(other, s) for s in self.__slots__ if s != "short")

    def __repr__(self):
        return f"ImageRef({self.transport}, {self.canonical()!r})"


def _bad(text, why, hint=None):
    shown = text if len(text) <= 120 else text[:117] + "..."
    raise ImageError(f"invalid image reference {shown!r}", why,
                     hint or "examples: docker://ubuntu:22.04, oci:./layout:v1, "
                     "docker-archive:img.tar, ubuntu:22.04 (already pulled)")


def _host_ok(host):
    name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if not colon:
        name, port = host, None
    elif not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        return False
    if _ipv6_ok(name):
        return True
    labels = name.split(".")
    return len(name) <= 253 and all(_label_ok(lb) for lb in labels)


def parse_name(text, *, default_tag=True):
    """(host, repo, tag, digest) of a docker-style NAME[:TAG][@DIGEST]."""
    if not isinstance(text, str) or not text or len(text) > MAX_REF:
        _bad(str(text)[:120], "empty or too long")
    if not text.isascii() or not text.isprintable() or "\0" in text:
        _bad(text, "it holds non-ASCII or control characters")
    rest, at, dig = text.partition("@")
    if at:
        try:
            validate_digest(dig)
        except ImageError:
            _bad(text, "the digest after '@' must be sha256: and 64 lowercase hex digits")
    tag = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _tag_ok(tag):
            _bad(text, f"bad tag {tag!r}: 1 to 128 of letters, digits, '_', '.', '-' "
                 "(not starting with '.' or '-')")
    parts = rest.split("/")
    first = parts[0]
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost"
                           or first.startswith("[")):
        host, comps = first, parts[1:]
        if not _host_ok(host):
            _bad(text, f"bad registry host {host!r}")
    else:
        host, comps = DEFAULT_HOST, parts
    if host == "index.docker.io":
        host = DEFAULT_HOST
    if host == DEFAULT_HOST and len(comps) == 1:
        comps = ["library"] + comps
    for c in comps:
        if not _component_ok(c):
            why = "uppercase letters are not allowed in a repository name" \
                if c.lower() != c and _component_ok(c.lower()) else \
                f"bad repository component {c!r}: lowercase letters and digits " \
                "separated by '.', '_', '__' or '-'"
            _bad(text, why)
    repo = "/".join(comps)
    if len(host) + 1 + len(repo) > MAX_NAME:
        _bad(text, f"the name is longer than {MAX_NAME} characters")
    if tag is None and not at and default_tag:
        tag = DEFAULT_TAG
    return host, repo, tag, (dig if at else None)


def _path_and_tag(text, transport, body):
    """containers-transports(5) split PATH[:REF] at the first ':'."""
    path, colon, tag = body.partition(":")
    if not path:
        _bad(text, f"{transport}: needs a path")
    if "\0" in path:
        _bad(text, "the path holds a NUL character")
    return path, (tag if colon else None)


def parse_ref(text):
    """An ImageRef for a transport reference or a store name (no 'dir')."""
    if not isinstance(text, str) or not text or len(text) > MAX_REF:
        _bad(str(text)[:120], "empty or too long")
    if "\0" in text:
        _bad(text, "it holds a NUL character")
    if text.startswith("docker://"):
        host, repo, tag, dig = parse_name(text[len("docker://"):])
        return ImageRef("docker", host, repo, tag, dig,
                        short=short_name(text[len("docker://"):]))
    for t in ("oci-archive", "docker-archive", "oci"):
        if text.startswith(t + ":"):
            path, tag = _path_and_tag(text, t, text[len(t) + 1:])
            path = os.path.abspath(path)
            if t == "docker-archive":
                if tag is not None:
                    host, repo, rtag, dig = parse_name(tag)
                    if dig:
                        _bad(text, "docker-archive: selects an image by NAME[:TAG], "
                             "not by digest")
                    tag = f"{host}/{repo}:{rtag}"
                return ImageRef(t, path=path, tag=tag)
            if tag is not None and not _tag_ok(tag):
                _bad(text, f"bad tag {tag!r} after the path",
                     f"{t}:PATH[:TAG]; a path holding ':' cannot be given this way")
            return ImageRef(t, path=path, tag=tag)
    if "://" in text:
        _bad(text, f"unknown transport {text.partition('://')[0]!r}",
             "known: docker://, oci:, oci-archive:, docker-archive:")
    host, repo, tag, dig = parse_name(text)
    return ImageRef("store", host, repo, tag, dig, short=short_name(text))


def short_name(text):
    """The repository path of a name typed without a registry host (as
    typed, without tag or digest), or None for a qualified name."""
    rest = text.partition("@")[0]
    if rest.rfind(":") > rest.rfind("/"):
        rest = rest[:rest.rfind(":")]
    first, slash, _ = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"
                  or first.startswith("[")):
        return None
    return rest


def looks_like_transport(text):
    """True when `text` names a transport (cheap: no parse)."""
    return text.startswith(("docker://", "oci:", "oci-archive:", "docker-archive:"))


def store_name(text):
    """A NAME[:TAG] for the store, or the directory error `run DIR` gives:
    the argument may be a mistyped path as well as a name."""
    from ..errors import UsageError
    if os.path.exists(text):
        raise UsageError(f"image is not a directory: {text}", None,
                         "for an archive say which kind: docker-archive:FILE or "
                         "oci-archive:FILE; a squashfs image must be named FILE.sqsh")
    try:
        return parse_ref(text)
    except ImageError:
        raise UsageError(f"image directory not found: {text}", None,
                         "pass a root filesystem directory, or an image reference such as "
                         "docker://ubuntu:22.04 or oci:DIR") from None


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


# -- platforms and the command (config.py, runrec.py, a cached `run`) -------

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x",
         "armv7l": "arm", "i686": "386", "riscv64": "riscv64"}


def host_platform():
    arch = os.uname().machine
    return {"os": "linux", "architecture": _ARCH.get(arch, arch),
            "variant": "v8" if arch == "aarch64" else None}


def format_platform(p):
    """os/arch[/variant] of a platform dict, as --platform spells it."""
    s = f"{p.get('os')}/{p.get('architecture')}"
    return s + (f"/{p['variant']}" if p.get("variant") else "")


def check_platform(c, want, asked):
    """Refuse an image of another OS or architecture than `want` unless the
    user asked for that platform (--platform); an image that omits them is
    taken as it is."""
    if c.os and c.os != want["os"] or \
            c.architecture and c.architecture != want["architecture"]:
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


# -- the seal of a shared store's tree --------------------------------------
# A tree published into a store other users read is sealed (unpack.py):
# root's or the publisher's, no group or other write bit anywhere.  Its
# `sealed` file (images/<hex>/sealed, layers/<id>/sealed) says so, and lists
# the directories whose owner or mode the seal changed, as the image had
# them, which the sandbox shows again in its own overlay (linux/mounts.py):
#   "gsbx-seal-1" NUL, then per directory: path NUL uid NUL gid NUL mode NUL
# (path relative to the root, "" for the root itself; uid and gid "-" when
# the publisher was not root; mode in octal).  A cached `run` of a site
# store reads it, hence here: the layers' writer and the reader in one place.

SEAL = "sealed"
SEAL_MAGIC = b"gsbx-seal-1\0"
MAX_SEAL = 16 << 20


def dump_seal(dirs):
    """Seal bytes of [(path bytes, uid or None, gid or None, mode)]."""
    out = [SEAL_MAGIC]
    for path, uid, gid, mode in sorted(dirs):
        out.append(b"%s\0%s\0%s\0%o\0" % (path, b"-" if uid is None else b"%d" % uid,
                                           b"-" if gid is None else b"%d" % gid, mode))
    return b"".join(out)


def load_seal(data):
    """((path, uid or None, gid or None, mode), ...) of seal bytes, or None
    when they are not exactly that form (the store is another user's)."""
    if not isinstance(data, bytes) or len(data) > MAX_SEAL or not data.startswith(SEAL_MAGIC):
        return None
    fields = data[len(SEAL_MAGIC):].split(b"\0")
    if fields.pop() != b"" or len(fields) % 4:
        return None
    out = []
    for i in range(0, len(fields), 4):
        path, uid, gid, mode = fields[i:i + 4]
        if path and (len(path) > 4096 or any(c in (b"", b".", b"..") or len(c) > 255
                                             for c in path.split(b"/"))):
            return None
        ids = [None if x == b"-" else int(x) if x.isdigit() and len(x) <= 10 else -1
               for x in (uid, gid)]
        if any(x is not None and not 0 <= x < 0xFFFFFFFF for x in ids) or \
                not (mode.isdigit() and len(mode) <= 4 and b"8" not in mode and b"9" not in mode):
            return None
        out.append((os.fsdecode(path), ids[0], ids[1], int(mode, 8)))
    return tuple(out)
