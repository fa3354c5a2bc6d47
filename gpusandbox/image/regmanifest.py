"""Manifests, indexes and platforms as the registry client checks them.

Untrusted JSON: each field checked for type and bound, an index reduced to
the one manifest descriptor for a platform (attestation and unknown-platform
entries skipped), a document that is both a manifest and an index refused."""
import json
import os

from . import digest as digestmod
from .digest import ImageError

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
ACCEPT = ", ".join(MANIFEST_TYPES + INDEX_TYPES)
CONFIG_TYPES = ("application/vnd.oci.image.config.v1+json",
                "application/vnd.docker.container.image.v1+json")

MAX_DOC = 4 << 20
MAX_LAYERS = 500
MAX_ENTRIES = 4096
MAX_BLOB_SIZE = 1 << 40

_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x",
         "armv7l": "arm", "armv6l": "arm", "i686": "386", "riscv64": "riscv64"}
_VARIANT = {"aarch64": "v8", "armv7l": "v7", "armv6l": "v6"}


def host_platform(machine=None):
    m = machine or os.uname().machine
    return {"os": "linux", "architecture": _ARCH.get(m, m), "variant": _VARIANT.get(m)}


def normalize_platform(p):
    """None (the host's), "OS/ARCH[/VARIANT]" or a dict -> a platform dict."""
    if p is None:
        return host_platform()
    if isinstance(p, dict):
        return {"os": p.get("os"), "architecture": p.get("architecture"),
                "variant": p.get("variant") or None}
    parts = p.split("/") if isinstance(p, str) else []
    if len(parts) not in (2, 3) or not all(
            x and x.isascii() and x[0].isalnum() and all(c.isalnum() or c in "_-." for c in x)
            for x in parts):
        raise ImageError(f"invalid platform {str(p)[:60]!r}", "expected OS/ARCH[/VARIANT]",
                         "example: --platform linux/arm64")
    return {"os": parts[0], "architecture": parts[1],
            "variant": parts[2] if len(parts) == 3 else None}


def format_platform(p):
    s = f"{p.get('os')}/{p.get('architecture')}"
    return s + (f"/{p['variant']}" if p.get("variant") else "")


def loads(raw, what):
    if len(raw) > MAX_DOC:
        raise ImageError(f"{what} is too large", f"{len(raw)} bytes (at most {MAX_DOC})")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise ImageError(f"{what} is not valid JSON", None) from None
    if not isinstance(doc, dict):
        raise ImageError(f"{what} is not a JSON object", None)
    return doc


def descriptor(d, what, types=None):
    if not isinstance(d, dict):
        raise ImageError(f"{what}: a descriptor is not an object", None)
    mt, dig, size = d.get("mediaType"), d.get("digest"), d.get("size")
    if not isinstance(mt, str) or len(mt) > 255:
        raise ImageError(f"{what}: a descriptor has no valid mediaType", None)
    digestmod.validate(dig, f"{what} digest")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_BLOB_SIZE:
        raise ImageError(f"{what}: descriptor {dig} has an invalid size", repr(size)[:40])
    if types is not None and mt not in types:
        raise ImageError(f"{what}: unsupported media type {mt[:80]!r}", None)
    return d


def kind(doc, media_type=None):
    """'index' or 'manifest'; a document that is both (or neither) is refused."""
    if doc.get("schemaVersion") != 2:
        raise ImageError("unsupported manifest schemaVersion",
                         _clean(repr(doc.get("schemaVersion"))),
                         "only schema 2 (OCI or Docker v2) images are supported: "
                         "push the image again with a current docker, podman or skopeo")
    mt = doc.get("mediaType", media_type)
    is_index = "manifests" in doc or mt in INDEX_TYPES
    is_manifest = "layers" in doc or "config" in doc or mt in MANIFEST_TYPES
    if is_index == is_manifest:
        raise ImageError("invalid image manifest",
                         "it is both a manifest and an index" if is_index else
                         "neither a manifest nor an index")
    return "index" if is_index else "manifest"


def check_manifest(doc, what="manifest"):
    if doc.get("schemaVersion") != 2:
        raise ImageError(f"{what}: unsupported schemaVersion", repr(doc.get("schemaVersion"))[:40],
                         "only schema 2 (OCI or Docker v2) images are supported")
    mt = doc.get("mediaType")
    if mt is not None and mt not in MANIFEST_TYPES:
        raise ImageError(f"{what}: unsupported media type {str(mt)[:80]!r}", None)
    descriptor(doc.get("config"), f"{what} config", CONFIG_TYPES)
    layers = doc.get("layers")
    if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
        raise ImageError(f"{what}: layers is not a list of at most {MAX_LAYERS}", None)
    for d in layers:
        descriptor(d, f"{what} layer")
    return doc


def _skipped(d):
    ann = d.get("annotations")
    if isinstance(ann, dict) and ann.get("vnd.docker.reference.type") == "attestation-manifest":
        return True
    p = d.get("platform")
    return not isinstance(p, dict) or p.get("os") in (None, "unknown") or \
        p.get("architecture") in (None, "unknown")


def _variant(p):
    v = p.get("variant") or None
    # arm64 without a variant is v8 (the only one in use).
    return "v8" if v is None and p.get("architecture") == "arm64" else v


def select(index, platform, what="index"):
    """The manifest descriptor of `index` for `platform` (variant None
    matches any: the first listed wins)."""
    ms = index.get("manifests")
    if not isinstance(ms, list) or len(ms) > MAX_ENTRIES:
        raise ImageError(f"{what}: manifests is not a list of at most {MAX_ENTRIES}", None)
    seen = []
    for d in ms:
        descriptor(d, what)
        if _skipped(d):
            continue
        p = d["platform"]
        seen.append(p)
        if p.get("os") == platform["os"] and p.get("architecture") == platform["architecture"] \
                and (not platform.get("variant") or _variant(p) == _variant(platform)):
            if d["mediaType"] not in MANIFEST_TYPES:
                raise ImageError(f"{what}: the entry for {format_platform(p)} is not a manifest",
                                 _clean(d["mediaType"]))
            return d
    have = ", ".join(sorted({_clean(format_platform(p)) for p in seen}))[:200] or "none"
    raise ImageError(f"no image for {format_platform(platform)} in the {what}",
                     f"it has: {have}", "choose one with --platform OS/ARCH[/VARIANT]")


def _clean(s):
    return "".join(c if c.isprintable() else "?" for c in str(s))[:80]
