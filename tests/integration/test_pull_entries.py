"""Memory of a pull of a layer with very many entries: the pull succeeds
and the pulling process's peak RSS (VmHWM, read in that process: a child's
ru_maxrss also counts the parent it was forked from) stays under 1 GB.

The issue's figure is 10^6 entries; generating and unpacking that takes
minutes, so the suite runs the same path with GSBX_MANY_ENTRIES (default
5,000) and the full size is run on demand:
    GSBX_MANY_ENTRIES=1000000 pytest tests/integration/test_pull_entries.py
(docs/images.md gives the figure measured)."""
import hashlib
import json
import os
import subprocess
import zlib

from .test_images_local import store  # noqa: F401

ENTRIES = int(os.environ.get("GSBX_MANY_ENTRIES", "5000"))
PER_DIR = 1000
_WRAP = ("import sys\n"
         "from gpusandbox.__main__ import main\n"
         "try:\n"
         "    rc = main(sys.argv[1:])\n"
         "finally:\n"
         "    hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM:')]\n"
         "    sys.stderr.write('GSBX-' + hwm[0])\n"
         "sys.exit(rc)\n")


def _header(name, typ=b"0", mode=0o644):
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = b"%07o\0" % mode
    h[108:116] = h[116:124] = b"%07o\0" % 0
    h[124:136] = b"%011o\0" % 0
    h[136:148] = b"%011o\0" % 1700000000
    h[148:156] = b" " * 8
    h[156:157] = typ
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _layout(path, n):
    """An OCI layout of one gzip layer: n members, empty files in
    directories of PER_DIR (the directories counted)."""
    blobs = path / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    z = zlib.compressobj(6, zlib.DEFLATED, 31)
    diff, comp = hashlib.sha256(), hashlib.sha256()
    tmp = path / "layer.tmp"
    size = 0
    with open(tmp, "wb") as f:
        def put(b):
            nonlocal size
            diff.update(b)
            c = z.compress(b)
            comp.update(c)
            size += len(c)
            f.write(c)
        done, d = 0, 0
        while done < n:
            top = b"d%05d/" % d
            chunk = [_header(top, b"5", 0o755)]
            for i in range(min(PER_DIR, n - done) - 1):
                chunk.append(_header(top + b"f%04d" % i))
            done += len(chunk)
            d += 1
            put(b"".join(chunk))
        put(bytes(1024))
        c = z.flush()
        comp.update(c)
        size += len(c)
        f.write(c)
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
             "digest": "sha256:" + comp.hexdigest(), "size": size}
    os.rename(tmp, blobs / comp.hexdigest())
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "amd64")
    cfg = json.dumps({"architecture": arch, "os": "linux", "config": {"Cmd": ["/bin/sh"]},
                      "rootfs": {"type": "layers",
                                 "diff_ids": ["sha256:" + diff.hexdigest()]}}).encode()
    desc = {}
    for kind, data in (("config", cfg),):
        h = hashlib.sha256(data).hexdigest()
        (blobs / h).write_bytes(data)
        desc[kind] = {"mediaType": "application/vnd.oci.image.config.v1+json",
                      "digest": "sha256:" + h, "size": len(data)}
    man = json.dumps({"schemaVersion": 2,
                      "mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "config": desc["config"], "layers": [layer]}).encode()
    mh = hashlib.sha256(man).hexdigest()
    (blobs / mh).write_bytes(man)
    (path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (path / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "sha256:" + mh,
        "size": len(man), "annotations": {"org.opencontainers.image.ref.name": "many"}}]}))
    subprocess.run(["chmod", "-R", "a+rX", str(path)], check=True)
    return "sha256:" + mh


def test_pull_of_many_entries_stays_under_1gb(runner, store, shared_tmp):  # noqa: F811
    lay = shared_tmp / "many"
    dig = _layout(lay, ENTRIES)
    python = os.path.join(os.path.dirname(runner.cli), "python")
    cmd = [python, "-c", _WRAP, "pull", "-q", f"oci:{lay}:many"]
    if runner.mode == "rootless":
        cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
               "--clear-groups", "--"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, cwd="/",
                       timeout=120 + ENTRIES // 200,
                       env=runner.env({"GPUSANDBOX_STORE": str(store)}))
    assert (r.returncode, r.stdout.strip()) == (0, dig), r.stderr
    hwm_kb = int(r.stderr.split("GSBX-VmHWM:")[1].split()[0])
    assert hwm_kb < 1 << 20, f"peak RSS {hwm_kb} kB for {ENTRIES} entries"
    root = store / "images" / dig[7:] / "rootfs"
    assert len(os.listdir(root)) == -(-ENTRIES // PER_DIR)
    print(f"{ENTRIES} entries: peak RSS {hwm_kb / 1024:.1f} MB")
