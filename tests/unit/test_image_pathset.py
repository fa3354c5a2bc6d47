"""The layer applier's record of the paths a layer touched (pathset.py):
a set, and a small one per entry (a 10^6-entry layer must pull in < 1 GB)."""
import os
import random
import tracemalloc

from gpusandbox.image import unpack
from gpusandbox.image.pathset import PathSet


def test_behaves_as_a_set():
    rnd = random.Random(7)
    paths = [b"/".join(b"%x" % rnd.randrange(1 << 20) for _ in range(rnd.randrange(1, 5)))
             for _ in range(20_000)]
    ps, ref = PathSet(), set()
    for p in paths[:12_000]:
        assert ps.add(p) == (p not in ref)
        ref.add(p)
    assert len(ps) == len(ref)
    for p in paths:
        assert (p in ps) == (p in ref)
    assert b"" not in ps and b"never/added" not in ps


def test_applier_memory_per_entry_is_small(tmp_path):
    """What the applier keeps per member: measured while marking 100,000
    paths as a layer of files in directories of 1000 does."""
    rootfd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        app = unpack._Applier(rootfd, True, unpack.Limits())
        n = 100_000
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            for i in range(n):
                app._touch([b"d%05d" % (i // 1000), b"f%04d" % (i % 1000)])
            kept = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
        app.close()
    finally:
        os.close(rootfd)
    assert len(app.touched) == n + n // 1000
    # A Python set of per-path keys costs about 100 bytes an entry.
    assert kept / n < 40, f"{kept / n:.0f} bytes an entry"
