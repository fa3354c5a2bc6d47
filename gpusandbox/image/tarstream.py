"""A bounded, streaming reader of layer blobs: decompression (gzip, zstd or
none, chosen by the stream's magic bytes) and tar headers (ustar, PAX, GNU
long names), parsed here rather than by `tarfile`.

Everything in a layer is hostile.  `tarfile` reads a whole PAX header into
memory whatever its declared size and walks GNU sparse maps without bounds;
here every header that is kept in memory has a size limit checked before a
byte of it is read, the number of consecutive meta headers is bounded, and
the decompressed stream is counted (total bytes and the ratio to the
compressed input) as it is produced, so a bomb ends after at most one
chunk past its limit.

The diff_id is the sha256 of the whole decompressed stream, end blocks and
any trailing bytes included, hashed as it streams."""
import dataclasses
import hashlib
import re
import zlib

from ..errors import printable
from .digest import ImageError

BLOCK = 512
CHUNK = 1 << 20
_ZERO = bytes(BLOCK)
# Headers that describe the next member rather than being one: PAX
# extended ('x'), PAX global ('g'), GNU long name ('L') and long link ('K').
_META = frozenset(b"xgLK")
_MAX_META_RUN = 16
_DEC = re.compile(rb"[0-9]{1,20}")
_TIME = re.compile(rb"(-?)([0-9]{1,20})(?:\.([0-9]{1,30}))?")


@dataclasses.dataclass(frozen=True)
class Limits:
    """Bounds for one layer.  The defaults admit the largest real layers we
    know (CUDA and framework images: a few 10^5 entries, conda or source
    trees up to 10^6; files of some GiB) and refuse the bombs of the threat
    model: a 10 GiB zero file compressed 1000:1, an endless PAX header, more
    entries than the limit.  Memory per entry is small and flat (pathset.py:
    a 10^6-entry layer pulls in well under 1 GB, docs/images.md), so the
    entry limit bounds time and inodes rather than memory.

    max_entries   members of one layer (2 000 000)
    max_bytes     decompressed bytes of one layer, tar framing included (64 GiB)
    max_file      size of one regular file (64 GiB)
    max_ratio     decompressed/compressed bytes, checked once `ratio_floor`
                  decompressed bytes are passed (200 after 512 MiB; gzip's
                  best is about 1000:1, real layers compress 2-10:1);
                  None disables it
    max_path      bytes of a member name or link target (4096, PATH_MAX)
    max_depth     components of a member name (256)
    max_pax       bytes of one PAX header (1 MiB, as Go's archive/tar)"""
    max_entries: int = 2_000_000
    max_bytes: int = 64 << 30
    max_file: int = 64 << 30
    max_ratio: int | None = 200
    ratio_floor: int = 512 << 20
    max_path: int = 4096
    max_depth: int = 256
    max_pax: int = 1 << 20


def _bad(why, hint=None):
    return ImageError("invalid layer", why, hint)


def _shown(name):
    return printable(name[:200].decode("utf-8", "backslashreplace"))


class _Input:
    """The compressed blob, counted, with the first bytes kept for sniffing."""

    def __init__(self, f):
        self.f = f
        self.n = 0
        self.head = b""

    def peek(self, n):
        while len(self.head) < n:
            b = self.f.read(n - len(self.head))
            if not b:
                break
            self.n += len(b)
            self.head += b
        return self.head[:n]

    def read(self, n):
        if self.head:
            b, self.head = self.head[:n], self.head[n:]
            return b
        b = self.f.read(n)
        self.n += len(b)
        return b


