"""CUDA forward compatibility: whether the sandbox's loader prefers the
image's own cuda-compat libraries over the injected host libcuda family.

CUDA images carry `cuda-compat-X-Y` in /usr/local/cuda/compat: a libcuda
(and companions) newer than many hosts' drivers that speaks the old kernel
module's interface.  NVIDIA supports it on data-center GPUs only (elsewhere
cuInit fails with 804), and only on the driver branches the compat libcuda
lists in its ELF note `.note.cuda.fwd_compatibility` (owner "NVIDIA
Corporation", a JSON description such as {"format":1,"CUDA version":"12.9",
"driver":[535,550,...]}; the container toolkit's cudacompat hook reads the
same note).  Without a note the compat library is used when its major is
newer than the host's, as the toolkit's hook does.

The image is untrusted: the directory is listed and the library read inside
the image root (openat2 RESOLVE_IN_ROOT, regular files only), every read
bounded; no image file becomes a mount source and no image binary runs.
The decision only changes which paths the generated ld.so.cache names.
"""
import os
import stat
import struct

from gpusandbox.errors import GpuError
from gpusandbox.linux import sys as lsys

from . import COMPAT_DIR, Decision, compat_noted, no_compat_dir  # noqa: F401 (Decision: API)
from .discover import effective_caps

NOTE_SECTION = b".note.cuda.fwd_compatibility"
NOTE_OWNER = b"NVIDIA Corporation"
MODES = ("auto", "off", "force")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
# Bounds on what is read of the image: section headers, the section-name
# table and the note (a real note is ~200 bytes; a real libcuda has ~40
# sections).
_MAX_SECTIONS = 4096
_MAX_STRTAB = 1 << 20
_MAX_NOTE = 64 << 10
_MAX_NAMES = 4096


def _dotted(text, parts, width):
    """text is `parts` (a range) dot-separated ASCII numbers of 1 to width
    digits (re stays off the launch path)."""
    nums = text.split(".")
    return len(nums) in parts and all(n.isascii() and n.isdigit() and len(n) <= width
                                      for n in nums)


def _lib_name(name):
    """Whether name is lib<stem>.so.<version> (a SONAME or a versioned file)."""
    stem, sep, ver = name.partition(".so.")
    return bool(sep) and stem.startswith("lib") and len(stem) > 3 and \
        set(stem) <= _NAME_CHARS and _dotted(ver, range(1, 5), 8)


def _cuda_version(name):
    """The version of a libcuda.so.<major>.<minor>[.<patch>] name, or None."""
    ver = name.removeprefix("libcuda.so.")
    return ver if ver != name and _dotted(ver, (2, 3), 4) and len(ver.split(".")[0]) >= 2 \
        else None


def _vtuple(text):
    return tuple(int(p) for p in text.split("."))


