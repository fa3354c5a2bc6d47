"""gpusandbox.image.unpack: the hostile-layer corpus (tests/unit/unpack_corpus.py)
in-process, as whoever runs the unit tests (root here; the rootless run is
tests/integration/test_unpack_rootless.py), and the OCI changeset rules
against trees built by hand and by umoci."""
import gzip
import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile

import pytest

from gpusandbox.image.digest import ImageError
from gpusandbox.image.unpack import Limits, apply_layer
from tests.unit import unpack_corpus as corpus
from tests.unit.unpack_corpus import DIR, LNK, SYM, layer, member


class raises:
    """pytest.raises for ImageError, matching the whole one-line message."""

    def __init__(self, text):
        self.text = text

    def __enter__(self):
        return self

    def __exit__(self, typ, val, tb):
        assert typ is ImageError, f"expected ImageError, got {typ and typ.__name__}"
        assert self.text in val.line(), val.line()
        return True

ROOTLESS = os.geteuid() != 0


@pytest.mark.parametrize("name", [c[0] for c in corpus.CASES])
def test_hostile_layer(tmp_path, name):
    _, fn, expect, check, limits = next(c for c in corpus.CASES if c[0] == name)
    assert corpus.run_case(str(tmp_path), name, fn, expect, check, limits, ROOTLESS) == []


def test_default_limits_refuse_the_10gib_zero_layer(tmp_path):
    """The issue's bomb, 10 GiB of zeros compressed to ~10 MiB, with the
    default limits: refused by the ratio check after 512 MiB, having read
    about 0.5 MiB of the blob."""
    fails = corpus.run_case(str(tmp_path), "bomb", lambda o: [corpus.GzipZeroBomb(10 << 30)],
                            "error", "decompression bomb", None, ROOTLESS)
    assert fails == []


def test_endless_stream_is_not_read_to_the_end():
    src = corpus.Endless(corpus.header(b"././@PaxHeader", size=b"%011o\0" % (1 << 32),
                                       typ=b"x"))
    root = os.open("/", os.O_PATH)  # nothing is written: the header is refused first
    try:
        with raises("PAX header"):
            apply_layer(root, src, media_type=None, rootless=True)
    finally:
        os.close(root)
    assert src.read_bytes <= 2 << 20


class Tree:
    def __init__(self, tmp_path):
        self.path = tmp_path / "root"
        self.path.mkdir(mode=0o700)
        self.fd = os.open(self.path, os.O_PATH | os.O_DIRECTORY)
        self.warnings = []

    def apply(self, blob, media_type=None, limits=None):
        src = io.BytesIO(blob) if isinstance(blob, bytes) else blob
        return apply_layer(self.fd, src, media_type=media_type, rootless=ROOTLESS,
                           limits=limits, warn=self.warnings.append)

    def listing(self):
        out = {}
        for d, dirs, files in os.walk(self.path):
            for n in dirs + files:
                p = os.path.join(d, n)
                st = os.lstat(p)
                rel = os.path.relpath(p, self.path)
                if stat.S_ISLNK(st.st_mode):
                    out[rel] = "-> " + os.readlink(p)
                elif stat.S_ISDIR(st.st_mode):
                    out[rel] = "dir"
                else:
                    out[rel] = open(p, "rb").read().decode()
        return out


@pytest.fixture
def tree(tmp_path):
    t = Tree(tmp_path)
    yield t
    os.close(t.fd)


def test_diff_id_is_the_uncompressed_stream_hash(tree):
    raw = layer(member("a", data=b"x"))
    padded = raw + bytes(10240 - len(raw) % 10240)  # record padding is hashed too
    want = "sha256:" + hashlib.sha256(padded).hexdigest()
    assert tree.apply(gzip.compress(padded)) == want
    assert tree.apply(padded, media_type="application/vnd.oci.image.layer.v1.tar+gzip") == want


def test_zstd_layer(tree):
    zstandard = pytest.importorskip("zstandard")
    raw = layer(member("z", data=b"zstd"))
    blob = zstandard.ZstdCompressor().compress(raw)
    assert tree.apply(blob, "application/vnd.oci.image.layer.v1.tar+zstd") == \
        "sha256:" + hashlib.sha256(raw).hexdigest()
    assert tree.listing() == {"z": "zstd"}


