"""The benchmark's images, written as OCI layouts quickly: gzip level 1
layers streamed to disk while both digests are computed, random (so
incompressible) data in a few large files mixed with many small files, as
real images hold; a layer of many empty files for the memory test."""
import hashlib
import os
import tarfile
import zlib

from .registry import OCI_LAYER_GZIP, Layout

SMALL_SHARE = 0.2            # of a data layer's bytes, in small files
SMALL_MAX = 16 << 10         # small files are 1..16 KiB
BIG_FILE = 32 << 20          # large files are up to 32 MiB


class _Random:
    """A file object of `size` random bytes."""

    def __init__(self, size):
        self.left = size

    def read(self, n=-1):
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return os.urandom(n)


class _LayerWriter:
    """The file object tarfile writes to: hashes the tar stream (diff_id),
    gzips it (level 1) into `path` and hashes what it writes (the blob)."""

    def __init__(self, path):
        self.f = open(path, "wb")
        self.raw = hashlib.sha256()
        self.blob = hashlib.sha256()
        self.size = 0
        self.z = zlib.compressobj(1, zlib.DEFLATED, 31)

    def _out(self, data):
        if data:
            self.blob.update(data)
            self.f.write(data)
            self.size += len(data)

    def write(self, data):
        self.raw.update(data)
        self._out(self.z.compress(data))
        return len(data)

    def close(self):
        self._out(self.z.flush())
        self.f.close()
        return "sha256:" + self.blob.hexdigest(), self.size, "sha256:" + self.raw.hexdigest()


def _tarinfo(name, size=0, mode=0o644, typ=tarfile.REGTYPE):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime, ti.type = size, mode, 1700000000, typ
    return ti


def _write_layer(lay, fill):
    """A gzip layer whose members `fill(tar)` adds; returns (descriptor, diff_id)."""
    tmp = lay.path / f"layer.tmp.{os.getpid()}"
    w = _LayerWriter(tmp)
    with tarfile.open(fileobj=w, mode="w|", format=tarfile.GNU_FORMAT,
                      bufsize=1 << 20) as t:
        t.copybufsize = 1 << 20
        fill(t)
    digest, size, diff_id = w.close()
    return lay.blob_file(tmp, digest, size, OCI_LAYER_GZIP), diff_id


def _data(t, top, nbytes):
    """nbytes of random data under `top`/: large files and small ones."""
    t.addfile(_tarinfo(top, typ=tarfile.DIRTYPE, mode=0o755))
    small = int(nbytes * SMALL_SHARE)
    i = 0
    done = 0
    while done < small:
        if i % 500 == 0:
            t.addfile(_tarinfo(f"{top}/s{i // 500:04d}", typ=tarfile.DIRTYPE, mode=0o755))
        n = min(small - done, 1 + int.from_bytes(os.urandom(2), "little") % SMALL_MAX)
        t.addfile(_tarinfo(f"{top}/s{i // 500:04d}/f{i:06d}", n), _Random(n))
        done += n
        i += 1
    big = nbytes - small
    j = 0
    while big > 0:
        n = min(big, BIG_FILE)
        t.addfile(_tarinfo(f"{top}/big{j:04d}.bin", n), _Random(n))
        big -= n
        j += 1
    return i + j


def _tree(t, root):
    """The directory tree `root` as members (the bench's rootfs)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames) + sorted(filenames):
            p = os.path.join(dirpath, name)
            t.add(p, arcname=os.path.relpath(p, root), recursive=False)


def big_images(path, rootfs, total, layers=5):
    """Layout at `path` with "big" (`layers` layers, `total` bytes of data,
    the first layer also holding `rootfs` so it runs /bin/true) and "big2"
    (the same first layers-1 layers and a new last one).  Returns
    {"big": [layer digests], "big2": [...], "files": members written}."""
    lay = Layout(path)
    per = max(1, total // layers)
    descs, diffs, files = [], [], 0
    for k in range(layers):
        def fill(t, k=k):
            nonlocal files
            if k == 0:
                _tree(t, rootfs)
            files += _data(t, f"data{k}", per)
        d, diff = _write_layer(lay, fill)
        descs.append(d)
        diffs.append(diff)
    env = ("PATH=/usr/bin:/bin",)
    m, _, _ = lay.manifest(descs, diffs, env=env, cmd=("/bin/true",))
    lay.tag(m, "big")

    def fill_new(t):
        nonlocal files
        files += _data(t, f"data{layers - 1}b", per)
    d2, diff2 = _write_layer(lay, fill_new)
    m2, _, _ = lay.manifest(descs[:-1] + [d2], diffs[:-1] + [diff2], env=env,
                            cmd=("/bin/true",))
    lay.tag(m2, "big2")
    return {"big": [d["digest"] for d in descs],
            "big2": [d["digest"] for d in descs[:-1]] + [d2["digest"]],
            "layer_bytes": [d["size"] for d in descs] + [d2["size"]], "files": files}


def entries_image(path, entries, per_dir=1000):
    """Layout at `path` with "many": one layer of `entries` members (empty
    files in directories of `per_dir`, the directories counted)."""
    lay = Layout(path)

    def fill(t):
        n = 0
        d = 0
        while n < entries:
            t.addfile(_tarinfo(f"d{d:05d}", typ=tarfile.DIRTYPE, mode=0o755))
            n += 1
            for i in range(min(per_dir, entries - n)):
                t.addfile(_tarinfo(f"d{d:05d}/f{i:04d}"))
                n += 1
            d += 1
    desc, diff = _write_layer(lay, fill)
    m, _, _ = lay.manifest([desc], [diff])
    lay.tag(m, "many")
    return {"layer_bytes": desc["size"]}


def tree_image(path, rootfs, tag, cmd=("/bin/sh",)):
    """Layout at `path` with `tag`: one gzip layer holding the tree `rootfs`."""
    lay = Layout(path)
    desc, diff = _write_layer(lay, lambda t: _tree(t, rootfs))
    m, _, _ = lay.manifest([desc], [diff], env=("PATH=/usr/local/bin:/usr/bin:/bin",),
                           cmd=cmd)
    lay.tag(m, tag)
    return m["digest"]
