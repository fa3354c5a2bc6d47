"""Local sources: OCI layouts, oci-archives and docker-archives built here,
read back, and every untrusted field refused when wrong."""
import gzip
import io
import json
import os

import pytest

from gpusandbox.image import archive, manifest as mf
from gpusandbox.image.digest import ImageError
from tests.unit import image_fixtures as fx

AMD64 = {"os": "linux", "architecture": "amd64", "variant": None}


def _blob(src, desc):
    out = io.BytesIO()
    src.blob(desc, out)
    return out.getvalue()


@pytest.fixture
def image():
    return fx.build_image([{"bin/": None, "bin/sh": b"#!x"}, {"etc/": None, "etc/a": b"1"}],
                          Env=["A=1"], Cmd=["sh"])


def test_oci_layout_tags_and_blobs(tmp_path, image):
    man, blobs = image
    man2, blobs2 = fx.build_image([{"x": b"2"}])
    lay = fx.write_layout(str(tmp_path / "lay"), [("v1", man, blobs), ("v2", man2, blobs2)])
    src = archive.OciLayoutSource(lay, "v1")
    dig, doc, raw = src.manifest(AMD64)
    assert dig == fx.sha(man) and raw == man and len(doc["layers"]) == 2
    for d in doc["layers"] + [doc["config"]]:
        assert _blob(src, d) == blobs[d["digest"]]
    assert archive.OciLayoutSource(lay, "v2").manifest(AMD64)[0] == fx.sha(man2)
    with pytest.raises(ImageError, match="no image tagged 'v3'"):
        archive.OciLayoutSource(lay, "v3").manifest(AMD64)
    # two tagged images and no tag: the tags are listed (issue 26)
    with pytest.raises(ImageError, match="holds 2 tagged images") as e:
        archive.OciLayoutSource(lay, None).manifest(AMD64)
    assert e.value.why == "tags: v1, v2" and e.value.hint == f"add :TAG, e.g. oci:{lay}:v1"
    # two untagged images and no tag: chosen by platform, none matches
    lay2 = fx.write_layout(str(tmp_path / "lay2"), [(None, man, blobs), (None, man2, blobs2)])
    with pytest.raises(ImageError, match="no image for linux/amd64"):
        archive.OciLayoutSource(lay2, None).manifest(AMD64)


def test_oci_archive(tmp_path, image):
    man, blobs = image
    fx.write_layout(str(tmp_path / "lay"), [(None, man, blobs)])
    tar = fx.tar_dir(str(tmp_path / "lay"), str(tmp_path / "lay.tar"))
    src = archive.OciArchiveSource(tar)
    dig, doc, _ = src.manifest(AMD64)
    assert dig == fx.sha(man)
    assert _blob(src, doc["layers"][1]) == blobs[doc["layers"][1]["digest"]]


def test_docker_archive(tmp_path):
    path = fx.write_docker_archive(str(tmp_path / "d.tar"), [
        (["foo:1", "reg.io/bar:2"], [{"bin/sh": b"a"}, {"etc/x": b"b"}], {"Cmd": ["sh"]}),
        (["other:1"], [{"bin/sh": b"c"}], {})])
    with pytest.raises(ImageError, match="holds 2 images"):
        archive.DockerArchiveSource(path).manifest(AMD64)
    src = archive.DockerArchiveSource(path, "reg.io/bar:2")
    dig, doc, raw = src.manifest(AMD64)
    assert fx.sha(raw) == dig and src.names == ["foo:1", "reg.io/bar:2"]
    layer = _blob(src, doc["layers"][0])
    assert fx.sha(layer) == doc["layers"][0]["digest"]
    assert doc["layers"][0]["mediaType"] == "application/vnd.docker.image.rootfs.diff.tar"
    conf = json.loads(_blob(src, doc["config"]))
    assert conf["rootfs"]["diff_ids"][0] == fx.sha(layer)
    with pytest.raises(ImageError, match="no image named"):
        archive.DockerArchiveSource(path, "docker.io/library/nope:1").manifest(AMD64)


