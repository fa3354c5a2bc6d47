"""The seal of a store other users read (image/unpack.py, the package's
SEAL format, plan.sealed_dirs): no owner but root or the publisher, no
group/other write bit, and the directories it changed recorded as the
layer had them."""
import io
import os
import stat
import tarfile

import pytest

from gpusandbox.image import dump_seal, load_seal
from gpusandbox.image.unpack import apply_layer
from tests.unit.unpack_corpus import DIR, layer, member

FIFO = tarfile.FIFOTYPE

ROOTLESS = os.geteuid() != 0


def test_seal_round_trip_and_strict_reading():
    dirs = [(b"var/tmp", 0, 0, 0o1777), (b"", None, None, 0o777), (b"app", 994, 993, 0o755)]
    data = dump_seal(dirs)
    assert load_seal(data) == (("", None, None, 0o777), ("app", 994, 993, 0o755),
                               ("var/tmp", 0, 0, 0o1777))
    assert load_seal(b"gsbx-seal-1\0") == ()
    for bad in (None, b"", data[:-1], data + b"x\0", data.replace(b"var/tmp", b"var/../x"),
                data.replace(b"var/tmp", b"/var/tmp"), data.replace(b"1777", b"17777"),
                data.replace(b"1777", b"1787"), data.replace(b"994", b"4294967295"),
                data.replace(b"994", b"-1"), b"gsbx-seal-2\0"):
        assert load_seal(bad) is None, bad


def test_a_sealed_layer_gives_no_one_else_write_access(tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    blob = layer(member("app", DIR, uid=1234, gid=1234, mode=0o755),
                 member("app/run.sh", data=b"x", uid=1234, gid=1234, mode=0o4775),
                 member("app/open.sh", data=b"y", mode=0o777),
                 member("app/fifo", FIFO, mode=0o666),
                 member("var", DIR), member("var/tmp", DIR, mode=0o1777),
                 member("srv", DIR, mode=0o775))
    seal = {}
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        apply_layer(fd, io.BytesIO(blob), media_type=None, rootless=ROOTLESS, seal=seal)
    finally:
        os.close(fd)
    me = os.geteuid() if ROOTLESS else 0
    for dirpath, dirs, files in os.walk(root):
        for p in [dirpath] + [os.path.join(dirpath, n) for n in files]:
            st = os.lstat(p)
            assert st.st_uid == me and not st.st_mode & 0o022, (p, oct(st.st_mode))
    modes = {n: stat.S_IMODE(os.lstat(root / n).st_mode) for n in
             ("app", "app/run.sh", "app/open.sh", "var/tmp", "srv")}
    if ROOTLESS:
        assert modes == {"app": 0o755, "app/run.sh": 0o4755, "app/open.sh": 0o755,
                         "var/tmp": 0o1755, "srv": 0o755}
        assert seal == {b"var/tmp": (None, None, 0o1777), b"srv": (None, None, 0o775)}
    else:
        # setuid meant "run as uid 1234": given to root, it is dropped.
        assert modes == {"app": 0o755, "app/run.sh": 0o755, "app/open.sh": 0o755,
                         "var/tmp": 0o1755, "srv": 0o755}
        assert seal == {b"app": (1234, 1234, 0o755), b"var/tmp": (0, 0, 0o1777),
                        b"srv": (0, 0, 0o775)}


@pytest.mark.parametrize("userns,want", [
    ("host", [("var/tmp", 0, 0, 0o1777), ("app", 1234, 1234, 0o755), ("", 5, 5, 0o755)]),
    ("single", [("var/tmp", None, None, 0o1777)]),
])
def test_the_sandbox_gets_back_what_it_can_show(userns, want):
    from types import SimpleNamespace

    from gpusandbox.plan import sealed_dirs
    spec = SimpleNamespace(image_dirs=(("var/tmp", 0, 0, 0o1777), ("tmp", 0, 0, 0o1777),
                                       ("app", 1234, 1234, 0o755), ("dev/shm", 0, 0, 0o1777),
                                       ("", 5, 5, 0o755)))
    # /tmp and /dev are the sandbox's own filesystems: nothing to show there.
    assert sealed_dirs(SimpleNamespace(spec=spec, userns=userns)) == want