def _list(rootfd):
    """Names in the image's compat directory (at most _MAX_NAMES), or None."""
    try:
        fd = lsys.openat2(rootfd, COMPAT_DIR.lstrip("/"),
                          os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        names = []
        with os.scandir(fd) as it:
            for e in it:
                names.append(e.name)
                if len(names) >= _MAX_NAMES:
                    break
        return names
    except OSError:
        return None
    finally:
        os.close(fd)


def _open_lib(rootfd, name):
    """An fd of the regular file COMPAT_DIR/name, resolved inside the image."""
    pfd = lsys.openat2(rootfd, f"{COMPAT_DIR.lstrip('/')}/{name}", lsys.O_PATH)
    try:
        if not stat.S_ISREG(os.fstat(pfd).st_mode):
            raise OSError(22, "not a regular file")
        return os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    finally:
        os.close(pfd)


def _pread(fd, size, off):
    data = os.pread(fd, size, off)
    if len(data) != size:
        raise ValueError("truncated ELF file")
    return data


def read_note(fd):
    """The JSON object of the `.note.cuda.fwd_compatibility` note of the
    64- or 32-bit little-endian ELF file on fd; None when there is no such
    note.  Raises ValueError on a malformed file."""
    ident = _pread(fd, 16, 0)
    if ident[:4] != b"\x7fELF" or ident[5] != 1:
        raise ValueError("not a little-endian ELF file")
    is64 = ident[4] == 2
    if is64:
        shoff, = struct.unpack_from("<Q", _pread(fd, 8, 0x28))
        shentsize, shnum, shstrndx = struct.unpack("<HHH", _pread(fd, 6, 0x3A))
        shfmt = "<IIQQQQIIQQ"
    else:
        shoff, = struct.unpack_from("<I", _pread(fd, 4, 0x20))
        shentsize, shnum, shstrndx = struct.unpack("<HHH", _pread(fd, 6, 0x2E))
        shfmt = "<IIIIIIIIII"
    if shnum == 0 or shnum > _MAX_SECTIONS or shstrndx >= shnum \
            or not struct.calcsize(shfmt) <= shentsize <= 256:
        raise ValueError("bad section header table")
    table = _pread(fd, shentsize * shnum, shoff)
    sections = [struct.unpack_from(shfmt, table, i * shentsize) for i in range(shnum)]
    # (name, type, flags, addr, offset, size, ...): the same order in both classes.
    strtab = sections[shstrndx]
    if strtab[5] > _MAX_STRTAB:
        raise ValueError("section name table too large")
    names = _pread(fd, strtab[5], strtab[4])
    for sec in sections:
        end = names.find(b"\0", sec[0])
        if sec[1] != 7 or names[sec[0]:end if end >= 0 else None] != NOTE_SECTION:
            continue  # 7: SHT_NOTE
        if sec[5] > _MAX_NOTE:
            raise ValueError("note section too large")
        return _parse_notes(_pread(fd, sec[5], sec[4]))
    return None


def _parse_notes(data):
    off = 0
    while off + 12 <= len(data):
        namesz, descsz, _type = struct.unpack_from("<III", data, off)
        off += 12
        name = data[off:off + namesz].rstrip(b"\0")
        off += (namesz + 3) & ~3
        desc = data[off:off + descsz]
        off += (descsz + 3) & ~3
        if len(desc) != descsz:
            raise ValueError("truncated note")
        if name == NOTE_OWNER:
            import json
            doc = json.loads(desc.rstrip(b"\0").decode("utf-8"))
            if not isinstance(doc, dict):
                raise ValueError("note is not a JSON object")
            return doc
    return None


def _drivers(doc):
    drv = doc.get("driver") if doc else None
    if not isinstance(drv, list) or not all(isinstance(d, int) and 0 < d < 10000 for d in drv):
        return None
    return sorted(drv)


def decide(mode, image_root, host_version, brands):
    """The Decision for a launch.  mode: auto|off|force; image_root: the
    image's held fd (or path); host_version: the driver's version text;
    brands: the selected GPUs' brand names (None where unknown), or a
    callable returning them (asked only when the image's compat libcuda is
    newer than the host driver)."""
    if mode == "off":
        return Decision(False, "--cuda-compat off: the host driver's libraries")
    rootfd, owned = lsys.tree_fd(image_root)
    try:
        return _decide(mode, rootfd, host_version, brands)
    finally:
        if owned:
            os.close(rootfd)


def _decide(mode, rootfd, host_version, brands):
    names = _list(rootfd)
    if names is None:
        if mode == "force":
            raise GpuError("--cuda-compat force", f"the image has no {COMPAT_DIR}",
                           hint="use an image carrying cuda-compat, or --cuda-compat auto")
        return no_compat_dir()
    cuda = sorted(n for n in names if _cuda_version(n))
    if len(cuda) != 1:
        why = "none" if not cuda else f"{len(cuda)} ({', '.join(cuda[:3])})"
        if mode == "force":
            raise GpuError("--cuda-compat force", f"{COMPAT_DIR} holds {why} libcuda.so.<version>",
                           hint="exactly one is needed to know which to prefer")
        return Decision(False, f"{COMPAT_DIR} holds {why} libcuda.so.<version>, not exactly one")
    version = _cuda_version(cuda[0])
    entries = [(n, f"{COMPAT_DIR}/{n}") for n in sorted(names) if _lib_name(n)]
    try:
        fd = _open_lib(rootfd, cuda[0])
        try:
            doc = read_note(fd)
        finally:
            os.close(fd)
    except (OSError, ValueError, RecursionError, struct.error) as e:
        if mode == "force":
            return Decision(True, f"--cuda-compat force: compat libcuda {version} "
                            f"(note unreadable: {e})", version, entries)
        return Decision(False, f"compat libcuda {version} unreadable ({e}): the host's libraries")
    drivers = _drivers(doc)
    if mode == "force":
        return Decision(True, f"--cuda-compat force: the image's libcuda {version} in "
                        f"{COMPAT_DIR}", version, entries, drivers)
    host_major = _vtuple(host_version)[0]
    if _vtuple(version) <= _vtuple(host_version):
        return Decision(False, f"compat libcuda {version} is not newer than the host "
                        f"driver {host_version}", version, drivers=drivers)
    from .require import is_datacenter      # an image with a newer compat libcuda only
    bad = [b for b in (brands() if callable(brands) else brands) if not is_datacenter(b)]
    if bad:
        what = bad[0] or "unknown"
        return Decision(False, f"compat libcuda {version} not used: forward compatibility "
                        f"is for data-center GPUs, this GPU's brand is {what} (CUDA error 804 "
                        "elsewhere; --cuda-compat force overrides)", version, drivers=drivers)
    if drivers is not None:
        if host_major not in drivers:
            return Decision(False, f"compat libcuda {version} supports driver branches "
                            f"{', '.join(map(str, drivers))}, not the host's {host_major}",
                            version, drivers=drivers)
        why = f"its note lists driver branch {host_major}"
    else:
        if _vtuple(version)[0] <= host_major:
            return Decision(False, f"compat libcuda {version} carries no driver-branch note "
                            f"and is not a newer branch than {host_version}", version)
        why = "no driver-branch note, newer branch than the host's"
    return Decision(True, f"forward compatibility: the image's libcuda {version} in "
                    f"{COMPAT_DIR} ({why}) over the host's {host_version}",
                    version, entries, drivers)


def prefer(entries, decision, make_entry):
    """The injected loader-cache entries with the compat libraries first:
    an injected entry whose name the compat directory also provides is
    replaced by the compat one.  make_entry(name, path) -> cache entry."""
    if not decision or not decision.use:
        return entries
    names = {n for n, _ in decision.entries}
    kept = [e for e in entries if e.name.decode() not in names]
    return kept + [make_entry(n, p) for n, p in decision.entries]


def for_launch(mode, image_root, host, sel, notes):
    """The Decision for a launch that injects libcuda (None otherwise), its
    reason added to the --verbose notes."""
    if "compute" not in effective_caps(sel.caps):
        return None
    def brands():
        from .require import gpu_brand
        return [getattr(g, "brand", None) or gpu_brand(getattr(g, "model", None))
                for g in sel.node_gpus()]
    return compat_noted(decide(mode, image_root, host.version, brands), notes)
