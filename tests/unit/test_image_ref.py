"""Image references: docker's short-name rule, hosts and ports, digests,
the local transports, and refusals."""
import pytest

from gpusandbox.image import ref as refmod
from gpusandbox.image.digest import ImageError

D = "sha256:" + "ab" * 32


@pytest.mark.parametrize("text,want", [
    ("ubuntu", ("docker.io", "library/ubuntu", "latest", None)),
    ("ubuntu:22.04", ("docker.io", "library/ubuntu", "22.04", None)),
    ("nvidia/cuda:12.4.1-base", ("docker.io", "nvidia/cuda", "12.4.1-base", None)),
    ("index.docker.io/ubuntu", ("docker.io", "library/ubuntu", "latest", None)),
    ("nvcr.io/nvidia/pytorch:24.05-py3", ("nvcr.io", "nvidia/pytorch", "24.05-py3", None)),
    ("localhost/foo", ("localhost", "foo", "latest", None)),
    ("localhost:5000/a/b", ("localhost:5000", "a/b", "latest", None)),
    ("127.0.0.1:5000/a:v1", ("127.0.0.1:5000", "a", "v1", None)),
    ("[::1]:5000/a:v1", ("[::1]:5000", "a", "v1", None)),
    (f"ubuntu@{D}", ("docker.io", "library/ubuntu", None, D)),
    (f"ubuntu:22.04@{D}", ("docker.io", "library/ubuntu", "22.04", D)),
    ("a__b/c-d.e:T_1", ("docker.io", "a__b/c-d.e", "T_1", None)),
])
def test_names(text, want):
    assert refmod.parse_name(text) == want
    r = refmod.parse("docker://" + text)
    assert (r.transport, r.host, r.repo, r.tag, r.digest) == ("docker",) + want
    s = refmod.parse(text)
    assert s.transport == "store" and (s.host, s.repo, s.tag, s.digest) == want


def test_canonical():
    assert refmod.parse("ubuntu").canonical() == "docker.io/library/ubuntu:latest"
    assert refmod.parse(f"docker://x.io:1/a@{D}").canonical() == f"x.io:1/a@{D}"


@pytest.mark.parametrize("text", [
    "", "Ubuntu", "ubuntu:", "ubuntu:-x", "ubuntu:" + "a" * 129, "a//b", "a/../b", "../x",
    "ubuntu@sha256:abc", f"ubuntu@sha256:{'AB' * 32}", "ubuntu@md5:" + "a" * 32,
    "ex ample/x", "x\0y", "x\ny", "café", "host:99999/x", "host:0/x", "-a.io/x",
    "docker://", "http://x/y", "foo://bar", "a" * 5000,
])
def test_bad_refs(text):
    with pytest.raises(ImageError) as e:
        refmod.parse(text)
    assert "\n" not in e.value.line()


def test_local_transports(tmp_path):
    r = refmod.parse("oci:./lay:v1")
    assert (r.transport, r.tag) == ("oci", "v1") and r.path.endswith("/lay")
    assert refmod.parse("oci:/abs/lay").tag is None
    assert refmod.parse("oci-archive:/a.tar:v2").canonical() == "oci-archive:/a.tar:v2"
    r = refmod.parse("docker-archive:/x.tar:foo:1")
    assert r.tag == "docker.io/library/foo:1"
    assert refmod.parse("docker-archive:/x.tar").tag is None
    for bad in ("oci:", "oci:/l:bad tag", "docker-archive:/x.tar:Foo",
                f"docker-archive:/x.tar:foo@{D}"):
        with pytest.raises(ImageError):
            refmod.parse(bad)


def test_run_of_a_directory_imports_no_image_module(tmp_path):
    """`run DIR` decides by the argument's form and loads nothing of
    gpusandbox.image; an image reference is recognised as one."""
    import subprocess
    import sys
    code = ("import sys; from gpusandbox.cli import parse_run_args\n"
            f"s = parse_run_args([{str(tmp_path)!r}, 'true']); assert not s.image_ref\n"
            "for ref in ('docker://x', 'oci:/l', 'ubuntu:22.04', 'nosuchdir'):\n"
            "    assert parse_run_args([ref]).image_ref, ref\n"
            "assert not parse_run_args(['/no/such', 'x']).image_ref\n"
            "print(sorted(m for m in sys.modules if m.startswith('gpusandbox.image')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
