"""glibc's /etc/ld.so.cache, read and written in Python, plus an ELF SONAME reader.

Format ("glibc-ld.so.cache" version "1.1", native byte order):

    [old "ld.so-1.7.0" section: 16-byte header + nlibs * 12-byte entries,
     padded to 8 bytes]                                -- optional, skipped
    new header, 48 bytes: magic(17) version(3) nlibs:u32 len_strings:u32
        flags:u8 (endianness: 2 little, 3 big) pad(3) extension_offset:u32
        unused:3*u32
    nlibs entries, 24 bytes: flags:i32 key:u32 value:u32 osversion:u32 hwcap:u64
    string table (key = library name, value = its path)
    optional extension directory at extension_offset: magic 0xeaa42174,
        count, then {tag, flags, offset, size} sections; tag 1 is the
        glibc-hwcaps section, an array of u32 string offsets naming the
        glibc-hwcaps subdirectories (x86-64-v3, ...)

String offsets count from the new header; extension offsets from the start of
the file.  An entry whose hwcap has only bit 62 set in its upper half (ISA level
bits aside) names glibc-hwcaps subdirectory number (hwcap & 0xffffffff).

ld.so looks a name up by binary search (elf/dl-cache.c) using
_dl_cache_libcmp, so the entries must be sorted exactly as ldconfig sorts them
(elf/cache.c `compare`): by name, DESCENDING, where digit runs compare as
numbers and a digit sorts above any other byte, bytes compare as signed char;
then by flags descending; then glibc-hwcaps entries before plain ones (by
subdirectory name, strcmp order), then by hwcap and osversion descending.
"""
import os
import _struct as struct   # what `struct` re-exports: one import less
import sys

OLD_MAGIC = b"ld.so-1.7.0"
NEW_MAGIC = b"glibc-ld.so.cache1.1"
EXT_MAGIC = 0xEAA42174
EXT_TAG_GENERATOR = 0
EXT_TAG_HWCAPS = 1
HWCAP_EXTENSION = 1 << 62
_ISA_LEVEL_MASK = (1 << 10) - 1

# _DL_CACHE_DEFAULT_ID per machine: FLAG_ELF_LIBC6 (3) | the ABI bits that ld.so
# requires (sysdeps/.../dl-cache.h).  The second value is the 32-bit ABI that a
# 64-bit host can also run (i386 on x86_64), None where there is none.
# i386's ld.so also accepts FLAG_ELF (1), which ldconfig writes for a 32-bit
# object without a libc dependency (sysdeps/unix/sysv/linux/x86_64 dl-cache.h).
_ABI_FLAGS = {"x86_64": (0x0303, (0x0003, 0x0001)), "aarch64": (0x0A03, ())}
NATIVE_FLAGS, COMPAT32_FLAGS = _ABI_FLAGS.get(os.uname().machine, (0x0303, (0x0003, 0x0001)))


def abi_bits(flags):
    """64 for the host's native ABI, 32 for its 32-bit compat ABI, else None."""
    if flags == NATIVE_FLAGS:
        return 64
    return 32 if flags in COMPAT32_FLAGS else None

_BO = "<" if sys.byteorder == "little" else ">"
_HDR = struct.Struct(_BO + "20sIIB3xI12x")
_ENTRY = struct.Struct(_BO + "iIIIQ")
_OLD_HDR = 16
_OLD_ENTRY = 12


# Bounds for a cache that may be an image's (hostile) file: ld.so.cache files
# of real systems hold a few thousand entries with paths well under PATH_MAX.
# Strings are cut at PATH_MAX, copied once per offset, and all the string bytes
# one parse copies are capped, so a file whose entries all name one long
# string costs what its size says, not entries x length.
MAX_FILE = 16 << 20
MAX_ENTRIES = 1 << 17
MAX_STRING = 4096
MAX_STRING_BYTES = 32 << 20
MAX_HWCAPS = 64


class CacheError(ValueError):
    """A cache file that is not in the expected format (message says where)."""


class Entry:
    """One cache entry.  `name` and `path` are bytes (file names need not be
    UTF-8); `hwcaps` is the glibc-hwcaps subdirectory name (bytes) or None."""
    __slots__ = ("name", "path", "flags", "osversion", "hwcap", "hwcaps")

    def __init__(self, name, path, flags=NATIVE_FLAGS, osversion=0, hwcap=0, hwcaps=None):
        self.name = name
        self.path = path
        self.flags = flags
        self.osversion = osversion
        self.hwcap = hwcap
        self.hwcaps = hwcaps

    def __repr__(self):
        return f"Entry({self.name!r} -> {self.path!r} flags={self.flags:#x})"