def test_blob_tampered_or_truncated(tmp_path, image):
    man, blobs = image
    lay = fx.write_layout(str(tmp_path / "lay"), [(None, man, blobs)])
    src = archive.OciLayoutSource(lay)
    _, doc, _ = src.manifest(AMD64)
    d = doc["layers"][0]
    p = os.path.join(lay, "blobs", "sha256", d["digest"][7:])
    data = open(p, "rb").read()
    open(p, "wb").write(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ImageError, match="does not match"):
        _blob(src, d)
    open(p, "wb").write(data[:-5])
    with pytest.raises(ImageError, match="truncated"):
        _blob(src, d)
    open(p, "wb").write(data + b"more")
    with pytest.raises(ImageError, match="larger"):
        _blob(src, d)


def test_blob_symlink_refused(tmp_path, image):
    man, blobs = image
    lay = fx.write_layout(str(tmp_path / "lay"), [(None, man, blobs)])
    src = archive.OciLayoutSource(lay)
    _, doc, _ = src.manifest(AMD64)
    d = doc["layers"][0]
    p = os.path.join(lay, "blobs", "sha256", d["digest"][7:])
    secret = tmp_path / "secret"
    secret.write_bytes(blobs[d["digest"]])
    os.unlink(p)
    os.symlink(str(secret), p)
    with pytest.raises(ImageError, match="cannot open"):
        _blob(src, d)