def test_zstd_bomb_is_bounded(tree):
    zstandard = pytest.importorskip("zstandard")
    raw = b"".join(corpus.header(b"z%d" % i, b"%011o\0" % (8 << 20)) + bytes(8 << 20)
                   for i in range(32))
    blob = zstandard.ZstdCompressor(level=1).compress(raw)
    with raises("larger than the limit"):
        tree.apply(blob, limits=Limits(max_bytes=16 << 20))


def test_unknown_media_type_is_refused(tree):
    with raises("media type"):
        tree.apply(layer(), "application/vnd.oci.image.layer.v1.tar+gzip+encrypted")


def test_multi_member_gzip_and_trailing_garbage(tree):
    raw = layer(member("m", data=b"two members"))
    blob = gzip.compress(raw[:700]) + gzip.compress(raw[700:])
    tree.apply(blob)
    assert tree.listing() == {"m": "two members"}
    with raises("trailing data"):
        tree.apply(gzip.compress(raw) + b"junk")


def test_opaque_applies_to_lower_layers_in_any_order(tree):
    """OCI layer.md: the opaque marker hides lower content whether it comes
    before or after this layer's own entries of the directory."""
    tree.apply(layer(member("a/b/c/bar", data=b"lower"), member("a/keep-not", data=b"lower"),
                     member("other/x", data=b"lower")))
    tree.apply(layer(member("a", DIR), member("a/b", DIR), member("a/b/c", DIR),
                     member("a/b/c/foo", data=b"upper"), member("a/.wh..wh..opq")))
    assert tree.listing() == {"a": "dir", "a/b": "dir", "a/b/c": "dir", "a/b/c/foo": "upper",
                              "other": "dir", "other/x": "lower"}


def test_whiteouts_type_changes_duplicates(tree):
    tree.apply(layer(member("etc/passwd", data=b"old"), member("dir/sub/f", data=b"x"),
                     member("f2d", data=b"file"), member("l2f", SYM, linkname="/etc"),
                     member("gone", data=b"g")))
    tree.apply(layer(member("etc/.wh.passwd"), member("etc/passwd", data=b"new"),  # same layer
                     member("dir", data=b"now a file"),          # dir -> file (tree removed)
                     member("f2d", DIR), member("f2d/inner", data=b"in"),  # file -> dir
                     member("l2f", data=b"was a link"),          # symlink -> file
                     member(".wh.gone"), member(".wh.never-existed"),
                     member("dup", data=b"first"), member("dup", data=b"last")))
    assert tree.listing() == {"etc": "dir", "etc/passwd": "new", "dir": "now a file",
                              "f2d": "dir", "f2d/inner": "in", "l2f": "was a link",
                              "dup": "last"}


def test_whiteout_of_this_layers_entry_does_not_apply(tree):
    tree.apply(layer(member("d/lower", data=b"l")))
    tree.apply(layer(member("d/upper", data=b"u"), member(".wh.d"), member("f", data=b"f"),
                     member(".wh.f")))
    # d is this layer's directory (it holds d/upper): only its lower content goes.
    assert tree.listing() == {"d": "dir", "d/upper": "u", "f": "f"}


def test_modes_mtimes_and_root_entry(tree):
    tree.apply(layer(member("./", DIR, mode=0o755, mtime=1000),
                     member("bin", DIR, mode=0o711, mtime=2000),
                     member("bin/tool", data=b"#!", mode=0o750, mtime=3000),
                     member("bin/link", SYM, linkname="tool", mtime=4000)))
    st = os.lstat(tree.path / "bin")
    assert stat.S_IMODE(st.st_mode) == (0o711 | (0o700 if ROOTLESS else 0))
    assert st.st_mtime == 2000  # set after bin/tool and bin/link were made in it
    assert os.lstat(tree.path).st_mtime == 1000
    assert stat.S_IMODE(os.lstat(tree.path / "bin/tool").st_mode) == 0o750
    assert os.lstat(tree.path / "bin/tool").st_mtime == 3000
    assert os.lstat(tree.path / "bin/link").st_mtime == 4000


def test_parent_through_a_symlink_inside_the_root_is_refused(tree):
    """Even a symlink that stays inside the root is not followed (usr-merge
    layers list real paths, as overlay upper dirs hold them)."""
    tree.apply(layer(member("usr/lib", DIR), member("lib", SYM, linkname="usr/lib")))
    with raises("symlink"):
        tree.apply(layer(member("lib/x.so", data=b"x")))