def _locate(data):
    """Offset of the new-format header, skipping an old section before it."""
    if data[:len(NEW_MAGIC)] == NEW_MAGIC:
        return 0
    if data[:len(OLD_MAGIC)] != OLD_MAGIC or len(data) < _OLD_HDR:
        raise CacheError("not an ld.so.cache (bad magic)")
    (nold,) = struct.unpack_from(_BO + "I", data, 12)
    if nold > (len(data) - _OLD_HDR) // _OLD_ENTRY:
        raise CacheError("old-format entry count exceeds the file size")
    off = (_OLD_HDR + nold * _OLD_ENTRY + 7) & ~7
    if data[off:off + len(NEW_MAGIC)] != NEW_MAGIC:
        raise CacheError("old-format cache without the glibc 1.1 section")
    return off


def _cstr(data, off, base, end):
    """NUL-terminated string at base+off, refusing anything outside [base, end)
    or longer than MAX_STRING."""
    start = base + off
    if off >= end - base:
        raise CacheError(f"string offset {off} outside the string table")
    stop = data.find(b"\0", start, min(end, start + MAX_STRING + 1))
    if stop < 0:
        raise CacheError(f"unterminated or over-long string at offset {off}")
    return data[start:stop]


class _Strings:
    """_cstr with one copy per offset and a cap on the bytes copied in all."""
    __slots__ = ("data", "base", "end", "memo", "left")

    def __init__(self, data, base, end):
        self.data, self.base, self.end = data, base, end
        self.memo = {}
        self.left = MAX_STRING_BYTES

    def get(self, off):
        s = self.memo.get(off)
        if s is None:
            s = _cstr(self.data, off, self.base, self.end)
            self.left -= len(s) + 1
            if self.left < 0:
                raise CacheError("string table too large")
            self.memo[off] = s
        return s


def iter_raw(data):
    """(base, end, rows): rows are (flags, key, value, osversion, hwcap)
    tuples; key/value are string offsets for `_cstr(data, off, base, end)`.

    Every count and offset is checked against the buffer (entry_table), so a
    hostile file (an image's cache) yields CacheError, never an IndexError
    or a huge read."""
    base, end, table, nlibs = entry_table(data)
    return base, end, list(_ENTRY.iter_unpack(data[table:table + nlibs * _ENTRY.size]))


