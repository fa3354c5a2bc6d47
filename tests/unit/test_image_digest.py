import hashlib

import pytest

from gpusandbox.image import digest as d


@pytest.mark.parametrize("bad", ["sha256:../x", "sha256:" + "A" * 64, "sha256:" + "a" * 63,
                                 "sha256:" + "a" * 65, "md5:" + "a" * 32, "sha256", "",
                                 "sha256:" + "a" * 63 + "/", 5, None])
def test_bad_digests_are_refused(bad):
    with pytest.raises(d.ImageError):
        d.parse(bad)


def test_verifier_checks_size_and_content():
    data = b"layer"
    good = "sha256:" + hashlib.sha256(data).hexdigest()
    v = d.Verifier(good, len(data))
    v.update(data)
    v.check()
    v = d.Verifier(good, len(data))
    with pytest.raises(d.ImageError, match="larger"):
        v.update(data + b"x")
    v = d.Verifier(good, len(data))
    v.update(data[:2])
    with pytest.raises(d.ImageError, match="truncated"):
        v.check()
    v = d.Verifier("sha256:" + "0" * 64, len(data))
    v.update(data)
    with pytest.raises(d.ImageError, match="does not match"):
        v.check()
