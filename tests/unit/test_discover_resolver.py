"""gpu/libs.Resolver (discovery's): its by-name lookup in a held directory gives what the
full openat2 walk in the driver root gives, for every kind of link a driver
tree (or a hostile one) may hold."""
import os
import stat

import pytest

from gpusandbox.gpu import libs

LIB = "usr/lib/x86_64-linux-gnu"


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "driver"
    lib = root / LIB
    lib.mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "libcuda.so.9").write_text("host side")   # what an escape would find
    (lib / "libcuda.so.550").write_text("elf")
    (lib / "sub").mkdir()
    (lib / "sub" / "libinner.so.550").write_text("elf")
    links = {
        "libcuda.so.1": "libcuda.so.550",                 # the usual SONAME link
        "libcuda.so": "libcuda.so.1",                     # a chain of two
        "libabs.so.1": f"/{LIB}/libcuda.so.550",           # absolute: inside the root
        "libesc.so.1": "../../../etc/libcuda.so.9",        # climbs: stays in the root
        "libdeep.so.1": "../../../../../../../etc/libcuda.so.9",
        "libsub.so.1": "sub/libinner.so.550",
        "libdot.so": ".",
        "libdotdot.so": "..",
        "libdir.so": "sub",
        "libdangling.so.1": "libnone.so.550",
        "libloop.so.1": "libloop.so.2",
        "libloop.so.2": "libloop.so.1",
        "libproc.so.1": "/proc/self/exe",                  # a magic link: refused
        "libetc.so.1": "/etc/libcuda.so.9",
    }
    for name, target in links.items():
        os.symlink(target, lib / name)
    os.symlink("/" + LIB, root / "lib64")                 # a directory reached by a link
    return root, sorted(links) + ["libcuda.so.550", "sub", "libnone.so", "sub/libinner.so.550"]


def test_the_by_name_lookup_answers_as_the_full_walk(tree):
    root, names = tree
    res = libs.Resolver(str(root))
    try:
        for d in (LIB, "lib64", "/" + LIB, "usr/lib/../lib/x86_64-linux-gnu"):
            for name in names:
                rel = f"{d}/{name}"
                assert res(rel) == res._walk(rel, stat.S_ISREG), rel
    finally:
        res.close()


def test_what_it_finds(tree):
    root, _ = tree
    lib = os.path.realpath(root / LIB)
    res = libs.Resolver(str(root))
    try:
        assert res(f"{LIB}/libcuda.so.1") == f"{lib}/libcuda.so.550"
        assert res(f"lib64/libcuda.so") == f"{lib}/libcuda.so.550"
        assert res(f"{LIB}/libabs.so.1") == f"{lib}/libcuda.so.550"
        # neither a climb nor an absolute link reaches the host's /etc
        assert res(f"{LIB}/libesc.so.1") == f"{os.path.realpath(root)}/etc/libcuda.so.9"
        assert res(f"{LIB}/libetc.so.1") == f"{os.path.realpath(root)}/etc/libcuda.so.9"
        for name in ("libdangling.so.1", "libloop.so.1", "libproc.so.1", "libdir.so", "sub"):
            assert res(f"{LIB}/{name}") is None, name
        assert res(f"{LIB}/sub", stat.S_ISDIR) == f"{lib}/sub"
        # the directory was resolved once and is held
        assert set(res._dirs) >= {LIB, "lib64"}
    finally:
        res.close()
    assert res._dirs and all(held is None or _closed(held[0]) for held in res._dirs.values())


def _closed(fd):
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_a_missing_directory_falls_back_to_the_walk(tree):
    root, _ = tree
    res = libs.Resolver(str(root))
    try:
        assert res("usr/none/libcuda.so.1") is None
        assert res("usr/none/libcuda.so.1") is None     # asked again: still the walk
        assert res._dirs["usr/none"] is None
    finally:
        res.close()