def _layout_with_index(tmp_path, index):
    lay = tmp_path / "bad"
    (lay / "blobs" / "sha256").mkdir(parents=True)
    (lay / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (lay / "index.json").write_text(json.dumps(index))
    return str(lay)


@pytest.mark.parametrize("entry", [
    {"mediaType": fx.OCI_MANIFEST, "digest": "sha256:../../etc/passwd", "size": 1},
    {"mediaType": fx.OCI_MANIFEST, "digest": "sha256:" + "a" * 63, "size": 1},
    {"mediaType": fx.OCI_MANIFEST, "digest": "sha256:" + "a" * 64, "size": -1},
    {"mediaType": fx.OCI_MANIFEST, "digest": "sha256:" + "a" * 64, "size": True},
    {"mediaType": 5, "digest": "sha256:" + "a" * 64, "size": 1},
    "not a descriptor",
])
def test_bad_index_entries(tmp_path, entry):
    lay = _layout_with_index(tmp_path, {"schemaVersion": 2, "manifests": [entry]})
    with pytest.raises(ImageError):
        archive.OciLayoutSource(lay).manifest(AMD64)


def test_manifest_that_is_also_an_index(tmp_path):
    man = json.dumps({"schemaVersion": 2, "mediaType": fx.OCI_MANIFEST, "manifests": [],
                      "config": {}, "layers": []}).encode()
    lay = _layout_with_index(tmp_path, {"schemaVersion": 2, "manifests": [
        {"mediaType": fx.OCI_MANIFEST, "digest": fx.sha(man), "size": len(man)}]})
    with open(os.path.join(lay, "blobs", "sha256", fx.sha(man)[7:]), "wb") as f:
        f.write(man)
    with pytest.raises(ImageError) as e:
        archive.OciLayoutSource(lay).manifest(AMD64)
    assert e.value.why == "it is both a manifest and an index"


def test_platform_selection_skips_attestations():
    a = {"mediaType": fx.OCI_MANIFEST, "digest": "sha256:" + "1" * 64, "size": 1,
         "platform": {"os": "unknown", "architecture": "unknown"},
         "annotations": {"vnd.docker.reference.type": "attestation-manifest"}}
    arm = {"mediaType": fx.OCI_MANIFEST, "digest": "sha256:" + "2" * 64, "size": 1,
           "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}}
    amd = {"mediaType": fx.OCI_MANIFEST, "digest": "sha256:" + "3" * 64, "size": 1,
           "platform": {"os": "linux", "architecture": "amd64"}}
    idx = {"manifests": [a, arm, amd]}
    assert mf.select(idx, AMD64) is amd
    assert mf.select(idx, mf.parse_platform("linux/arm64")) is arm
    with pytest.raises(ImageError) as e:
        mf.select(idx, mf.parse_platform("linux/ppc64le"))
    assert e.value.why == "it has: linux/amd64, linux/arm64/v8"
    for bad in ("linux", "linux/", "a/b/c/d", "linux/am d64"):
        with pytest.raises(ImageError):
            mf.parse_platform(bad)


def test_not_a_tar(tmp_path):
    p = tmp_path / "x.tar"
    p.write_bytes(gzip.compress(b"hello"))
    with pytest.raises(ImageError, match="cannot read docker-archive"):
        archive.DockerArchiveSource(str(p))
    with pytest.raises(ImageError, match="cannot open OCI layout"):
        archive.OciLayoutSource(str(tmp_path / "none"))


def test_manifest_fields_checked():
    good = json.loads(fx.build_image([{"a": b"1"}])[0])
    mf.check_manifest(json.loads(json.dumps(good)))
    for mutate in (lambda m: m.update(schemaVersion=1),
                   lambda m: m["config"].update(size=(4 << 20) + 1),
                   lambda m: m["config"].update(mediaType="text/plain"),
                   lambda m: m["layers"][0].update(mediaType="application/x-evil"),
                   lambda m: m["layers"][0].update(digest="sha256:" + "g" * 64),
                   lambda m: m.update(layers={"a": 1}),
                   lambda m: m.update(layers=[good["layers"][0]] * 501)):
        m = json.loads(json.dumps(good))
        mutate(m)
        with pytest.raises(ImageError):
            mf.check_manifest(m)


def test_fifo_blob_never_opened(tmp_path, image):
    """A FIFO in place of a blob is refused without being opened (an open
    would block for ever)."""
    man, blobs = image
    lay = fx.write_layout(str(tmp_path / "lay"), [(None, man, blobs)])
    src = archive.OciLayoutSource(lay)
    _, doc, _ = src.manifest(AMD64)
    d = doc["layers"][0]
    p = os.path.join(lay, "blobs", "sha256", d["digest"][7:])
    os.unlink(p)
    os.mkfifo(p)
    with pytest.raises(ImageError, match="not a regular file"):
        _blob(src, d)


def test_layout_with_a_multi_platform_index(tmp_path):
    """index.json -> an image index (two platforms and an attestation) ->
    the manifest of the platform asked for."""
    m_amd, b_amd = fx.build_image([{"a": b"amd"}], arch="amd64")
    m_arm, b_arm = fx.build_image([{"a": b"arm"}], arch="arm64")
    entries = [{"mediaType": fx.OCI_MANIFEST, "digest": fx.sha(m_arm), "size": len(m_arm),
                "platform": {"os": "linux", "architecture": "arm64", "variant": "v8"}},
               {"mediaType": fx.OCI_MANIFEST, "digest": fx.sha(m_amd), "size": len(m_amd),
                "platform": {"os": "linux", "architecture": "amd64"}}]
    idx = json.dumps({"schemaVersion": 2, "mediaType": fx.OCI_INDEX,
                      "manifests": entries}).encode()
    lay = fx.write_layout(str(tmp_path / "lay"), [])
    for d, data in list(b_amd.items()) + list(b_arm.items()) + [(fx.sha(idx), idx)]:
        with open(os.path.join(lay, "blobs", "sha256", d[7:]), "wb") as f:
            f.write(data)
    with open(os.path.join(lay, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [
            {"mediaType": fx.OCI_INDEX, "digest": fx.sha(idx), "size": len(idx),
             "annotations": {archive.REF_NAME: "multi"}}]}, f)
    assert archive.OciLayoutSource(lay, "multi").manifest(AMD64)[0] == fx.sha(m_amd)
    arm = mf.parse_platform("linux/arm64")
    assert archive.OciLayoutSource(lay, "multi").manifest(arm)[0] == fx.sha(m_arm)
    with pytest.raises(ImageError, match="no image for linux/s390x"):
        archive.OciLayoutSource(lay, "multi").manifest(mf.parse_platform("linux/s390x"))
