"""gpu/libs._candidates: the rows of a loader cache whose key may name a
driver library, found by searching the string table for the families'
prefixes instead of reading every key (issue 24, a lean launch path).  It
must never drop a row the full scan would keep, on caches ldconfig itself
wrote (which may store a key as the tail of another string) and on the
simulated host's."""
import os

import pytest

from gpusandbox.gpu import ldcache, libs
from gpusandbox.gpu.discover import _FAMILIES


def _full_scan(data, base, end, rows, families):
    out = []
    for row in rows:
        name = ldcache._cstr(data, row[1], base, end)
        dot = name.find(b".so")
        if dot >= 0 and name[:dot] in families:
            out.append(row)
    return out


def _check(path, families):
    with open(path, "rb") as f:
        data = f.read()
    base, end, rows = ldcache.iter_raw(data)
    want = _full_scan(data, base, end, rows, families)
    _, _, table, nlibs = ldcache.entry_table(data)
    got = libs._candidates(data, base, end, table, nlibs, families)
    assert got == [r for r in rows if r in got]          # in file order, as read
    assert all(r in got for r in want)
    # and only rows whose key starts with a family's first five bytes
    prefixes = tuple({f[:5] for f in families})
    assert all(ldcache._cstr(data, r[1], base, end).startswith(prefixes) for r in got)
    return want, got, rows


@pytest.mark.skipif(not os.path.exists("/etc/ld.so.cache"), reason="no loader cache here")
def test_the_hosts_own_cache_written_by_ldconfig():
    families = frozenset({b"libc", b"libm", b"libz", b"libpthread", b"libstdc++", b"libgcc_s"})
    want, got, rows = _check("/etc/ld.so.cache", families)
    assert want and len(got) < len(rows)


def test_a_key_stored_as_the_tail_of_a_path_is_found():
    # A string table where the key "libcuda.so.1" is the end of the value
    # "/lib/libcuda.so.1" (tail merging), as ldconfig's string table may store it.
    strings = b"\0/lib/libcuda.so.1\0/lib/libfoo.so.2\0"
    tail = strings.index(b"libcuda.so.1")
    rows = [(0x0303, tail, 1, 0, 0), (0x0303, strings.index(b"libfoo"), 19, 0, 0)]
    entries = b"".join(ldcache._ENTRY.pack(*r) for r in rows)
    data = entries + strings
    got = libs._candidates(data, len(entries), len(data), 0, len(rows),
                           frozenset({b"libcuda"}))
    assert got == [rows[0]]


def test_a_written_cache_of_a_driver_among_many_libraries(tmp_path):
    # ldcache.build (the simulated host's writer): 33 driver families, each
    # under its SONAME and its development link, among 2,000 other libraries
    # (some named like the driver's: libnvme, libcups, libGLU, libEGL).
    entries = []
    for fam in sorted(_FAMILIES):
        f = fam.decode()
        entries += [ldcache.Entry(f"{f}.so.1".encode(), f"/usr/lib/{f}.so.1".encode()),
                    ldcache.Entry(f"{f}.so".encode(), f"/usr/lib/{f}.so".encode())]
    for i in range(2000):
        name = ("libnvme", "libcups", "libGLU", "libEGL", "libpad")[i % 5] + f"{i}"
        entries.append(ldcache.Entry(f"{name}.so.1".encode(), f"/usr/lib/{name}.so.1".encode()))
    path = tmp_path / "ld.so.cache"
    path.write_bytes(ldcache.build(entries))
    want, got, rows = _check(str(path), _FAMILIES)
    assert len(want) == 2 * len(_FAMILIES) and len(got) < len(rows)
