"""The store: publish, refs, rmi/prune, concurrent pulls fetching each blob
once, and a pull killed mid-layer leaving no image.

The layer applier is the unpack module's job (tested there); here a small
test-only applier stands in for it through sys.modules, so the store logic
is tested on its own."""
import gzip
import hashlib
import io
import json
import multiprocessing
import os
import signal
import stat
import sys
import tarfile
import types

import pytest

from gpusandbox.image import archive, store as storemod
from gpusandbox.image.digest import ImageError
from gpusandbox.image.pull import pull
from gpusandbox.image.storegc import prune, rmi
from tests.unit import image_fixtures as fx


def _test_apply(rootfd, fileobj, *, media_type, rootless, limits=None, warn=None, record=None,
                seal=None):
    data = fileobj.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    root = f"/proc/self/fd/{rootfd}"
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        for m in tf:
            gate = os.environ.get("GSBX_TEST_APPLY_GATE")
            if gate and m.name == "gate":
                os.write(int(gate), b"x")      # tell the test we are mid-layer
                signal.pause()
            if m.isdir():
                os.makedirs(os.path.join(root, m.name), exist_ok=True)
            elif m.isreg():
                with open(os.path.join(root, m.name), "wb") as f:
                    f.write(tf.extractfile(m).read())
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(autouse=True)
def applier(monkeypatch):
    mod = types.ModuleType("gpusandbox.image.unpack")
    mod.apply_layer = _test_apply
    monkeypatch.setitem(sys.modules, "gpusandbox.image.unpack", mod)
    import gpusandbox.image
    monkeypatch.setattr(gpusandbox.image, "unpack", mod, raising=False)


class Counting:
    """A test-only Source wrapper: appends one line per blob() call."""

    def __init__(self, src, log):
        self.src, self.log = src, log
        self.names = getattr(src, "names", [])

    def manifest(self, platform):
        return self.src.manifest(platform)

    def blob(self, desc, out):
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.write(fd, (desc["digest"] + "\n").encode())
        os.close(fd)
        self.src.blob(desc, out)

    def close(self):
        self.src.close()


@pytest.fixture
def layout(tmp_path):
    man, blobs = fx.build_image([{"bin/": None, "bin/sh": b"sh"},
                                 {"etc/": None, "etc/os-release": b"ID=test\n"}],
                                Env=["A=1"], Cmd=["sh"], WorkingDir="/srv")
    return fx.write_layout(str(tmp_path / "lay"), [("v1", man, blobs)]), man, blobs


def test_pull_publishes_image_and_ref(tmp_path, layout):
    lay, man, blobs = layout
    st = storemod.Store(str(tmp_path / "s"))
    rec = pull(st, archive.OciLayoutSource(lay, "v1"), [f"oci:{lay}:v1"])
    dig = fx.sha(man)
    assert rec["digest"] == dig and len(rec["layers"]) == 2
    assert st.get_ref(f"oci:{lay}:v1") == dig
    b = st.bundle(dig)
    assert open(b + "/rootfs/etc/os-release").read() == "ID=test\n"
    conf = json.load(open(b + "/config.json"))
    assert conf["process"]["env"] == ["A=1"] and conf["process"]["cwd"] == "/srv"
    # The manifest and config stay; the compressed layers went once unpacked.
    conf_d = json.loads(man)["config"]["digest"]
    assert open(st.root + "/" + st.blob_path(conf_d), "rb").read() == blobs[conf_d]
    assert sorted(os.listdir(st.root + "/blobs/sha256")) == sorted([dig[7:], conf_d[7:]])
    assert not st.keeps_blobs(dig)
    assert stat.S_IMODE(os.stat(st.root).st_mode) == 0o700
    assert os.listdir(st.root + "/tmp") == []
    assert not [n for n in os.listdir(st.root + "/locks") if n.startswith("owner-")]
    # a second pull finds it complete and fetches nothing
    log = str(tmp_path / "log")
    pull(st, Counting(archive.OciLayoutSource(lay, "v1"), log), ["other:1"])
    assert not os.path.exists(log)
    assert sorted(n for n, _ in st.refs()) == sorted([f"oci:{lay}:v1", "other:1"])


def test_shared_layers_fetched_once(tmp_path):
    base = {"bin/": None, "bin/sh": b"sh"}
    man1, b1 = fx.build_image([base, {"a": b"1"}])
    man2, b2 = fx.build_image([base, {"b": b"2"}])
    lay = fx.write_layout(str(tmp_path / "lay"), [("one", man1, b1), ("two", man2, b2)])
    st = storemod.Store(str(tmp_path / "s"))
    pull(st, archive.OciLayoutSource(lay, "one"), ["one"])
    log = str(tmp_path / "log")
    pull(st, Counting(archive.OciLayoutSource(lay, "two"), log), ["two"])
    fetched = open(log).read().split()
    shared = json.loads(man1)["layers"][0]["digest"]
    assert shared not in fetched and len(fetched) == 2     # new layer + config


