"""Local image sources: an OCI image layout directory, a tar of one
(oci-archive), and a `docker save` / `podman save` tar (docker-archive).

Each implements the Source protocol the store pulls from:
    manifest(platform) -> (manifest_digest, manifest dict, raw bytes)
    blob(descriptor, out)   the blob's bytes written to `out`, verified
    close()
Every name read from an archive (index.json, manifest.json, tar member
names) is data: blobs are found by their digest (validated first), files in
a layout through the layout's directory fd without following a symlink,
tar members only as regular files; nothing is ever extracted here."""
import hashlib
import json
import os
import stat
import tarfile

from . import digest as digestmod
from . import manifest as mf
from .digest import ImageError, Verifier
from ..linux import sys as k

CHUNK = 1 << 20
MAX_MEMBERS = 100000
_BENEATH = k.RESOLVE_BENEATH | k.RESOLVE_NO_SYMLINKS | k.RESOLVE_NO_MAGICLINKS
REF_NAME = "org.opencontainers.image.ref.name"


def copy_verified(src, desc, out):
    """Copy exactly desc['size'] bytes of `src` to `out`, checking the digest;
    never reads past the size (one extra byte is asked for to tell a longer
    blob)."""
    v = Verifier(desc["digest"], desc["size"])
    while v.remaining > 0:
        data = src.read(min(CHUNK, v.remaining))
        if not data:
            break
        v.update(data)
        out.write(data)
    if v.remaining == 0 and src.read(1):
        raise ImageError(f"blob {desc['digest']} is larger than its descriptor says",
                         f"more than {desc['size']} bytes")
    v.check()


def _read_doc(f, what, limit=mf.MAX_DOC):
    raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ImageError(f"{what} is too large", f"more than {limit} bytes")
    return raw


def _tags(ms):
    """The tags (ref.name annotations) of an OCI index's entries, sorted."""
    return sorted({d["annotations"][REF_NAME] for d in ms
                   if isinstance(d.get("annotations"), dict)
                   and isinstance(d["annotations"].get(REF_NAME), str)})


def _choose(index, tag, platform, what, load, spelled=None):
    """Manifest (digest, dict, raw) for `tag` (or the only image) in an OCI
    index; `load(desc)` returns a blob's bytes (bounded)."""
    ms = index.get("manifests")
    if not isinstance(ms, list) or len(ms) > mf.MAX_ENTRIES:
        raise ImageError(f"{what}: manifests is not a list", None)
    for d in ms:
        mf.descriptor(d, what)
    if tag is not None:
        found = [d for d in ms if isinstance(d.get("annotations"), dict)
                 and d["annotations"].get(REF_NAME) == tag]
        if not found:
            names = _tags(ms)
            raise ImageError(f"{what}: no image tagged {tag!r}",
                             "tags: " + (", ".join(names)[:200] or "none"), None)
        desc = found[0]
    elif len(ms) == 1:
        desc = ms[0]
    else:
        desc = None
        names = _tags(ms)
        if len(names) > 1:
            # Several images, each its tag (skopeo/umoci copy ...:TAG into
            # one layout): the platform cannot choose between them.
            raise ImageError(f"{what} holds {len(names)} tagged images: name one",
                             "tags: " + ", ".join(names)[:200],
                             f"add :TAG, e.g. {spelled}:{names[0]}" if spelled
                             else "add :TAG")
    for _ in range(3):              # layout index -> image index -> manifest
        if desc is None:
            desc = mf.select(index, platform, what)
        raw = load(desc)
        doc = mf.loads(raw, f"{what} {desc['digest']}")
        if mf.kind(doc, desc["mediaType"]) == "manifest":
            return desc["digest"], mf.check_manifest(doc), raw
        index, desc = doc, None
    raise ImageError(f"{what}: indexes nested too deeply", None)


