"""Platform selection and manifest checks as the registry client uses them
(gpusandbox.image.manifest, shared with the local sources)."""
import pytest

from gpusandbox.image import manifest as rm
from gpusandbox.image.digest import ImageError

D = "sha256:" + "a" * 64


def _e(arch, os_="linux", variant=None, mt=rm.OCI_MANIFEST, **extra):
    p = {"os": os_, "architecture": arch}
    if variant:
        p["variant"] = variant
    return dict({"mediaType": mt, "digest": "sha256:" + (arch + (variant or "") + os_).encode()
                 .hex().ljust(64, "0")[:64], "size": 10, "platform": p}, **extra)


INDEX = {"schemaVersion": 2, "mediaType": rm.OCI_INDEX, "manifests": [
    _e("unknown", "unknown",
       annotations={"vnd.docker.reference.type": "attestation-manifest"}),
    _e("amd64", annotations={"vnd.docker.reference.type": "attestation-manifest"}),
    _e("amd64"),
    _e("arm", variant="v6"),
    _e("arm", variant="v7"),
    _e("arm64"),
    dict(_e("ppc64le"), platform=None),
]}


def test_select_skips_attestations():
    d = rm.select(INDEX, rm.parse_platform("linux/amd64"))
    assert d is INDEX["manifests"][2]


def test_select_variants():
    assert rm.select(INDEX, rm.parse_platform("linux/arm/v7")) is INDEX["manifests"][4]
    assert rm.select(INDEX, rm.parse_platform("linux/arm")) is INDEX["manifests"][3]
    # arm64 without a variant is v8
    assert rm.select(INDEX, rm.parse_platform("linux/arm64/v8")) is INDEX["manifests"][5]


def test_select_none_lists_what_there_is():
    with pytest.raises(ImageError) as e:
        rm.select(INDEX, rm.parse_platform("linux/s390x"))
    assert "linux/amd64, linux/arm/v6, linux/arm/v7, linux/arm64" in e.value.line()
    assert "unknown" not in e.value.line() and "ppc64le" not in e.value.line()


def test_select_nested_index_refused():
    idx = {"manifests": [_e("amd64", mt=rm.OCI_INDEX)]}
    with pytest.raises(ImageError):
        rm.select(idx, rm.parse_platform("linux/amd64"))


@pytest.mark.parametrize("text", ["linux", "linux/", "a/b/c/d", "linux/amd 64", 5])
def test_bad_platform(text):
    with pytest.raises(ImageError):
        rm.parse_platform(text)


def _m(**kw):
    m = {"schemaVersion": 2, "mediaType": rm.OCI_MANIFEST,
         "config": {"mediaType": rm.OCI_CONFIG, "digest": D, "size": 2},
         "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                     "digest": D, "size": 3}]}
    m.update(kw)
    return m


def test_kind_and_checks():
    assert rm.kind(_m()) == "manifest"
    assert rm.kind({"schemaVersion": 2, "manifests": []}) == "index"
    assert rm.kind({"schemaVersion": 2, "layers": []}, rm.DOCKER_MANIFEST) == "manifest"
    rm.check_manifest(_m())
    for bad in (_m(manifests=[]), {"schemaVersion": 2}):
        with pytest.raises(ImageError):
            rm.kind(bad)
    for bad in (_m(layers=[{"mediaType": "x", "digest": "sha256:../x", "size": 1}]),
                _m(layers=[{"mediaType": "x", "digest": D, "size": -1}]),
                _m(layers=[{"mediaType": "x", "digest": D, "size": True}]),
                _m(layers={}), _m(config={"mediaType": "text/plain", "digest": D, "size": 1}),
                _m(mediaType=rm.OCI_INDEX)):
        with pytest.raises(ImageError):
            rm.check_manifest(bad)


def test_loads_bounds():
    with pytest.raises(ImageError):
        rm.loads(b" " * (rm.MAX_DOC + 1), "m")
    with pytest.raises(ImageError):
        rm.loads(b"[" * 100000, "m")
    with pytest.raises(ImageError):
        rm.loads(b"[]", "m")
