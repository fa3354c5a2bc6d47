"""The store's read path (storeread.py) is all a cached `run` loads: the
write side (store.py), the config parser and the manifest module stay
unimported, and opening the own store for a lookup creates nothing in it."""
import os
import subprocess
import sys

from gpusandbox.image import config as cfgmod, manifest as mf, runimage, runrec
from gpusandbox.image.store import Store
from gpusandbox.image.storeread import StoreReader
from tests.unit.test_image_fastrun import REPO, cached  # noqa: F401

_RUN = ("import sys\n"
        "from gpusandbox.cli import parse_run_args\n"
        "from gpusandbox.image.runimage import prepare\n"
        "s = parse_run_args(['--store', sys.argv[1], sys.argv[2]])\n"
        "prepare(s)\n"
        "print(s.argv)\n"
        "print(sorted(m for m in sys.modules if m.startswith('gpusandbox.image.')))\n")


def test_a_cached_run_loads_only_the_read_path(cached):  # noqa: F811
    st, _dig = cached
    out = subprocess.run([sys.executable, "-S", "-c", _RUN, st.root, "docker://fast:1"],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    argv, mods = out.stdout.splitlines()
    assert argv == "['/bin/sh', '-c', 'x']"
    # The run record's reader is storeread's: runrec.py (its writer) stays out.
    assert mods == str(sorted(["gpusandbox.image.digest", "gpusandbox.image.ref",
                               "gpusandbox.image.runimage", "gpusandbox.image.storeread"]))


def test_a_lookup_creates_nothing_and_a_write_opens_the_writer(tmp_path):
    root = tmp_path / "s"
    root.mkdir(mode=0o700)
    all_stores = runimage.stores(str(root), {})
    assert type(all_stores[0]) is StoreReader
    assert runimage.find(runimage.refmod.parse("x:1"), all_stores) is None
    assert os.listdir(root) == []
    w = all_stores.writable()
    assert isinstance(w, Store) and all_stores.writable() is w
    assert sorted(os.listdir(root)) == ["blobs", "images", "layers", "locks", "refs", "tmp"]


def test_the_moved_helpers_are_the_same_functions():
    assert cfgmod.command is runrec.command and cfgmod.check_platform is runrec.check_platform
    assert mf.host_platform is runrec.host_platform
    assert mf.host_platform()["os"] == "linux"


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