def test_diff_id_mismatch_publishes_nothing(tmp_path):
    man, blobs = fx.build_image([{"bin/sh": b"sh"}])
    conf_d = json.loads(man)["config"]["digest"]
    conf = json.loads(blobs[conf_d])
    conf["rootfs"]["diff_ids"] = ["sha256:" + "0" * 64]
    raw = json.dumps(conf).encode()
    doc = json.loads(man)
    doc["config"] = dict(doc["config"], digest=fx.sha(raw), size=len(raw))
    man = json.dumps(doc).encode()
    blobs = {fx.sha(raw): raw, doc["layers"][0]["digest"]: blobs[doc["layers"][0]["digest"]]}
    lay = fx.write_layout(str(tmp_path / "lay"), [(None, man, blobs)])
    st = storemod.Store(str(tmp_path / "s"))
    with pytest.raises(ImageError, match="diff_id"):
        pull(st, archive.OciLayoutSource(lay), ["x"])
    assert st.image_digests() == [] and st.refs() == []
    assert os.listdir(st.root + "/tmp") == [] and os.listdir(st.root + "/images") == []
    assert os.listdir(st.root + "/blobs/sha256") == []   # the bad pull's blobs went too


def test_foreign_arch_refused(tmp_path):
    man, blobs = fx.build_image([{"bin/sh": b"sh"}], arch="s390x")
    lay = fx.write_layout(str(tmp_path / "lay"), [(None, man, blobs)])
    st = storemod.Store(str(tmp_path / "s"))
    with pytest.raises(ImageError, match="the image is for linux/s390x"):
        pull(st, archive.OciLayoutSource(lay), ["x"],
                platform={"os": "linux", "architecture": "amd64"})
    assert st.image_digests() == []


def test_rmi_and_prune(tmp_path, layout):
    lay, man, blobs = layout
    st = storemod.Store(str(tmp_path / "s"))
    pull(st, archive.OciLayoutSource(lay, "v1"), ["docker.io/library/a:1",
                                                  "docker.io/library/b:1"])
    dig = fx.sha(man)
    # make a directory the image made read-only: removal still works
    os.chmod(st.bundle(dig) + "/rootfs/etc", 0o555)
    assert rmi(st, ["docker.io/library/a:1"]) == [("docker.io/library/a:1", dig)]
    assert st.has_image(dig)            # b:1 still names it
    with pytest.raises(ImageError, match="no image"):
        rmi(st, ["nope:1"])
    assert rmi(st, [dig]) == [("docker.io/library/b:1", dig)]
    assert not st.has_image(dig) and st.refs() == []
    # rmi freed it all: no blob or layer is left for prune
    assert os.listdir(st.root + "/blobs/sha256") == []
    assert os.listdir(st.root + "/layers") == []
    n_img, n_blob, _ = prune(st)
    assert (n_img, n_blob) == (0, 0)
    assert os.listdir(st.root + "/locks") == ["gc"]


def test_prune_keeps_named_removes_unnamed(tmp_path, layout):
    lay, man, blobs = layout
    st = storemod.Store(str(tmp_path / "s"))
    pull(st, archive.OciLayoutSource(lay, "v1"), ["keep:1"])
    man2, b2 = fx.build_image([{"x": b"x"}])
    lay2 = fx.write_layout(str(tmp_path / "lay2"), [(None, man2, b2)])
    pull(st, archive.OciLayoutSource(lay2), [])
    assert len(st.image_digests()) == 2
    assert prune(st)[:2] == (1, 2)          # its manifest and config
    assert st.image_digests() == [fx.sha(man)]
    conf_d = json.loads(man)["config"]["digest"]
    assert sorted(os.listdir(st.root + "/blobs/sha256")) == sorted([fx.sha(man)[7:],
                                                                     conf_d[7:]])


def test_ref_names_escaped():
    for name in ("../x", "a/b:1", ".", "..", "x\0y"[:1], "oci:/a/../b:t"):
        e = storemod.escape(name)
        assert "/" not in e and e not in (".", "..") and "\0" not in e
    assert len(storemod.escape("a" * 1000)) < 100


def _pull_child(root, lay, log, go):
    go.wait()                       # all start together: a cold store, 32 pulls
    st = storemod.Store(root)
    pull(st, Counting(archive.OciLayoutSource(lay, "v1"), log), ["same:1"])
    os._exit(0)


def test_32_concurrent_pulls_fetch_each_blob_once(tmp_path, layout):
    lay, man, blobs = layout
    root, log = str(tmp_path / "s"), str(tmp_path / "log")
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=_pull_child, args=(root, lay, log, go)) for _ in range(32)]
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 32
    fetched = open(log).read().split()
    # the manifest is stored from the bytes already read; every other blob once
    assert sorted(fetched) == sorted(d for d in blobs if d != fx.sha(man))
    st = storemod.Store(root)
    assert st.image_digests() == [fx.sha(man)] and os.listdir(root + "/tmp") == []


