"""Builders for OCI layouts, oci-archives and docker-archives, written the
way buildah/skopeo and `docker save` write them, from Python in the test."""
import gzip
import hashlib
import io
import json
import os
import tarfile

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer_tar(files):
    """files: {name: bytes | None (a directory) | ('link', target)}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.mtime = 1700000000
            if data is None:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(ti)
            elif isinstance(data, tuple):
                ti.type, ti.linkname = tarfile.SYMTYPE, data[1]
                tf.addfile(ti)
            else:
                ti.size, ti.mode = len(data), 0o755
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def image_config(diff_ids, arch="amd64", **cfg):
    return json.dumps({"architecture": arch, "os": "linux", "created": "2024-01-01T00:00:00Z",
                       "config": cfg,
                       "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()


def build_image(layers, arch="amd64", gzip_layers=True, **cfg):
    """(manifest bytes, {digest: bytes} of blobs) of an image of `layers`
    (each a files dict or raw tar bytes)."""
    blobs = {}
    descs, diff_ids = [], []
    for files in layers:
        tar = files if isinstance(files, bytes) else layer_tar(files)
        diff_ids.append(sha(tar))
        blob = gzip.compress(tar, mtime=0) if gzip_layers else tar
        blobs[sha(blob)] = blob
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar"
                      + ("+gzip" if gzip_layers else ""), "digest": sha(blob),
                      "size": len(blob)})
    conf = image_config(diff_ids, arch, **cfg)
    blobs[sha(conf)] = conf
    man = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                      "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                 "digest": sha(conf), "size": len(conf)},
                      "layers": descs}).encode()
    blobs[sha(man)] = man
    return man, blobs


def write_layout(path, images):
    """images: [(tag or None, manifest bytes, blobs)] -> an OCI layout dir."""
    os.makedirs(os.path.join(path, "blobs", "sha256"), exist_ok=True)
    with open(os.path.join(path, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    entries = []
    for tag, man, blobs in images:
        for d, data in blobs.items():
            with open(os.path.join(path, "blobs", "sha256", d[7:]), "wb") as f:
                f.write(data)
        e = {"mediaType": OCI_MANIFEST, "digest": sha(man), "size": len(man)}
        if tag:
            e["annotations"] = {"org.opencontainers.image.ref.name": tag}
        entries.append(e)
    with open(os.path.join(path, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}, f)
    return path


def tar_dir(src, dst):
    with tarfile.open(dst, "w") as tf:
        for name in sorted(os.listdir(src)):
            tf.add(os.path.join(src, name), arcname=name)
    return dst


def write_docker_archive(path, images):
    """images: [(repo_tags, layers, cfg)] -> a `docker save` style tar
    (manifest.json, <hex>.json configs, <id>/layer.tar uncompressed)."""
    entries, members = [], {}
    for tags, layers, cfg in images:
        tars = [f if isinstance(f, bytes) else layer_tar(f) for f in layers]
        conf = image_config([sha(t) for t in tars], **cfg)
        members[sha(conf)[7:] + ".json"] = conf
        names = []
        for t in tars:
            n = sha(t)[7:] + "/layer.tar"
            members[n] = t
            names.append(n)
        entries.append({"Config": sha(conf)[7:] + ".json", "RepoTags": tags, "Layers": names})
    members["manifest.json"] = json.dumps(entries).encode()
    with tarfile.open(path, "w") as tf:
        for n, data in members.items():
            ti = tarfile.TarInfo(n)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return path