class OciLayoutSource:
    """An OCI image layout directory (oci:DIR[:TAG])."""

    transport = "oci"

    def __init__(self, path, tag=None):
        self.path, self.tag = path, tag
        try:
            self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise ImageError(f"cannot open OCI layout {path}", e.strerror,
                             "oci:DIR names a directory holding oci-layout and index.json") \
                from None
        try:
            raw = self._read("oci-layout", 4096)
            lay = mf.loads(raw, f"{path}/oci-layout")
            if lay.get("imageLayoutVersion") != "1.0.0":
                raise ImageError(f"{path}: unsupported imageLayoutVersion", None)
            self.index = mf.loads(self._read("index.json", mf.MAX_DOC), f"{path}/index.json")
        except BaseException:
            os.close(self.fd)
            raise

    def _open(self, name):
        """A regular file of the layout, beneath its fd, no symlink followed;
        looked at through O_PATH first, so a FIFO or a device node planted
        there is never opened (no hang, no side effect of open as root)."""
        try:
            pfd = k.openat2(self.fd, name, os.O_PATH | os.O_CLOEXEC, 0, _BENEATH)
        except OSError as e:
            raise ImageError(f"OCI layout {self.path}: cannot open {name}",
                             e.strerror) from None
        try:
            if not stat.S_ISREG(os.fstat(pfd).st_mode):
                raise ImageError(f"OCI layout {self.path}: {name} is not a regular file", None)
            try:
                fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
            except OSError as e:
                # the layout's path, not the /proc/self/fd/N it was reached by
                # (umoci writes index.json 0600: another user cannot read it)
                raise ImageError(f"OCI layout {self.path}: cannot read {name}",
                                 f"{e.strerror}: {os.path.join(self.path, name)}",
                                 "the layout's files must be readable by the user who "
                                 "pulls it" if e.errno in (1, 13) else None) from None
        finally:
            os.close(pfd)
        return os.fdopen(fd, "rb")

    def _read(self, name, limit):
        with self._open(name) as f:
            return _read_doc(f, f"{self.path}/{name}", limit)

    def _blob_name(self, desc):
        alg, hexpart = digestmod.parse(desc["digest"])
        return f"blobs/{alg}/{hexpart}"

    def _load(self, desc):
        if desc["size"] > mf.MAX_DOC:
            raise ImageError(f"manifest {desc['digest']} is too large", None)
        import io
        out = io.BytesIO()
        self.blob(desc, out)
        return out.getvalue()

    def manifest(self, platform):
        return _choose(self.index, self.tag, platform, f"OCI layout {self.path}", self._load,
                       f"{self.transport}:{self.path}")

    def blob(self, desc, out):
        with self._open(self._blob_name(desc)) as f:
            copy_verified(f, desc, out)

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _Tar:
    """Random access to the regular-file members of an uncompressed tar,
    by normalised name ('./a//b' -> 'a/b'); nothing is extracted."""

    def __init__(self, path, what):
        self.what = what
        try:
            self.tf = tarfile.open(path, "r:")
        except (OSError, tarfile.TarError) as e:
            raise ImageError(f"cannot read {what} {path}",
                             getattr(e, "strerror", None) or "not an uncompressed tar file",
                             None) from None
        self.members = {}
        try:
            for n, m in enumerate(self.tf):
                if n >= MAX_MEMBERS:
                    raise ImageError(f"{what} {path} has too many members",
                                     f"more than {MAX_MEMBERS}")
                if m.isreg():
                    name = "/".join(p for p in m.name.split("/") if p not in ("", "."))
                    self.members[name] = m
        except tarfile.TarError as e:
            self.tf.close()
            raise ImageError(f"cannot read {what} {path}", str(e)[:100]) from None
        except BaseException:
            self.tf.close()
            raise

    def open(self, name):
        m = self.members.get(name)
        if m is None:
            raise ImageError(f"{self.what}: no file {name[:100]!r} in the archive", None)
        return self.tf.extractfile(m)

    def read(self, name, limit=mf.MAX_DOC):
        return _read_doc(self.open(name), f"{self.what} {name[:100]}", limit)

    def close(self):
        self.tf.close()


class OciArchiveSource(OciLayoutSource):
    """A tar of an OCI image layout (oci-archive:FILE[:TAG])."""

    transport = "oci-archive"

    def __init__(self, path, tag=None):
        self.path, self.tag, self.fd = path, tag, None
        self.tar = _Tar(path, "oci-archive")
        try:
            lay = mf.loads(self.tar.read("oci-layout", 4096), f"{path}: oci-layout")
            if lay.get("imageLayoutVersion") != "1.0.0":
                raise ImageError(f"{path}: unsupported imageLayoutVersion", None)
            self.index = mf.loads(self.tar.read("index.json"), f"{path}: index.json")
        except BaseException:
            self.tar.close()
            raise

    def blob(self, desc, out):
        copy_verified(self.tar.open(self._blob_name(desc)), desc, out)

    def close(self):
        self.tar.close()


