"""The store's read path (storeread.py) and the package itself are all a
cached `run` loads: digest, ref and runimage (whose shared parts live in
those two), the write side (store.py), the config parser and the manifest
module stay unimported, and opening the own store for a lookup creates
nothing in it."""
import os
import subprocess
import sys

import gpusandbox.image as pkg
from gpusandbox.image import config as cfgmod, digest, manifest as mf, ref, runimage, runrec
from gpusandbox.image import storeread
from gpusandbox.image.store import Store, writable
from gpusandbox.image.storeread import StoreReader
from tests.unit.test_image_fastrun import REPO, cached  # noqa: F401

# The CLI's own path with the launch left out: the modules loaded from
# there on are what the cached form adds to the launch path.
_RUN = ("import sys\n"
        "import gpusandbox.cli, gpusandbox.stages.parent as parent\n"
        "seen = []\n"
        "parent.launch = lambda spec: seen.append(spec) or 0\n"
        "before = set(sys.modules)\n"
        "assert gpusandbox.cli.main_run(['--store', sys.argv[1], sys.argv[2]]) == 0\n"
        "print(seen[0].argv)\n"
        "print(sorted(set(sys.modules) - before))\n")


def test_a_cached_run_loads_only_the_read_path(cached):  # noqa: F811
    st, _dig = cached
    out = subprocess.run([sys.executable, "-S", "-c", _RUN, st.root, "docker://fast:1"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    argv, mods = out.stdout.splitlines()
    assert argv == "['/bin/sh', '-c', 'x']"
    # Each module costs about as much as the lookup itself: the package
    # holds the digest check and the reference grammar, storeread the rest.
    # The site's configuration (settingswhere first; where a source exists
    # the files it asks, siterun and sitehooks) is read by every launch,
    # cached or not, and an image reference reads settings.py for the stores.
    from gpusandbox import settingswhere
    site = ["gpusandbox.conffile", "gpusandbox.sitehooks", "gpusandbox.siterun"] \
        if settingswhere.configured() else []
    assert mods == str(sorted(["gpusandbox.image", "gpusandbox.image.storeread",
                               "gpusandbox.settings", "gpusandbox.settingswhere"] + site))


def test_a_lookup_creates_nothing_and_a_write_opens_the_writer(tmp_path):
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    all_stores = runimage.stores(str(root), {})
    assert type(all_stores[0]) is StoreReader
    assert runimage.find(ref.parse("x:1"), all_stores) is None
    assert os.listdir(root) == []
    w = writable(all_stores)
    assert isinstance(w, Store) and writable(all_stores) is w
    assert sorted(os.listdir(root)) == ["blobs", "images", "layers", "locks", "refs", "tmp"]


def test_the_moved_helpers_are_the_same_functions():
    assert cfgmod.command is runrec.command is pkg.command
    assert cfgmod.check_platform is runrec.check_platform is pkg.check_platform
    assert mf.host_platform is runrec.host_platform is pkg.host_platform
    assert mf.format_platform is pkg.format_platform
    assert mf.host_platform()["os"] == "linux"
    # one implementation each, under the old names too
    assert ref.parse is pkg.parse_ref and ref.parse_name is pkg.parse_name
    assert ref.ImageRef is pkg.ImageRef and ref.ImageError is digest.ImageError is pkg.ImageError
    assert digest.parse is pkg.parse_digest and digest.validate is pkg.validate_digest
    assert runimage.find is storeread.find and runimage.apply_user is storeread.apply_user
    assert runimage.stores is storeread.stores and runimage._run_config is storeread.run_config
    assert runimage._store_name is pkg.store_name


def test_the_root_is_held_from_the_store_fd_not_resolved_again(cached):  # noqa: F811
    from gpusandbox.cli import parse_run_args
    from gpusandbox.imageroot import image_root
    st, dig = cached
    rootfs = st.bundle(dig) + "/rootfs"
    want = os.stat(rootfs).st_ino
    spec = parse_run_args(["--store", st.root, "docker://fast:1"])
    runimage.prepare(spec)
    try:
        assert spec.image == rootfs and os.fstat(spec.image_fd).st_ino == want
        # the tree swapped under the same name after the lookup changes nothing
        os.rename(rootfs, rootfs + ".old")
        os.makedirs(rootfs + "/bin")
        shown, fd, config = image_root(spec.image, spec.image_fd)
        assert (shown, fd, config) == (rootfs, spec.image_fd, None)
        assert os.fstat(fd).st_ino == want != os.stat(rootfs).st_ino
    finally:
        os.close(spec.image_fd)


def test_a_fifo_in_place_of_a_store_file_is_refused_not_waited_on(tmp_path):
    """A ref or record replaced by a FIFO (or any non-regular file) is an
    unreadable entry at once: the lookup never blocks in open(2) or read(2)."""
    import errno
    import pytest
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    (root / "refs").mkdir()
    os.mkfifo(root / "refs" / "x")
    st = StoreReader(str(root))
    with pytest.raises(OSError) as e:
        st.read_file("refs/x")
    assert e.value.errno == errno.EINVAL