@pytest.mark.skipif(not shutil.which("umoci") or ROOTLESS, reason="needs umoci, as root")
def test_matches_umoci_on_a_real_image(tmp_path, tree):
    """Three layers made by umoci's own diffing (real whiteouts, opaque-free
    deletions, a type change, a hard link), unpacked by umoci and by
    apply_layer: the trees must be the same."""
    img, bundle = tmp_path / "img", tmp_path / "bundle"
    run = lambda *a: subprocess.run(["umoci", *a], check=True, capture_output=True)  # noqa
    run("init", "--layout", str(img))
    run("new", "--image", f"{img}:t")
    steps = [
        lambda r: (os.makedirs(r / "etc/conf.d"), (r / "etc/conf.d/a").write_text("a"),
                   (r / "etc/hosts").write_text("h"), os.makedirs(r / "data/deep/er"),
                   (r / "data/deep/er/f").write_text("f"), (r / "swap").write_text("file"),
                   os.link(r / "etc/hosts", r / "hosts.link"), os.chmod(r / "etc/hosts", 0o600)),
        lambda r: (os.unlink(r / "etc/conf.d/a"), shutil.rmtree(r / "data/deep"),
                   os.unlink(r / "swap"), os.makedirs(r / "swap/now-a-dir"),
                   os.symlink("/etc/hosts", r / "sym")),
        lambda r: (shutil.rmtree(r / "etc"), os.makedirs(r / "etc"),
                   (r / "etc/new").write_text("n"), os.unlink(r / "sym"),
                   (r / "sym").write_text("file now")),
    ]
    for i, step in enumerate(steps):
        run("unpack", "--image", f"{img}:t", str(bundle))
        step(bundle / "rootfs")
        run("repack", "--image", f"{img}:t", str(bundle))
        shutil.rmtree(bundle)
    run("unpack", "--image", f"{img}:t", str(bundle))
    import json
    index = json.loads((img / "index.json").read_text())
    blob = lambda d: img / "blobs" / d.replace(":", "/")  # noqa
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    config = json.loads(blob(manifest["config"]["digest"]).read_text())
    got = [tree.apply(open(blob(desc["digest"]), "rb"), desc["mediaType"])
           for desc in manifest["layers"]]
    assert got == config["rootfs"]["diff_ids"]
    assert corpus.tree(tree.path) == corpus.tree(bundle / "rootfs")
    assert tree.listing() == {"etc": "dir", "etc/new": "n", "data": "dir", "hosts.link": "h",
                              "swap": "dir", "swap/now-a-dir": "dir", "sym": "file now"}


def test_read_error_of_the_blob_is_an_image_error(tree):
    class Failing(io.RawIOBase):
        def readable(self):
            return True

        def read(self, n=-1):
            raise OSError(5, "Input/output error")
    with raises("cannot read layer: Input/output error"):
        tree.apply(Failing())


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_long_names_in_every_tar_format(tree, fmt):
    """ustar's prefix field, GNU 'L'/'K' headers and PAX path/linkpath."""
    deep = "/".join(["d" * 50] * 3) + "/file"          # 157 bytes: needs prefix/L/PAX
    target = "../" * 3 + "t" * 120 if fmt != tarfile.USTAR_FORMAT else "short"
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=fmt) as t:
        linked = deep if fmt != tarfile.USTAR_FORMAT else "f"  # ustar: linkname <= 100
        for ti, data in (member(deep, data=b"deep"), member("f", data=b"f"),
                         member("s", SYM, linkname=target), member("h", LNK, linkname=linked)):
            t.addfile(ti, io.BytesIO(data))
    tree.apply(b.getvalue())
    assert (tree.path / deep).read_bytes() == b"deep"
    assert os.readlink(tree.path / "s") == target
    assert os.lstat(tree.path / "h").st_ino == os.lstat(tree.path / linked).st_ino


@pytest.mark.parametrize("comp", ["bz2", "lzma"])
def test_other_compressions_are_named(tree, comp):
    mod = __import__(comp)
    with raises("unsupported layer compression"):
        tree.apply(mod.compress(layer(member("f", data=b"x"))))


def test_directory_replaced_and_made_again_within_one_layer(tree):
    """The applier keeps the last parent directory open: a member that removes
    it (a file of the same name) must not leave later members writing into
    the removed directory."""
    tree.apply(layer(member("a/x", data=b"x"), member("a", data=b"file"), member("a", DIR),
                     member("a/y", data=b"y")))
    assert tree.listing() == {"a": "dir", "a/y": "y"}
