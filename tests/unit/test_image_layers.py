"""Per-layer unpacking and the hard-link merge (image/layers.py): for layer
stacks with whiteouts, opaque directories, type changes, implied parents and
hard links, the merged tree equals the tree the layers give applied in order
onto one directory (unpack.apply_layer, the OCI changeset rules); layers are
unpacked once, and their files are shared, not copied."""
import hashlib
import io
import os
import stat
import tarfile
import types

import pytest

from gpusandbox.image import layers as layersmod
from gpusandbox.image import store as storemod
from gpusandbox.image import unpack
from gpusandbox.image.pull import pull

TAR = "application/vnd.oci.image.layer.v1.tar"


def _tar(members):
    """members: [(name, kind, arg, mode)]: kind "f" (bytes), "d", "l"
    (symlink target), "h" (hard link target), "c" (a character device)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, arg, mode in members:
            ti = tarfile.TarInfo(name)
            ti.mtime, ti.mode = 1700000000, mode
            if kind == "d":
                ti.type = tarfile.DIRTYPE
                tf.addfile(ti)
            elif kind == "l":
                ti.type, ti.linkname = tarfile.SYMTYPE, arg
                tf.addfile(ti)
            elif kind == "c":
                ti.type, ti.devmajor, ti.devminor = tarfile.CHRTYPE, 1, 3
                tf.addfile(ti)
            elif kind == "h":
                ti.type, ti.linkname = tarfile.LNKTYPE, arg
                tf.addfile(ti)
            else:
                ti.size = len(arg)
                tf.addfile(ti, io.BytesIO(arg))
    return buf.getvalue()


def f(name, data=b"", mode=0o644):
    return (name, "f", data, mode)


def d(name, mode=0o755):
    return (name, "d", None, mode)


L_BASE = [d("etc/"), f("etc/a", b"a"), f("etc/b", b"b"), d("opt/", 0o750), d("opt/x/"),
          f("opt/x/1", b"1"), f("opt/x/2", b"2"), d("srv/"), f("srv/file", b"f"),
          d("srv/dir/"), f("srv/dir/in", b"i"), ("srv/link", "l", "/etc/a", 0o777),
          f("keep", b"k", 0o4755), f("srv/node", b"lower")]
L_MID = [f("etc/.wh.a"), d("opt/x/"), f("opt/x/.wh..wh..opq"), f("opt/x/3", b"3"),
         # type changes: file -> dir, dir -> file, symlink -> file
         d("srv/file/"), f("srv/file/new", b"n"), f("srv/dir", b"now a file"),
         f("srv/link", b"was a link"),
         # an implied parent over an explicit lower directory (mode 0750)
         f("opt/y/z", b"z"), f("hl/orig", b"h"), ("hl/copy", "h", "hl/orig", 0o644)]
L_TOP = [f("srv/.wh.file"), d("srv/file/"), f("srv/file/again", b"a"),
         # a whiteout of the layer's own entry hides the lower ones only
         f("etc/c", b"c"), f("etc/.wh.c"), f("etc/.wh.b"), f("opt/x/4", b"4"),
         # a device node is skipped, and still replaces the lower entry
         ("srv/node", "c", None, 0o644)]
STACKS = {"three": [L_BASE, L_MID, L_TOP], "two": [L_BASE, L_TOP]}


def _snapshot(root):
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                what = ("l", os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                what = ("d", None)
            else:
                with open(p, "rb") as fh:
                    what = ("f", fh.read(), st.st_mtime_ns)
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, what)
    return out


def _flattened(tmp, raws):
    root = tmp / "flat"
    root.mkdir()
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        for raw in raws:
            unpack.apply_layer(fd, io.BytesIO(raw), media_type=TAR,
                               rootless=os.geteuid() != 0)
    finally:
        os.close(fd)
    return root


def _merged(st, tmp, raws, name="merged"):
    descs, diffs = [], []
    for raw in raws:
        dig = "sha256:" + hashlib.sha256(raw).hexdigest()
        st.put_bytes(dig, raw)
        descs.append({"digest": dig, "size": len(raw), "mediaType": TAR})
        diffs.append(dig)
    st._unpacked = []
    layersmod.ensure_layers(st, {"layers": descs}, types.SimpleNamespace(diff_ids=diffs))
    unpacked = list(st._unpacked)
    root = tmp / name
    root.mkdir()
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        layersmod.merge(st, diffs, fd, os.geteuid() != 0)
    finally:
        os.close(fd)
    return root, unpacked, diffs


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_merge_equals_layers_applied_in_order(tmp_path, stack):
    raws = [_tar(m) for m in STACKS[stack]]
    st = storemod.Store(str(tmp_path / "s"))
    merged, unpacked, diffs = _merged(st, tmp_path, raws)
    flat = _snapshot(_flattened(tmp_path, raws))
    assert _snapshot(merged) == flat
    assert len(unpacked) == len(raws)
    # spot checks of the rules the comparison covers
    assert ("etc/a" in flat) == (stack == "two") and "etc/c" in flat and "etc/b" not in flat
    assert "srv/node" not in flat and "srv/file/again" in flat
    assert sorted(n for n in flat if n.startswith("opt/x/")) == (
        ["opt/x/3", "opt/x/4"] if stack == "three" else ["opt/x/1", "opt/x/2", "opt/x/4"])
    if stack == "three":
        assert flat["opt"][1] == 0o750 | (0o700 if os.geteuid() else 0)   # implied above
        assert os.stat(merged / "hl/orig").st_ino == os.stat(merged / "hl/copy").st_ino


def test_shared_layers_unpacked_once_and_linked(tmp_path):
    st = storemod.Store(str(tmp_path / "s"))
    raws = [_tar(m) for m in STACKS["three"]]
    _m1, first, diffs = _merged(st, tmp_path, raws, "one")
    top2 = _tar([f("etc/.wh.b"), f("other", b"o")])
    m2, second, diffs2 = _merged(st, tmp_path, raws[:2] + [top2], "two")
    assert len(first) == 3 and second == diffs2[2:]
    base = tmp_path / "s" / layersmod.layer_dir(diffs[0]) / "diff"
    assert os.stat(m2 / "opt/x/3").st_ino == \
        os.stat(tmp_path / "s" / layersmod.layer_dir(diffs[1]) / "diff/opt/x/3").st_ino
    assert os.stat(m2 / "keep").st_ino == os.stat(base / "keep").st_ino
    assert not os.path.exists(m2 / "etc/b") and (m2 / "other").read_bytes() == b"o"


def test_layer_with_wrong_diff_id_leaves_nothing(tmp_path):
    st = storemod.Store(str(tmp_path / "s"))
    raw = _tar([f("a", b"a")])
    dig = "sha256:" + hashlib.sha256(raw).hexdigest()
    st.put_bytes(dig, raw)
    with pytest.raises(Exception, match="diff_id"):
        layersmod.ensure_layers(st, {"layers": [{"digest": dig, "size": len(raw),
                                                 "mediaType": TAR}]},
                                types.SimpleNamespace(diff_ids=["sha256:" + "0" * 64]))
    assert os.listdir(tmp_path / "s" / "layers") == []
    assert os.listdir(tmp_path / "s" / "tmp") == []


def _pull_child(root, lay, tag, log, go):
    from gpusandbox.image import archive
    go.wait()
    st = storemod.Store(root)
    try:
        pull(st, archive.OciLayoutSource(lay, tag), [f"img:{tag}"])
    except BaseException:
        os._exit(1)
    with open(log, "a") as fh:
        fh.write("".join(d + "\n" for d in st._unpacked))
    os._exit(0)


def test_concurrent_pulls_of_images_sharing_layers_unpack_each_once(tmp_path):
    """16 processes pull two images sharing 2 of 3 layers into one cold
    store (real applier, layers unpacked in parallel): every layer is
    unpacked by exactly one of them, and both images are whole."""
    from tests.unit import image_fixtures as fx
    shared = [{"bin/": None, "bin/sh": b"sh"}, {"etc/": None, "etc/x": b"x" * 50000}]
    images = []
    for tag, top in (("a", {"a": b"A"}), ("b", {"b": b"B", "etc/.wh.x": b""})):
        man, blobs = fx.build_image(shared + [top])
        images.append((tag, man, blobs))
    lay = fx.write_layout(str(tmp_path / "lay"), images)
    root, log = str(tmp_path / "s"), str(tmp_path / "log")
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=_pull_child, args=(root, lay, "ab"[i % 2], log, go))
             for i in range(16)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 16
    unpacked = open(log).read().split()
    assert len(unpacked) == 4 and len(set(unpacked)) == 4, unpacked
    assert len(os.listdir(tmp_path / "s" / "layers")) == 4
    st = storemod.Store(root)
    ra, rb = (st.bundle(st.get_ref(f"img:{t}")) + "/rootfs" for t in "ab")
    assert sorted(os.listdir(ra)) == ["a", "bin", "etc"] and os.listdir(ra + "/etc") == ["x"]
    assert sorted(os.listdir(rb)) == ["b", "bin", "etc"] and os.listdir(rb + "/etc") == []
    assert os.stat(ra + "/bin/sh").st_ino == os.stat(rb + "/bin/sh").st_ino
    assert os.listdir(tmp_path / "s" / "tmp") == []
