"""Hostile layers for gpusandbox.image.unpack, and the checks of what each
must do.  Used in-process by tests/unit/test_unpack.py (as root) and run as
a script by tests/integration/test_unpack_rootless.py as the unprivileged
test user:  python unpack_corpus.py WORKDIR  ->  one JSON object per case.

Every case applies its layers to WORKDIR/CASE/root, next to a canary tree
WORKDIR/CASE/outside that the layers aim at (by relative and absolute
names, symlinks and links); after it the canary must be unchanged and
nothing new may exist beside the root, whatever the outcome."""
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import sys
import tarfile

from gpusandbox.image.digest import ImageError
from gpusandbox.image.unpack import Limits, apply_layer

REG, DIR, SYM, LNK = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE


def member(name, type=REG, data=b"", mode=None, uid=0, gid=0, linkname="", pax=None,
           devmajor=0, devminor=0, mtime=1_600_000_000):
    t = tarfile.TarInfo(name)
    t.type = type
    t.size = len(data) if type == REG else 0
    t.mode = mode if mode is not None else (0o755 if type == DIR else 0o644)
    t.uid, t.gid, t.linkname, t.mtime = uid, gid, linkname, mtime
    t.devmajor, t.devminor = devmajor, devminor
    if pax:
        t.pax_headers = pax
    return t, data


def layer(*members, compress=None):
    b = io.BytesIO()
    with tarfile.open(fileobj=b, mode="w", format=tarfile.PAX_FORMAT) as t:
        for ti, data in members:
            t.addfile(ti, io.BytesIO(data) if ti.type == REG else None)
    raw = b.getvalue()
    return gzip.compress(raw, 1) if compress == "gzip" else raw


def header(name=b"f", size=b"%011o\0" % 0, typ=b"0", mode=b"0000644\0", prefix=b""):
    """One hand-made ustar header block with a correct checksum; `size` is
    the raw 12-byte field (octal or base-256)."""
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108] = mode
    h[108:116] = b"0000000\0"
    h[116:124] = b"0000000\0"
    h[124:136] = size.ljust(12, b"\0")[:12]
    h[136:148] = b"00000000000\0"
    h[156:157] = typ
    h[257:265] = b"ustar\x0000"
    h[345:345 + len(prefix)] = prefix
    h[148:156] = b"        "
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


