"""The edit memo's trust checks (gpusandbox/oci/memo.py): an entry is read
only from a directory of the caller's closed to others, only when it is the
caller's own and not group/other accessible, and only while every watched
observation holds; the image is read without following links."""
import marshal
import os

import pytest

from gpusandbox.edits import ContainerEdits, Mount
from gpusandbox.oci import fastjson, memo


def _entry(d, name, watch, mode=0o600):
    e = ContainerEdits()
    e.mounts.append(Mount("/host/libcuda.so.1", "/usr/lib/libcuda.so.1"))
    p = d / name
    p.write_bytes(marshal.dumps({"watch": watch, "edits": memo._ser(e)}))
    os.chmod(p, mode)
    return p


def test_entry_used_only_while_private_and_watch_holds(tmp_path):
    watched = tmp_path / "version"
    watched.write_text("550.54.15\n")
    watch = [("read", str(watched), memo.observe("read", str(watched))),
             ("stat", str(tmp_path / "absent"), memo.observe("stat", str(tmp_path / "absent")))]
    _entry(tmp_path, "k1", watch)
    hit = memo.lookup(str(tmp_path), "k1")
    assert hit is not memo.MISS and [m.host_path for m in hit.mounts] == ["/host/libcuda.so.1"]
    for mode in (0o644, 0o660, 0o606):
        os.chmod(tmp_path / "k1", mode)
        assert memo.lookup(str(tmp_path), "k1") is memo.MISS, oct(mode)
    os.chmod(tmp_path / "k1", 0o600)
    if os.geteuid() == 0:
        os.chown(tmp_path / "k1", 12345, 12345)
        assert memo.lookup(str(tmp_path), "k1") is memo.MISS
        os.chown(tmp_path / "k1", 0, 0)
    (tmp_path / "k2").symlink_to(tmp_path / "k1")
    assert memo.lookup(str(tmp_path), "k2") is memo.MISS
    watched.write_text("555.42.02\n")
    assert memo.lookup(str(tmp_path), "k1") is memo.MISS
    watched.write_text("550.54.15\n")
    (tmp_path / "absent").write_text("now here")
    assert memo.lookup(str(tmp_path), "k1") is memo.MISS
    (tmp_path / "k3").write_bytes(b"not marshal data")
    os.chmod(tmp_path / "k3", 0o600)
    assert memo.lookup(str(tmp_path), "k3") is memo.MISS


def test_directory_open_to_others_is_not_used(tmp_path, monkeypatch):
    from gpusandbox import rundir
    monkeypatch.setattr(rundir, "open_base",
                        lambda environ=None, meet=True: rundir.Base(
                            str(tmp_path), os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY),
                            False))
    assert memo.directory() == str(tmp_path / "oci-memo")
    os.chmod(tmp_path / "oci-memo", 0o777)
    assert memo.directory() is None
    os.rmdir(tmp_path / "oci-memo")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "oci-memo").symlink_to(tmp_path / "elsewhere")
    assert memo.directory() is None


def test_image_read_never_follows_a_link(tmp_path):
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "ld.so.cache").write_bytes(b"cache")
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        k = memo.key(("/", None), {"NVIDIA_VISIBLE_DEVICES": "0"}, fd)
        assert k and k == memo.key(("/", None), {"NVIDIA_VISIBLE_DEVICES": "0"}, fd)
        assert memo.key(("/", None), {"NVIDIA_VISIBLE_DEVICES": "1"}, fd) != k
        (root / "etc" / "ld.so.cache").write_bytes(b"other")
        assert memo.key(("/", None), {"NVIDIA_VISIBLE_DEVICES": "0"}, fd) != k
        (root / "etc" / "debian_version").symlink_to("/etc/hostname")
        assert memo.key(("/", None), {"NVIDIA_VISIBLE_DEVICES": "0"}, fd) is None
        (root / "etc" / "debian_version").unlink()
        os.rename(root / "etc", root / "etc.real")
        (root / "etc").symlink_to("etc.real")
        assert memo.key(("/", None), {"NVIDIA_VISIBLE_DEVICES": "0"}, fd) is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("doc", ['{"a": [1, 2.5, "\\u00e9", null, true, false, {"b": NaN}]}',
                                 ' \n[1, {"x": "y"}] \t', '"s"', '{"a": 1, "a": 2}'])
def test_fastjson_is_json(doc):
    import json
    assert repr(fastjson.loads(doc)) == repr(json.loads(doc))
    assert fastjson.dumps(json.loads(doc)) == json.dumps(json.loads(doc))


@pytest.mark.parametrize("doc", ["", "[1] x", "{", "\ufeff{}", "[1,]", "{'a': 1}"])
def test_fastjson_refuses_what_json_refuses(doc):
    with pytest.raises(ValueError):
        fastjson.loads(doc)


def test_entries_start_python_without_site():
    """bin/gpusandbox-runtime runs wrapper.BOOT with -I -S; hook install's
    filter entry is the same shape with filter.BOOT."""
    from pathlib import Path
    from gpusandbox.oci import filter as ocifilter, wrapper
    sh = (Path(__file__).resolve().parents[2] / "bin" / "gpusandbox-runtime").read_text()
    assert f"-I -S -c '{wrapper.BOOT}' \"$site\" \"$@\"" in sh
    args = ocifilter.entry_args("/usr/bin/python3")
    assert args[:5] == ["/usr/bin/python3", "-I", "-S", "-c", ocifilter.BOOT]
    assert os.path.isfile(os.path.join(args[5], "gpusandbox", "oci", "filter.py"))


def test_mig_uuid_selections_are_not_memoised():
    """MIG-<uuid> is resolved through NVML, not files: a MIG device made
    again under the same ids gets a new UUID the watch list cannot see."""
    ok = ["0", "all", "0:1:0", "GPU-76c81341-ffb2-f9d7-d900-e63a84ad61c3",
          "MIG-GPU-76c81341-ffb2-f9d7-d900-e63a84ad61c3/1/0"]
    for vis in ok:
        assert memo.cacheable({"NVIDIA_VISIBLE_DEVICES": vis}), vis
    for vis in ("MIG-8a3b5f2e-0000-5a5a-8f8f-123456789abc", "0, mig-8a3b5f2e-0000"):
        assert not memo.cacheable({"NVIDIA_VISIBLE_DEVICES": vis}), vis


def test_node_watch_ignores_entries_coming_and_going(tmp_path):
    """The MPS pipe directory (a mount source) gains and loses pipes with
    every client: watched by type and inode, not times."""
    d = tmp_path / "nvidia-mps"
    d.mkdir()
    node, ident = memo.observe("node", str(d)), memo.observe("stat", str(d))
    os.utime(d, ns=(1, 1))
    (d / "control").write_text("")
    assert memo.observe("node", str(d)) == node
    assert memo.observe("stat", str(d)) != ident
    os.rename(d, tmp_path / "old")
    d.mkdir()
    assert memo.observe("node", str(d)) != node
