"""Time GPU discovery in-process: `python disco.py DRIVER_ROOT N`.

Run with gpusandbox's own interpreter.  Prints one JSON object: the import
time of the discovery module, the first (cold-cache) call, and the median,
min and max of N further calls, plus the size of the ld.so.cache read."""
import json
import os
import statistics
import struct
import sys
import time

NEW_MAGIC = b"glibc-ld.so.cache1.1"


def ldcache_entries(path):
    """Entry count from the glibc 1.1 header (magic, then uint32 nlibs),
    found after the optional old-format section."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    off = data.find(NEW_MAGIC)
    if off < 0:
        return None
    return struct.unpack_from("<I", data, off + len(NEW_MAGIC))[0]


def main(argv):
    root, n = argv[0], int(argv[1])
    t0 = time.perf_counter_ns()
    from gpusandbox.gpu import discover as d
    t1 = time.perf_counter_ns()
    host = d.discover(driver_root=root, environ={})
    t2 = time.perf_counter_ns()
    samples = []
    for _ in range(n):
        a = time.perf_counter_ns()
        d.discover(driver_root=root, environ={})
        samples.append((time.perf_counter_ns() - a) / 1e6)
    print(json.dumps({
        "import_ms": round((t1 - t0) / 1e6, 3),
        "first_call_ms": round((t2 - t1) / 1e6, 3),
        "median_ms": round(statistics.median(samples), 3),
        "min_ms": round(min(samples), 3),
        "max_ms": round(max(samples), 3),
        "n": n,
        "ldcache_entries": ldcache_entries(os.path.join(root, "etc/ld.so.cache")),
        "gpus": len(host.gpus),
        "libraries": len(host.libs),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