class _Gzip:
    """Multi-member gzip with bounded output per read (zlib max_length):
    trailing bytes that are not another gzip member, or input that ends
    inside a member, are errors."""

    def __init__(self, src):
        self.src = src
        self.d = zlib.decompressobj(31)
        self.tail = b""
        self.done = False

    def read(self, n):
        while not self.done:
            if self.d is None:
                data = self.tail or self.src.read(CHUNK)
                while 0 < len(data) < 2:
                    more = self.src.read(CHUNK)
                    if not more:
                        break
                    data += more
                if not data:
                    self.done = True
                    break
                if data[:2] != b"\x1f\x8b":
                    raise _bad("trailing data after the gzip stream")
                self.d, self.tail = zlib.decompressobj(31), data
            if not self.tail:
                self.tail = self.src.read(CHUNK)
                if not self.tail:
                    raise _bad("truncated: the gzip stream ends early")
            try:
                out = self.d.decompress(self.tail, n)
            except zlib.error as e:
                raise _bad(f"corrupt gzip stream: {e}") from None
            self.tail = self.d.unconsumed_tail
            if self.d.eof:
                self.tail = self.d.unused_data + self.tail
                self.d = None
            if out:
                return out
        return b""


class _Zstd:
    """zstd through the `zstandard` binding, imported only for a zstd layer
    (Python 3.11 has no zstd).  The window is capped at 128 MiB (libzstd's
    default limit) so a frame cannot ask for unbounded memory; reads have
    bounded output.  A stream cut inside a frame ends quietly in this
    binding: the tar framing (the end-of-archive blocks) and the caller's
    diff_id check catch it."""

    def __init__(self, src):
        try:
            import zstandard
        except ImportError:
            raise ImageError("cannot unpack a zstd-compressed layer",
                             "the Python package zstandard is not installed",
                             "pip install zstandard (a dependency of gpusandbox)") from None
        self._err = zstandard.ZstdError
        self.r = zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_reader(
            src, read_size=CHUNK, read_across_frames=True, closefd=False)

    def read(self, n):
        try:
            return self.r.read(n)
        except self._err as e:
            raise _bad(f"corrupt zstd stream: {e}") from None


def sniff(head):
    """"gzip", "zstd" or "tar" from a stream's first four bytes."""
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if head == b"\x28\xb5\x2f\xfd" or (len(head) == 4 and head[0] & 0xF0 == 0x50
                                        and head[1:] == b"\x2a\x4d\x18"):
        return "zstd"
    return "tar"


class Entry:
    __slots__ = ("name", "linkname", "type", "mode", "uid", "gid", "size",
                 "mtime_ns", "devmajor", "devminor")


def _cstr(field):
    return field.split(b"\0", 1)[0]


def _num(field, what):
    """A numeric header field: octal text, or GNU base-256 (high bit set).
    Negative values are refused."""
    if field[:1] and field[0] & 0x80:
        if field[0] == 0xFF:
            raise _bad(f"negative {what} in a tar header")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    s = _cstr(field).strip(b" ")
    if not s:
        return 0
    if s.strip(b"01234567"):
        raise _bad(f"not a tar archive (non-octal {what} field)")
    return int(s, 8)


def _pax(data):
    """The records of a PAX header: `LEN KEY=VALUE\\n`, LEN counting itself."""
    out, pos = {}, 0
    while pos < len(data):
        sp = data.find(b" ", pos, pos + 21)
        if sp < 0 or not _DEC.fullmatch(data[pos:sp]):
            raise _bad("malformed PAX header record")
        end = pos + int(data[pos:sp])
        if end <= sp + 1 or end > len(data) or data[end - 1] != 0x0A:
            raise _bad("malformed PAX header record length")
        key, eq, val = data[sp + 1:end - 1].partition(b"=")
        if not eq:
            raise _bad("malformed PAX header record (no '=')")
        out[key] = val
        pos = end
    return out


def _pax_int(val, key, limit):
    if not _DEC.fullmatch(val) or int(val) > limit:
        raise _bad(f"invalid PAX {key.decode()} {val[:40]!r}")
    return int(val)


def _pax_time(val):
    m = _TIME.fullmatch(val)
    if not m:
        raise _bad(f"invalid PAX mtime {val[:40]!r}")
    ns = int(m.group(2)) * 10**9 + int((m.group(3) or b"0")[:9].ljust(9, b"0"))
    return -ns if m.group(1) else ns