def rows_keyed(data, table, nlibs, keys):
    """The rows (as iter_raw's) whose key offset is in the set `keys`, in
    file order.  Only the key column is read, as ints, and only the rows
    that match are unpacked: a host's cache lists a few thousand libraries,
    and the launch asks for a few dozen."""
    col = memoryview(data)[table:table + nlibs * _ENTRY.size].cast("I")[1::_ENTRY.size // 4]
    return [_ENTRY.unpack_from(data, table + i * _ENTRY.size)
            for i, key in enumerate(col.tolist()) if key in keys]


def entry_table(data):
    """(base, end, offset of the entry table, entry count), each checked."""
    base = _locate(data)
    if len(data) < base + _HDR.size:
        raise CacheError("truncated header")
    _magic, nlibs, _lstr, endian, _ext = _HDR.unpack_from(data, base)
    if endian & 3 not in (0, 2 if _BO == "<" else 3):
        raise CacheError("cache written for the other byte order")
    table = base + _HDR.size
    if nlibs > (len(data) - table) // _ENTRY.size:
        raise CacheError(f"entry count {nlibs} exceeds the file size")
    if nlibs > MAX_ENTRIES:
        raise CacheError(f"entry count {nlibs} above {MAX_ENTRIES}")
    return base, len(data), table, nlibs


def _hwcaps_names(data, base, strings):
    """The glibc-hwcaps subdirectory names of the extension section (list of
    bytes), or [] when the file has none."""
    (ext_off,) = struct.unpack_from(_BO + "I", data, base + 32)
    if ext_off == 0 or ext_off % 4 or ext_off + 8 > len(data):
        return []
    magic, count = struct.unpack_from(_BO + "II", data, ext_off)
    if magic != EXT_MAGIC or count > min((len(data) - ext_off - 8) // 16, MAX_HWCAPS):
        return []
    for i in range(count):
        tag, _fl, off, size = struct.unpack_from(_BO + "IIII", data, ext_off + 8 + 16 * i)
        if tag != EXT_TAG_HWCAPS or off % 4 or size % 4 or off + size > len(data):
            continue
        if size // 4 > MAX_HWCAPS:
            raise CacheError(f"{size // 4} glibc-hwcaps names (at most {MAX_HWCAPS})")
        offs = struct.unpack_from(_BO + f"{size // 4}I", data, off)
        return [strings.get(o) for o in offs]
    return []


def parse(data):
    """All entries of a cache file (bytes) as Entry objects, in file order."""
    base, end, rows = iter_raw(data)
    strings = _Strings(data, base, end)
    names = None
    out = []
    for flags, key, value, osv, hwcap in rows:
        hw = None
        if hwcap and ((hwcap >> 32) & ~_ISA_LEVEL_MASK) == (HWCAP_EXTENSION >> 32):
            if names is None:
                names = _hwcaps_names(data, base, strings)
            idx = hwcap & 0xFFFFFFFF
            if idx >= len(names):
                continue  # ld.so ignores such an entry too
            hw = names[idx]
        out.append(Entry(strings.get(key), strings.get(value), flags, osv, hwcap, hw))
    return out


# --- ordering ------------------------------------------------------------------
# A sort key whose plain bytes order equals _dl_cache_libcmp's order.  Symbols:
# a non-digit byte b is ranked as signed char: b >= 0x80 (negative) -> 0x01..0x80;
# end of string (0) -> 0x81; positive non-digits -> 0x82.. ; a digit run ->
# 0xff, then its length without leading zeros, then the digits, so numbers
# compare by value and any number sorts above any other byte.
def _rank_table():
    tbl = bytearray(256)
    nxt = 0x82
    for b in range(256):
        if b >= 0x80:
            tbl[b] = b - 0x7F
        elif 0x30 <= b <= 0x39 or b == 0:
            tbl[b] = 0x81
        else:
            tbl[b] = nxt
            nxt += 1
    return bytes(tbl)


_RANK = _rank_table()
_DIGITS = b"0123456789"
_DIGIT_MARK = bytes.maketrans(_DIGITS, b"\0" * 10)


def libcmp_key(name):
    """Sort key for a library name (bytes) matching glibc's _dl_cache_libcmp."""
    marked = name.translate(_DIGIT_MARK)
    pos = marked.find(b"\0")
    if pos < 0:
        return name.translate(_RANK) + b"\x81"
    out = []
    n = len(name)
    start = 0
    while pos >= 0:
        out.append(name[start:pos].translate(_RANK))
        end = pos
        while end < n and marked[end] == 0:
            end += 1
        digits = name[pos:end].lstrip(b"0")
        out.append(b"\xff" + bytes((min(len(digits), 254),)) + digits)
        start = end
        pos = marked.find(b"\0", end)
    out.append(name[start:].translate(_RANK))
    out.append(b"\x81")
    return b"".join(out)


def _bits(v):
    return bin(v).count("1")


def sort_entries(entries):
    """Sort in place into the order ld.so's binary search expects."""
    # Secondary criteria first; Python's sort is stable, also with reverse=True.
    entries.sort(key=lambda e: (-e.flags, e.hwcaps is None, e.hwcaps or b"",
                                -_bits(e.hwcap if e.hwcaps is None else 0),
                                -(e.hwcap if e.hwcaps is None else 0), -e.osversion))
    entries.sort(key=lambda e: libcmp_key(e.name), reverse=True)
    return entries


def build(entries, generator=b"gpusandbox"):
    """Serialise entries (sorted here) into a new-format cache file (bytes)."""
    entries = sort_entries(list(entries))
    hwnames = sorted({e.hwcaps for e in entries if e.hwcaps is not None})
    hwindex = {n: i for i, n in enumerate(hwnames)}
    nlibs = len(entries)
    strings = bytearray()
    offsets = {}
    str_base = _HDR.size + nlibs * _ENTRY.size

    def intern(s):
        off = offsets.get(s)
        if off is None:
            off = offsets[s] = str_base + len(strings)
            strings.extend(s + b"\0")
        return off

    table = bytearray()
    for e in entries:
        hwcap = e.hwcap
        if e.hwcaps is not None:
            isa = (e.hwcap >> 32) & _ISA_LEVEL_MASK
            hwcap = HWCAP_EXTENSION | (isa << 32) | hwindex[e.hwcaps]
        table += _ENTRY.pack(e.flags, intern(e.name), intern(e.path), e.osversion, hwcap)
    hw_offs = [intern(n) for n in hwnames]
    len_strings = len(strings)
    ext_off = (str_base + len_strings + 3) & ~3
    sections = [(EXT_TAG_GENERATOR, generator)]
    if hw_offs:
        sections.append((EXT_TAG_HWCAPS, struct.pack(_BO + f"{len(hw_offs)}I", *hw_offs)))
    ext = bytearray(struct.pack(_BO + "II", EXT_MAGIC, len(sections)))
    payload_off = ext_off + 8 + 16 * len(sections)
    payload = bytearray()
    for tag, blob in sections:
        # 4-byte alignment keeps the hwcaps array valid (cache_extension_verify).
        while (payload_off + len(payload)) % 4:
            payload += b"\0"
        ext += struct.pack(_BO + "IIII", tag, 0, payload_off + len(payload), len(blob))
        payload += blob
    header = _HDR.pack(NEW_MAGIC, nlibs, len_strings, 2 if _BO == "<" else 3, ext_off)
    pad = b"\0" * (ext_off - str_base - len_strings)
    return bytes(header + table + strings + pad + ext + payload)


# --- ELF -------------------------------------------------------------------------
_DT_SONAME, _DT_STRTAB, _PT_LOAD, _PT_DYNAMIC = 14, 5, 1, 2


def elf_soname(path):
    """DT_SONAME of the ELF shared object at `path` (str), or None when it has
    none or the file is not a well-formed ELF object (bounds checked)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _soname_fd(fd)
    except (struct.error, OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _soname_fd(fd):
    ehdr = os.pread(fd, 64, 0)
    if ehdr[:4] != b"\x7fELF" or ehdr[4] not in (1, 2) or ehdr[5] not in (1, 2):
        return None
    is64 = ehdr[4] == 2
    bo = "<" if ehdr[5] == 1 else ">"
    if is64:
        phoff, = struct.unpack_from(bo + "Q", ehdr, 32)
        phentsize, phnum = struct.unpack_from(bo + "HH", ehdr, 54)
        ph = struct.Struct(bo + "IIQQQQQQ")   # type flags off vaddr paddr filesz memsz align
        dyn = struct.Struct(bo + "qQ")
    else:
        phoff, = struct.unpack_from(bo + "I", ehdr, 28)
        phentsize, phnum = struct.unpack_from(bo + "HH", ehdr, 42)
        ph = struct.Struct(bo + "IIIIIIII")   # type off vaddr paddr filesz memsz flags align
        dyn = struct.Struct(bo + "iI")
    if phentsize < ph.size or phnum > 512:
        return None
    raw = os.pread(fd, phentsize * phnum, phoff)
    loads, dynamic = [], None
    for i in range(len(raw) // phentsize):
        f = ph.unpack_from(raw, i * phentsize)
        if is64:
            ptype, off, vaddr, filesz = f[0], f[2], f[3], f[5]
        else:
            ptype, off, vaddr, filesz = f[0], f[1], f[2], f[4]
        if ptype == _PT_LOAD:
            loads.append((vaddr, off, filesz))
        elif ptype == _PT_DYNAMIC:
            dynamic = (off, min(filesz, 1 << 20))
    if dynamic is None:
        return None
    draw = os.pread(fd, dynamic[1], dynamic[0])
    soname = strtab = None
    for tag, val in dyn.iter_unpack(draw[:len(draw) - len(draw) % dyn.size]):
        if tag == 0:
            break
        if tag == _DT_SONAME:
            soname = val
        elif tag == _DT_STRTAB:
            strtab = val
    if soname is None or strtab is None:
        return None
    for vaddr, off, filesz in loads:   # DT_STRTAB is an address: map it to a file offset
        if vaddr <= strtab < vaddr + filesz:
            s = os.pread(fd, 256, off + (strtab - vaddr) + soname)
            end = s.find(b"\0")
            return os.fsdecode(s[:end]) if end > 0 else None
    return None