class Endless(io.RawIOBase):
    """A stream that never ends (repeating `chunk` after `head`), counting
    what was read: a layer must be refused without reading it all."""

    def __init__(self, head, chunk=bytes(65536)):
        self.head, self.chunk, self.read_bytes = head, chunk, 0

    def readable(self):
        return True

    def read(self, n=-1):
        n = 65536 if n is None or n < 0 else n
        if self.head:
            b, self.head = self.head[:n], self.head[n:]
        else:
            b = (self.chunk * (n // len(self.chunk) + 1))[:n]
        self.read_bytes += len(b)
        return b


class GzipZeroBomb(io.RawIOBase):
    """A tar stream of `total` bytes: zero-filled files of 64 MiB, gzip
    compressed about 1000:1 (concatenated gzip members of 1 MiB of zeros),
    made lazily: 10 GiB costs about 10 MiB to read and nothing to build."""

    FILE = 64 << 20

    def __init__(self, total):
        self.mib = gzip.compress(bytes(1 << 20), 9)
        self.files, self.i, self.buf = total // self.FILE, 0, b""

    def readable(self):
        return True

    def read(self, n=-1):
        n = 1 << 20 if n is None or n < 0 else n
        while len(self.buf) < n and self.i < self.files * 65:
            k, self.i = self.i % 65, self.i + 1
            self.buf += (gzip.compress(header(b"zeros%d" % (self.i // 65),
                                              b"%011o\0" % self.FILE)) if k == 0 else self.mib)
        b, self.buf = self.buf[:n], self.buf[n:]
        return b


def tree(path):
    out = {}
    for d, dirs, files in os.walk(path):
        for n in sorted(dirs + files):
            p = os.path.join(d, n)
            st = os.lstat(p)
            body = ""
            if stat.S_ISLNK(st.st_mode):
                body = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    body = hashlib.sha256(f.read()).hexdigest()
            out[os.path.relpath(p, path)] = (st.st_mode, st.st_uid, st.st_nlink, body)
    st = os.lstat(path)
    out["."] = (st.st_mode, st.st_uid)
    return out


def xattrs(path):
    return sorted(os.listxattr(path, follow_symlinks=False))


# --- the cases ------------------------------------------------------------------
# Each: (name, layers(outside) -> [blob or stream, ...], expect, check, limits)
# expect: "error" (ImageError whose message holds `check` if a str) or "ok"
# (then check(root, ctx) returns a list of failures).  ctx: rootless, uid,
# warnings, outside.
CASES = []


def case(name, expect, check=None, limits=None):
    def deco(fn):
        CASES.append((name, fn, expect, check, limits))
        return fn
    return deco


@case("dotdot", "error", "'..'")
def _(o):
    return [layer(member("../outside/evil", data=b"x"))]


@case("dotdot_inner", "error", "'..'")
def _(o):
    return [layer(member("a/../../outside/evil", data=b"x"))]


@case("dotdot_hardlink", "error", "'..'")
def _(o):
    return [layer(member("h", LNK, linkname="../outside/canary"))]


def _abs_ok(root, ctx):
    p = os.path.join(root, ctx["outside"].lstrip("/"), "evil")
    return [] if open(p, "rb").read() == b"x" else ["absolute member not placed in the root"]


@case("absolute_name", "ok", _abs_ok)
def _(o):
    return [layer(member(o + "/evil", data=b"x"))]


for _n, _t in (("abs", None), ("rel", "../outside"), ("relroot", "../../../../../..{o}")):
    def _mk(t):
        def fn(o):
            tgt = o if t is None else t.format(o=o)
            return [layer(member("lnk", SYM, linkname=tgt), member("lnk/evil", data=b"x"))]
        return fn
    case(f"symlink_{_n}_then_member", "error", "symlink")(_mk(_t))


@case("symlink_chained_then_member", "error", "symlink")
def _(o):
    return [layer(member("a", SYM, linkname="b"), member("b", SYM, linkname="c"),
                  member("c", SYM, linkname="../outside"), member("a/evil", data=b"x"))]


@case("symlink_later_layer_member", "error", "symlink")
def _(o):
    return [layer(member("lnk", SYM, linkname=o)), layer(member("lnk/evil", data=b"x"))]


@case("symlink_later_layer_dir_member", "error", "symlink")
def _(o):
    return [layer(member("lnk", SYM, linkname=o)),
            layer(member("lnk/sub", DIR, mode=0o777))]


def _replaced(root, ctx):
    st = os.lstat(os.path.join(root, "f"))
    fails = [] if stat.S_ISREG(st.st_mode) else ["f is not a regular file"]
    d = os.lstat(os.path.join(root, "d"))
    if not stat.S_ISDIR(d.st_mode):
        fails.append("d is not a directory")
    return fails


@case("symlink_replaced_by_file_and_dir", "ok", _replaced)
def _(o):
    return [layer(member("f", SYM, linkname=o + "/canary"), member("d", SYM, linkname=o)),
            layer(member("f", data=b"overwrite", mode=0o4777, uid=1234),
                  member("d", DIR, mode=0o777, uid=1234))]


@case("root_as_symlink", "error", "names the image root")
def _(o):
    return [layer(member("./", SYM, linkname=o), member("evil", data=b"x"))]


@case("root_as_hardlink", "error", "names the image root")
def _(o):
    return [layer(member("f", data=b"x"), member(".", LNK, linkname="f"))]


@case("hardlink_absolute_outside", "error", "not an earlier member")
def _(o):
    return [layer(member("h", LNK, linkname=o + "/canary"))]


@case("hardlink_to_symlink", "error", "symlink")
def _(o):
    return [layer(member("s", SYM, linkname=o + "/canary"), member("h", LNK, linkname="s"))]


@case("hardlink_through_symlink_dir", "error")
def _(o):
    return [layer(member("d", SYM, linkname=o), member("h", LNK, linkname="d/canary"))]


@case("hardlink_to_earlier_layer", "error", "not an earlier member")
def _(o):
    return [layer(member("f", data=b"x")), layer(member("h", LNK, linkname="f"))]


@case("hardlink_to_later_member", "error", "not an earlier member")
def _(o):
    return [layer(member("h", LNK, linkname="f"), member("f", data=b"x"))]


@case("hardlink_to_directory", "error", "not a regular file")
def _(o):
    return [layer(member("d", DIR), member("h", LNK, linkname="d"))]


def _hardlink_ok(root, ctx):
    a, b = os.lstat(os.path.join(root, "a/f")), os.lstat(os.path.join(root, "h"))
    return [] if a.st_ino == b.st_ino and a.st_nlink == 2 else ["h is not a link of a/f"]


@case("hardlink_same_layer", "ok", _hardlink_ok)
def _(o):
    return [layer(member("a/f", data=b"x"), member("h", LNK, linkname="./a/f"))]


@case("whiteout_through_symlink", "error", "symlink")
def _(o):
    return [layer(member("lnk", SYM, linkname=o)), layer(member("lnk/.wh.canary"))]


@case("opaque_through_symlink", "error", "symlink")
def _(o):
    return [layer(member("lnk", SYM, linkname=o)), layer(member("lnk/.wh..wh..opq"))]


def _link_gone(root, ctx):
    return ["lnk still there"] if os.path.lexists(os.path.join(root, "lnk")) else []


@case("whiteout_of_symlink_removes_the_link", "ok", _link_gone)
def _(o):
    return [layer(member("lnk", SYM, linkname=o)), layer(member(".wh.lnk"))]


@case("whiteout_of_symlink_to_dir_removes_the_link", "ok", _link_gone)
def _(o):
    return [layer(member("lnk", SYM, linkname="../outside")), layer(member(".wh.lnk"))]


for _n, _m in (("bare", ".wh."), ("dot", ".wh.."), ("dotdot", ".wh..."),
               ("bare_in_dir", "a/.wh.")):
    case(f"whiteout_{_n}", "error", "whiteout")(
        (lambda m: lambda o: [layer(member("a/x", data=b"keep")), layer(member(m))])(_m))


@case("whiteout_name_as_directory", "error", "whiteout name used as a directory")
def _(o):
    return [layer(member(".wh.x/evil", data=b"x"))]


def _devices(root, ctx):
    fails = []
    for n in ("dev/sda", "dev/loop0", "lowerdev"):
        if os.path.lexists(os.path.join(root, n)):
            fails.append(f"{n} was created")
    if not stat.S_ISFIFO(os.lstat(os.path.join(root, "fifo")).st_mode):
        fails.append("fifo is not a FIFO")
    if len(ctx["warnings"]) != 1 or "3 device nodes" not in ctx["warnings"][0]:
        fails.append(f"warnings {ctx['warnings']!r}")
    return fails


@case("device_nodes_and_fifo", "ok", _devices)
def _(o):
    return [layer(member("lowerdev", data=b"lower")),
            layer(member("dev/sda", tarfile.CHRTYPE, devmajor=8, devminor=0, mode=0o666),
                  member("dev/loop0", tarfile.BLKTYPE, devmajor=7, devminor=0, mode=0o666),
                  member("lowerdev", tarfile.CHRTYPE, devmajor=1, devminor=3, mode=0o666),
                  member("fifo", tarfile.FIFOTYPE, mode=0o640))]


def _setuid(root, ctx):
    st = os.lstat(os.path.join(root, "suid"))
    want_uid = ctx["uid"] if ctx["rootless"] else 0
    fails = []
    if st.st_uid != want_uid:
        fails.append(f"owner {st.st_uid}, expected {want_uid}")
    if stat.S_IMODE(st.st_mode) & 0o6000 != 0o6000:
        fails.append(f"mode {oct(st.st_mode)}: setuid/setgid not kept")
    own = os.lstat(os.path.join(root, "owned"))
    if not ctx["rootless"] and (own.st_uid, own.st_gid) != (1234, 5678):
        fails.append(f"owned: {own.st_uid}:{own.st_gid}")
    if ctx["rootless"] and own.st_uid != ctx["uid"]:
        fails.append(f"owned: uid {own.st_uid} rootless")
    return fails


@case("setuid_and_owner", "ok", _setuid)
def _(o):
    return [layer(member("suid", data=b"#!/bin/sh\n", mode=0o6755),
                  member("owned", data=b"x", uid=1234, gid=5678))]


def _no_xattrs(root, ctx):
    got = xattrs(os.path.join(root, "cap"))
    return [f"xattrs applied: {got}"] if got else []


@case("file_caps_and_xattrs", "ok", _no_xattrs)
def _(o):
    pax = {"SCHILY.xattr.security.capability":
           "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
           "SCHILY.xattr.user.note": "x", "SCHILY.xattr.trusted.overlay.opaque": "y",
           "SCHILY.xattr.security.selinux": "system_u:object_r:shadow_t:s0"}
    return [layer(member("cap", data=b"\x7fELF", mode=0o755, pax=pax))]


def _readonly(root, ctx):
    names = sorted(os.listdir(os.path.join(root, "ro")))
    return [] if names == ["g"] else [f"ro holds {names}"]


@case("readonly_dir_updated_by_a_later_layer", "ok", _readonly)
def _(o):
    """Rootless, the caller has no DAC override: directories keep u+rwx so a
    later layer can still add and remove entries (and the store can remove
    the tree)."""
    return [layer(member("ro", DIR, mode=0o555), member("ro/f", data=b"x", mode=0),
                  member("ro/sub", DIR, mode=0), member("ro/sub/x", data=b"x", mode=0)),
            layer(member("ro/g", data=b"y", mode=0o400), member("ro/.wh.f"),
                  member("ro/.wh.sub"))]


def _zstd_ok(root, ctx):
    return [] if open(os.path.join(root, "z"), "rb").read() == b"zstd" else ["z content"]


@case("zstd_layer", "ok", _zstd_ok)
def _(o):
    import zstandard  # a dependency of the package: must be installed with it
    return [zstandard.ZstdCompressor().compress(layer(member("z", data=b"zstd")))]


# --- bombs and garbage ---------------------------------------------------------
@case("zero_bomb_total_limit", "error", "larger than the limit",
      Limits(max_bytes=64 << 20))
def _(o):
    return [GzipZeroBomb(10 << 30)]


@case("zero_bomb_ratio", "error", "decompression bomb", Limits(ratio_floor=32 << 20))
def _(o):
    return [GzipZeroBomb(10 << 30)]


@case("entry_bomb", "error", "entry limit", Limits(max_entries=1000))
def _(o):
    return [layer(*(member(f"d/{i}") for i in range(2000)))]


@case("negative_size", "error", "negative size")
def _(o):
    return [header(size=b"\xff" * 12) + bytes(1024)]


@case("huge_size", "error", "exceeds")
def _(o):
    return [Endless(header(size=b"\x80" + (1 << 80).to_bytes(11, "big")))]


@case("huge_size_octal", "error", "exceeds", Limits(max_file=1 << 20))
def _(o):
    return [Endless(header(size=b"%011o\0" % (8 << 20)))]


@case("truncated_in_data", "error", "truncated")
def _(o):
    return [layer(member("f", data=os.urandom(5000)))[:2048]]


@case("truncated_gzip", "error", "truncated")
def _(o):
    return [layer(member("f", data=os.urandom(50000)), compress="gzip")[:20000]]


@case("truncated_no_end_marker", "error", "end-of-archive")
def _(o):
    return [layer(member("f", data=b"x"))[:1024]]


@case("not_tar", "error", "not a tar archive")
def _(o):
    return [b"this is not a tar archive\n" * 100]


@case("empty", "error", "empty")
def _(o):
    return [b""]


@case("garbage_gzip", "error", "gzip")
def _(o):
    return [b"\x1f\x8b" + os.urandom(4096)]


@case("endless_pax_header", "error", "PAX header")
def _(o):
    return [Endless(header(b"././@PaxHeader", size=b"%011o\0" % (1 << 32), typ=b"x"),
                    chunk=b"99999 path=" + b"a" * 65536)]


@case("endless_pax_header_chain", "error", "in a row")
def _(o):
    rec = b"16 comment=xxxx\n"
    one = header(b"././@PaxHeader", size=b"%011o\0" % len(rec), typ=b"x") + rec.ljust(512, b"\0")
    return [Endless(one, chunk=one)]


@case("endless_gnu_longname", "error", "GNU long name")
def _(o):
    return [Endless(header(b"././@LongLink", size=b"%011o\0" % (1 << 30), typ=b"L"))]


@case("overlong_name", "error", "exceeds the limit")
def _(o):
    return [layer(member("a/" * 2100 + "f", data=b"x"))]


@case("overlong_component", "error", "255 bytes")
def _(o):
    return [layer(member("a" * 300, data=b"x"))]


@case("nul_in_pax_path", "error", "NUL")
def _(o):
    return [layer(member("f", data=b"x", pax={"path": "ok\x00../../outside/evil"}))]


@case("sparse_member", "error", "sparse")
def _(o):
    return [layer(member("f", data=b"x", pax={"GNU.sparse.major": "1",
                                                "GNU.sparse.minor": "0"}))]


def run_case(workdir, name, fn, expect, check, limits, rootless):
    """Apply one case in workdir/name; returns a list of failures."""
    base = os.path.join(workdir, name)
    root, outside = os.path.join(base, "root"), os.path.join(base, "outside")
    os.makedirs(os.path.join(outside, "sub"))
    with open(os.path.join(outside, "canary"), "w") as f:
        f.write("canary\n")
    os.mkdir(root, 0o700)
    before = tree(outside)
    warnings, fails = [], []
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        for blob in fn(outside):
            src = io.BytesIO(blob) if isinstance(blob, bytes) else blob
            apply_layer(rootfd, src, media_type=None, rootless=rootless,
                        limits=limits, warn=warnings.append)
        outcome, msg = "ok", ""
    except ImageError as e:
        outcome, msg = "error", e.line()
    finally:
        os.close(rootfd)
    if outcome != expect:
        fails.append(f"expected {expect}, got {outcome} {msg}")
    elif expect == "error" and isinstance(check, str) and check not in msg:
        fails.append(f"error {msg!r} does not say {check!r}")
    elif expect == "ok" and check:
        fails += check(root, {"rootless": rootless, "uid": os.getuid(), "warnings": warnings,
                              "outside": outside})
    if tree(outside) != before:
        fails.append("the canary tree outside the root changed")
    if sorted(os.listdir(base)) != ["outside", "root"]:
        fails.append(f"new entries beside the root: {sorted(os.listdir(base))}")
    # Rootless: the caller can always remove what it unpacked.
    shutil.rmtree(base)
    return fails


def main(workdir):
    rootless = os.geteuid() != 0
    results = {}
    for name, fn, expect, check, limits in CASES:
        try:
            results[name] = run_case(workdir, name, fn, expect, check, limits, rootless)
        except Exception as e:  # reported per case, the run goes on
            results[name] = [f"{type(e).__name__}: {e}"]
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