class TarReader:
    """entries() yields one Entry per member; between yields, data(n)
    returns the current member's content.  Whatever the consumer leaves
    unread is skipped (and hashed) before the next header."""

    def __init__(self, fileobj, limits):
        self.lim = limits
        self.src = _Input(fileobj)
        head = self.src.peek(10)
        self.kind = sniff(head[:4])
        # (A tar's first bytes are a member name: only full magics count.)
        if head[:6] == b"\xfd7zXZ\0" or (head[:3] == b"BZh" and head[4:10] == b"1AY&SY"):
            raise ImageError("unsupported layer compression",
                             f"{'bzip2' if head[:1] == b'B' else 'xz'} (OCI layers are "
                             "gzip, zstd or uncompressed tar)")
        self.dec = {"gzip": _Gzip, "zstd": _Zstd}.get(self.kind, lambda s: s)(self.src)
        self.h = hashlib.sha256()
        self.total = 0
        self.buf = b""
        self.pos = 0
        self.left = 0

    @property
    def diff_id(self):
        return "sha256:" + self.h.hexdigest()

    def _fill(self):
        b = self.dec.read(CHUNK)
        if not b:
            return False
        self.total += len(b)
        lim = self.lim
        if self.total > lim.max_bytes:
            raise _bad(f"the layer is larger than the limit of {lim.max_bytes} bytes "
                       "uncompressed")
        if (self.kind != "tar" and lim.max_ratio and self.total > lim.ratio_floor
                and self.total > lim.max_ratio * max(self.src.n, 1)):
            raise _bad(f"decompression bomb: {self.total} bytes from {self.src.n} "
                       f"compressed (more than {lim.max_ratio}:1)")
        self.h.update(b)
        self.buf = self.buf[self.pos:] + b if self.pos < len(self.buf) else b
        self.pos = 0
        return True

    def _take(self, n):
        """Exactly n bytes, or None at a clean end of stream (nothing read)."""
        while len(self.buf) - self.pos < n:
            if not self._fill():
                if self.pos == len(self.buf):
                    return None
                raise _bad("truncated: the layer ends inside a tar block")
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def _skip(self, n):
        while n:
            if self.pos == len(self.buf) and not self._fill():
                raise _bad("truncated: the layer ends inside a member")
            k = min(n, len(self.buf) - self.pos)
            self.pos += k
            n -= k

    def data(self, n):
        """Up to n bytes (at least one while any are left) of the member."""
        n = min(n, self.left)
        if not n:
            return b""
        if self.pos == len(self.buf) and not self._fill():
            raise _bad("truncated: the layer ends inside a member")
        b = self.buf[self.pos:self.pos + n]
        self.pos += len(b)
        self.left -= len(b)
        return b

    def _header(self):
        hdr = self._take(BLOCK)
        if hdr is None:
            raise _bad("truncated: no end-of-archive marker" if self.total else
                       "the layer is empty, not a tar archive")
        return hdr

    def _meta_body(self, size, limit, what):
        if size > limit:
            raise _bad(f"{what} of {size} bytes exceeds the limit of {limit}")
        body = self._take(size) if size else b""
        if body is None:
            raise _bad(f"truncated: the layer ends inside a {what}")
        self._skip(-size % BLOCK)
        return body

    def entries(self):
        lim = self.lim
        while True:
            pax, longname, longlink = {}, None, None
            for _ in range(_MAX_META_RUN + 1):
                hdr = self._header()
                if hdr == _ZERO:
                    self._drain()
                    return
                self._check_sum(hdr)
                typ = hdr[156]
                if typ not in _META:
                    break
                size = _num(hdr[124:136], "size")
                if typ in b"xg":
                    rec = _pax(self._meta_body(size, lim.max_pax, "PAX header"))
                    if typ == ord("x"):
                        pax.update(rec)
                    # A global header's records are not applied: no layer
                    # writer relies on them, and `path` there would rename
                    # every later member.
                elif typ == ord("L"):
                    longname = _cstr(self._meta_body(size, lim.max_path + 1, "GNU long name"))
                else:
                    longlink = _cstr(self._meta_body(size, lim.max_path + 1, "GNU long link"))
            else:
                raise _bad(f"more than {_MAX_META_RUN} PAX/GNU headers in a row")
            e = self._parse(hdr, pax, longname, longlink)
            size, is_file = e.size, e.type in b"07\0"
            self.left = size if is_file else 0
            yield e
            # Unread content (and non-file members' data) is skipped, hashed.
            self._skip((self.left if is_file else size) + (-size % BLOCK))
            self.left = 0

    def _drain(self):
        """Hash the rest of the stream: the second end block, the record
        padding and any trailing bytes are part of the diff_id."""
        self.pos = len(self.buf)
        while self._fill():
            self.pos = len(self.buf)

    def _check_sum(self, hdr):
        want = _num(hdr[148:156], "checksum")
        blank = hdr[:148] + b"        " + hdr[156:]
        if want != sum(blank) and want != sum(b - 256 if b > 127 else b for b in blank):
            raise _bad("not a tar archive (bad header checksum)")

    def _parse(self, hdr, pax, longname, longlink):
        lim = self.lim
        e = Entry()
        e.type = bytes([hdr[156]])
        magic = hdr[257:263]
        name = _cstr(hdr[0:100])
        if magic == b"ustar\0":
            prefix = _cstr(hdr[345:500])
            if prefix:
                name = prefix + b"/" + name
        e.name = pax.get(b"path", longname if longname is not None else name)
        e.linkname = pax.get(b"linkpath", longlink if longlink is not None
                             else _cstr(hdr[157:257]))
        for what in ("name", "linkname"):
            v = getattr(e, what)
            if b"\0" in v:
                raise _bad(f"a member {what} contains a NUL byte")
            if len(v) > lim.max_path:
                raise _bad(f"a member {what} of {len(v)} bytes exceeds the limit of "
                           f"{lim.max_path}")
        if any(k.startswith(b"GNU.sparse.") for k in pax) or e.type == b"S":
            raise _bad(f"sparse file {_shown(e.name)} (GNU sparse members are not "
                       "supported in image layers)")
        e.mode = _num(hdr[100:108], "mode") & 0o7777
        e.uid = _num(hdr[108:116], "uid")
        e.gid = _num(hdr[116:124], "gid")
        e.size = _num(hdr[124:136], "size")
        e.mtime_ns = _num(hdr[136:148], "mtime") * 10**9
        e.devmajor = _num(hdr[329:337], "devmajor") if magic[:5] == b"ustar" else 0
        e.devminor = _num(hdr[337:345], "devminor") if magic[:5] == b"ustar" else 0
        if b"size" in pax:
            e.size = _pax_int(pax[b"size"], b"size", lim.max_bytes)
        if b"uid" in pax:
            e.uid = _pax_int(pax[b"uid"], b"uid", 2**32 - 2)
        if b"gid" in pax:
            e.gid = _pax_int(pax[b"gid"], b"gid", 2**32 - 2)
        if b"mtime" in pax:
            e.mtime_ns = _pax_time(pax[b"mtime"])
        if e.uid > 2**32 - 2 or e.gid > 2**32 - 2:
            raise _bad(f"member {_shown(e.name)}: uid/gid out of range")
        if e.size > lim.max_bytes:
            raise _bad(f"member {_shown(e.name)}: size {e.size} exceeds the layer limit")
        if e.type in b"07\0" and e.size > lim.max_file:
            raise _bad(f"member {_shown(e.name)}: size {e.size} exceeds the file limit "
                       f"of {lim.max_file} bytes")
        if e.mtime_ns > 2**62:
            e.mtime_ns = 2**62
        return e