def _sha256_of(f):
    h = hashlib.sha256()
    n = 0
    while True:
        data = f.read(CHUNK)
        if not data:
            return "sha256:" + h.hexdigest(), n
        h.update(data)
        n += len(data)


class DockerArchiveSource:
    """`docker save` / `podman save` output (docker-archive:FILE[:NAME:TAG]).

    manifest.json lists, per image, a config file and layer tars by member
    name, without digests: a Docker schema 2 manifest is synthesised from
    the members' own hashes (their bytes are read once for that), and its
    digest names the image in the store.  The config's diff_ids still check
    every applied layer."""

    def __init__(self, path, ref=None):
        self.path, self.ref = path, ref
        self.tar = _Tar(path, "docker-archive")
        self.by_digest = {}
        try:
            entries = json.loads(self.tar.read("manifest.json"))
        except ImageError:
            self.tar.close()
            raise
        except (ValueError, RecursionError):
            self.tar.close()
            raise ImageError(f"docker-archive {path}: manifest.json is not valid JSON",
                             None) from None
        self.entries = entries
        self.names = []

    def _entry(self):
        what = f"docker-archive {self.path}"
        es = self.entries
        if not isinstance(es, list) or not es or len(es) > mf.MAX_ENTRIES:
            raise ImageError(f"{what}: manifest.json is not a non-empty list", None)
        for e in es:
            if not isinstance(e, dict) or not isinstance(e.get("Config"), str) or \
                    not isinstance(e.get("Layers"), list) or \
                    not all(isinstance(x, str) for x in e["Layers"]) or \
                    not isinstance(e.get("RepoTags") or [], list):
                raise ImageError(f"{what}: manifest.json has a malformed entry", None)
        if self.ref is None:
            if len(es) > 1:
                raise ImageError(f"{what} holds {len(es)} images",
                                 None, "choose one: docker-archive:FILE:NAME:TAG")
            return es[0]
        from . import ref as refmod
        for e in es:
            for t in e.get("RepoTags") or []:
                try:
                    h, r, tag, _ = refmod.parse_name(t) if isinstance(t, str) else (0, 0, 0, 0)
                except ImageError:
                    continue
                if f"{h}/{r}:{tag}" == self.ref:
                    return e
        raise ImageError(f"{what}: no image named {self.ref}", None)

    def _describe(self, member, media_type):
        f = self.tar.open("/".join(p for p in member.split("/") if p not in ("", ".")))
        head = f.read(4)
        f.seek(0)
        if media_type is None:
            media_type = "application/vnd.docker.image.rootfs.diff.tar" + (
                ".gzip" if head[:2] == b"\x1f\x8b" else "")
        dig, size = _sha256_of(f)
        self.by_digest[dig] = member
        return {"mediaType": media_type, "digest": dig, "size": size}

    def manifest(self, platform):
        e = self._entry()
        if len(e["Layers"]) > mf.MAX_LAYERS:
            raise ImageError(f"docker-archive {self.path}: too many layers", None)
        tags = e.get("RepoTags") or []
        self.names = [t for t in tags if isinstance(t, str)]
        doc = {"schemaVersion": 2, "mediaType": mf.DOCKER_MANIFEST,
               "config": self._describe(e["Config"], mf.DOCKER_CONFIG),
               "layers": [self._describe(x, None) for x in e["Layers"]]}
        raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(raw).hexdigest(), doc, raw

    def blob(self, desc, out):
        member = self.by_digest.get(desc["digest"])
        if member is None:
            raise ImageError(f"docker-archive {self.path}: no blob {desc['digest']}", None)
        copy_verified(self.tar.open("/".join(p for p in member.split("/")
                                             if p not in ("", "."))), desc, out)

    def close(self):
        self.tar.close()


def open_local(ref):
    """The Source of a local transport ImageRef."""
    if ref.transport == "oci":
        return OciLayoutSource(ref.path, ref.tag)
    if ref.transport == "oci-archive":
        return OciArchiveSource(ref.path, ref.tag)
    if ref.transport == "docker-archive":
        return DockerArchiveSource(ref.path, ref.tag)
    raise ImageError(f"not a local transport: {ref.transport}", None)
