"""Manifests, indexes and platforms as untrusted JSON.

Shared by every Source (layouts, archives, the registry): a manifest or an
index is parsed here, each field checked for type and bound, and an index is
reduced to the one manifest descriptor for a platform (attestation entries
skipped).  A document that claims to be both a manifest and an index is
refused."""
from . import digest as digestmod
from .digest import ImageError
# Defined in the package: a cached `run` needs them without this module.
from . import format_platform, host_platform  # noqa: F401

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
LAYER_TYPES = (
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
)

MAX_DOC = 4 << 20          # bytes of a manifest, index or config
MAX_LAYERS = 500
MAX_ENTRIES = 4096         # manifests in an index
MAX_BLOB_SIZE = 1 << 40

def parse_platform(text):
    """OS/ARCH[/VARIANT] (--platform) -> dict."""
    parts = text.split("/") if isinstance(text, str) else []
    if len(parts) not in (2, 3) or not all(p and p.isascii() and
                                            all(c.isalnum() or c in "_-." for c in p)
                                            for p in parts):
        raise ImageError(f"invalid --platform {text!r}", "expected OS/ARCH[/VARIANT]",
                         "example: --platform linux/arm64")
    return {"os": parts[0], "architecture": parts[1],
            "variant": parts[2] if len(parts) == 3 else None}


def loads(raw, what):
    if len(raw) > MAX_DOC:
        raise ImageError(f"{what} is too large", f"{len(raw)} bytes (at most {MAX_DOC})")
    import json   # here: `run` of a cached image parses no JSON (runrec.py)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise ImageError(f"{what} is not valid JSON", None) from None
    if not isinstance(doc, dict):
        raise ImageError(f"{what} is not a JSON object", None)
    return doc


def descriptor(d, what, types=None):
    """A checked descriptor dict {mediaType, digest, size, ...}."""
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
    """'index' or 'manifest' of a parsed document; both or neither is refused."""
    mt = doc.get("mediaType", media_type)
    is_index = "manifests" in doc or mt in INDEX_TYPES
    is_manifest = "layers" in doc or "config" in doc or mt in MANIFEST_TYPES
    if is_index == is_manifest:
        raise ImageError("invalid image manifest",
                         "it is both a manifest and an index" if is_index else
                         "neither a manifest nor an index")
    return "index" if is_index else "manifest"


def check_manifest(doc, what="manifest"):
    """The manifest dict, with its config and layer descriptors checked."""
    if doc.get("schemaVersion") != 2:
        raise ImageError(f"{what}: unsupported schemaVersion",
                         repr(doc.get("schemaVersion"))[:40],
                         "only schema 2 (OCI or Docker v2) images are supported")
    mt = doc.get("mediaType")
    if mt is not None and mt not in MANIFEST_TYPES:
        raise ImageError(f"{what}: unsupported media type {str(mt)[:80]!r}", None)
    conf = descriptor(doc.get("config"), f"{what} config", (OCI_CONFIG, DOCKER_CONFIG))
    if conf["size"] > MAX_DOC:
        raise ImageError(f"{what}: the image config is too large",
                         f"{conf['size']} bytes (at most {MAX_DOC})")
    layers = doc.get("layers")
    if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
        raise ImageError(f"{what}: layers is not a list of at most {MAX_LAYERS}", None)
    for d in layers:
        descriptor(d, f"{what} layer", LAYER_TYPES)
    return doc


def _is_attestation(d):
    ann = d.get("annotations")
    if isinstance(ann, dict) and ann.get("vnd.docker.reference.type") == "attestation-manifest":
        return True
    p = d.get("platform")
    return isinstance(p, dict) and p.get("os") == "unknown"


def select(index, platform, what="index"):
    """The manifest descriptor of `index` for `platform` (a dict; variant
    None matches any, the first one listed)."""
    ms = index.get("manifests")
    if not isinstance(ms, list) or len(ms) > MAX_ENTRIES:
        raise ImageError(f"{what}: manifests is not a list of at most {MAX_ENTRIES}", None)
    seen = []
    for d in ms:
        descriptor(d, what)
        if _is_attestation(d):
            continue
        p = d.get("platform")
        if not isinstance(p, dict):
            continue
        seen.append(p)
        if p.get("os") == platform["os"] and \
                p.get("architecture") == platform["architecture"] and \
                (not platform.get("variant") or p.get("variant") in (None, platform["variant"])):
            if d["mediaType"] not in MANIFEST_TYPES:
                raise ImageError(f"{what}: nested index for {format_platform(p)}",
                                 "an index entry must be a manifest")
            return d
    have = ", ".join(sorted({format_platform(p) for p in seen
                             if isinstance(p.get("os"), str)}))[:200] or "none"
    raise ImageError(f"no image for {format_platform(platform)} in the {what}",
                     f"it has: {have}", "choose one with --platform OS/ARCH")
