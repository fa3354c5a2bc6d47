"""What the loader needs to know of a shared object, read from its ELF file
(64-bit little-endian, as on x86_64 and aarch64): its SONAME, its DT_NEEDED
names, the symbol versions it requires of each (DT_VERNEED: GLIBC_2.34 of
libc.so.6) and those it defines (DT_VERDEF).  Bounds-checked: a malformed
file reads as None, never as an exception; an image's file is read only
through a descriptor opened inside its root."""
import os
import struct

_PT_LOAD, _PT_DYNAMIC = 1, 2
DT_NEEDED, DT_STRTAB, DT_SONAME = 1, 5, 14
DT_VERDEF, DT_VERDEFNUM, DT_VERNEED, DT_VERNEEDNUM = 0x6ffffffc, 0x6ffffffd, 0x6ffffffe, 0x6fffffff
_PH = struct.Struct("<IIQQQQQQ")
_DYN = struct.Struct("<qQ")
_MAX = 64 << 20


class Dynamic:
    """soname (str or None), needed [str], requires {library: {version}},
    defines {version}."""
    __slots__ = ("soname", "needed", "requires", "defines")


def read_fd(fd):
    return _safe(lambda n, off: os.pread(fd, n, off))


def read_bytes(data):
    """The same, from a file's contents (an image's file, read in its root)."""
    return _safe(lambda n, off: bytes(data[off:off + n]) if off >= 0 else b"")


def _safe(pread):
    try:
        return _read(pread)
    except (struct.error, OSError, ValueError, IndexError):
        return None


def read(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return read_fd(fd)
    finally:
        os.close(fd)


def _read(pread):
    ehdr = pread(64, 0)
    if len(ehdr) < 64 or ehdr[:4] != b"\x7fELF" or ehdr[4] != 2 or ehdr[5] != 1:
        return None
    phoff, = struct.unpack_from("<Q", ehdr, 32)
    phentsize, phnum = struct.unpack_from("<HH", ehdr, 54)
    if phentsize < _PH.size or phnum > 512:
        return None
    raw = pread(phentsize * phnum, phoff)
    loads, dynamic = [], None
    for i in range(len(raw) // phentsize):
        ptype, _fl, off, vaddr, _pa, filesz, _mem, _al = _PH.unpack_from(raw, i * phentsize)
        if ptype == _PT_LOAD:
            loads.append((vaddr, off, filesz))
        elif ptype == _PT_DYNAMIC:
            dynamic = (off, min(filesz, 1 << 20))
    if dynamic is None:
        return None

    def offset(addr):
        for vaddr, off, filesz in loads:
            if vaddr <= addr < vaddr + filesz:
                return off + addr - vaddr
        raise ValueError("address outside every PT_LOAD")

    draw = pread(dynamic[1], dynamic[0])
    tags = {}
    needed = []
    for tag, val in _DYN.iter_unpack(draw[:len(draw) - len(draw) % _DYN.size]):
        if tag == 0:
            break
        if tag == DT_NEEDED:
            needed.append(val)
        else:
            tags.setdefault(tag, val)
    if DT_STRTAB not in tags:
        return None
    strtab = offset(tags[DT_STRTAB])

    def string(off):
        s = pread(256, strtab + off)
        end = s.find(b"\0")
        if end < 0:
            raise ValueError("unterminated string")
        return os.fsdecode(s[:end])

    d = Dynamic()
    d.soname = string(tags[DT_SONAME]) if DT_SONAME in tags else None
    d.needed = [string(n) for n in needed]
    d.requires = {}
    if DT_VERNEED in tags:
        pos = offset(tags[DT_VERNEED])
        for _ in range(min(tags.get(DT_VERNEEDNUM, 0), 256)):
            _v, cnt, file_, aux, nxt = struct.unpack("<HHIII", pread(16, pos))
            lib = d.requires.setdefault(string(file_), set())
            apos = pos + aux
            for _ in range(min(cnt, 256)):
                _h, _f, _o, name, anext = struct.unpack("<IHHII", pread(16, apos))
                lib.add(string(name))
                if not anext:
                    break
                apos += anext
            if not nxt:
                break
            pos += nxt
    d.defines = set()
    if DT_VERDEF in tags:
        pos = offset(tags[DT_VERDEF])
        for _ in range(min(tags.get(DT_VERDEFNUM, 0), 1024)):
            _v, _f, _n, cnt, _h, aux, nxt = struct.unpack("<HHHHIII", pread(20, pos))
            if cnt:
                name, _an = struct.unpack("<II", pread(8, pos + aux))
                d.defines.add(string(name))
            if not nxt:
                break
            pos += nxt
    return d


def version_key(v):
    """GLIBC_2.34 -> (2, 34); anything else -> ()."""
    _, _, num = v.partition("_")
    parts = num.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()