def _killed_child(root, lay, wfd):
    os.environ["GSBX_TEST_APPLY_GATE"] = str(wfd)
    pull(storemod.Store(root), archive.OciLayoutSource(lay, "v1"), ["k:1"])
    os._exit(0)


def test_pull_killed_mid_layer(tmp_path):
    man, blobs = fx.build_image([{"bin/": None, "bin/sh": b"sh"},
                                 {"a": b"1", "gate": b"", "b": b"2"}])
    lay = fx.write_layout(str(tmp_path / "lay"), [("v1", man, blobs)])
    root = str(tmp_path / "s")
    r, w = os.pipe()
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_killed_child, args=(root, lay, w))
    p.start()
    assert os.read(r, 1) == b"x"            # mid-layer, staging dir in place
    st = storemod.Store(root)
    assert len(os.listdir(root + "/tmp")) >= 1   # layers unpack in parallel
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    assert st.image_digests() == [] and st.get_ref("k:1") is None
    rec = pull(st, archive.OciLayoutSource(lay, "v1"), ["k:1"])
    assert rec["digest"] == fx.sha(man)
    assert os.listdir(root + "/tmp") == []  # the dead pull's staging is gone
    assert open(st.bundle(rec["digest"]) + "/rootfs/b").read() == "2"
    prune(st)    # the killed pull's owner file goes too
    assert not [n for n in os.listdir(root + "/locks") if n.startswith("owner-")]


def test_store_owned_by_another_user_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a foreign-owned directory")
    d = tmp_path / "s"
    d.mkdir()
    os.chown(d, 65534, 65534)
    with pytest.raises(ImageError, match="belongs to uid 65534"):
        storemod.Store(str(d))


class Restarting:
    """A test-only source that writes half a blob, then restarts it from the
    start (seek(0) + truncate) as the registry client does after a cut."""

    def __init__(self, src):
        self.src = src

    def manifest(self, platform):
        return self.src.manifest(platform)

    def blob(self, desc, out):
        buf = io.BytesIO()
        self.src.blob(desc, buf)
        data = buf.getvalue()
        out.write(data[:len(data) // 2])
        out.seek(out.tell() * 0)
        out.truncate()
        out.write(data)
        out.flush()

    def close(self):
        pass


def test_blob_restarted_by_source(tmp_path, layout):
    lay, man, blobs = layout
    st = storemod.Store(str(tmp_path / "s"))
    rec = pull(st, Restarting(archive.OciLayoutSource(lay, "v1")), ["r:1"], keep_blobs=True)
    assert rec["digest"] == fx.sha(man) and st.keeps_blobs(rec["digest"])
    for d in blobs:
        assert open(st.root + "/" + st.blob_path(d), "rb").read() == blobs[d]


def test_lookup_creates_no_store(tmp_path, monkeypatch):
    """`run NAME`, images and inspect only look: no store appears in $HOME."""
    from gpusandbox.image import runimage
    monkeypatch.delenv("GPUSANDBOX_STORE", raising=False)
    monkeypatch.delenv("GPUSANDBOX_SITE_STORE", raising=False)
    env = {"HOME": str(tmp_path), "XDG_DATA_HOME": ""}
    all_stores = runimage.stores(None, env)
    assert all_stores.root == str(tmp_path / ".local/share/gpusandbox/store")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", "")
    monkeypatch.chdir(tmp_path)
    spec = types.SimpleNamespace(rootfs_mode="ro", image="ubuntu", platform=None, store=None)
    with pytest.raises(ImageError, match="image not found"):
        runimage.prepare(spec)
    assert os.listdir(tmp_path) == []


def test_prune_and_rmi_keep_an_image_held(tmp_path, layout):
    lay, man, blobs = layout
    st = storemod.Store(str(tmp_path / "s"))
    dig = fx.sha(man)
    pull(st, archive.OciLayoutSource(lay, "v1"), ["x:1"])
    fd = storemod.Store(st.root).hold(dig)        # a running sandbox
    with pytest.raises(ImageError, match="in use"):
        rmi(st, ["x:1", "nope:2"][:1])
    assert st.get_ref("x:1") == dig               # all or nothing
    with pytest.raises(ImageError, match="no image 'nope:2'"):
        rmi(st, ["x:1", "nope:2"])
    assert st.get_ref("x:1") == dig
    st.remove_ref("x:1")
    assert prune(st)[:2] == (0, 0) and st.has_image(dig)
    with pytest.raises(ImageError, match="is being removed"):
        fd2 = st.try_exclusive(dig)
        assert fd2 is None
        os.close(fd)
        fd = None
        held = st.try_exclusive(dig)
        try:
            storemod.Store(st.root).hold(dig)
        finally:
            os.close(held)
    assert prune(st)[:2] == (1, 2)          # its manifest and config
