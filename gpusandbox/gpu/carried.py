"""The CUDA runtime an image carries, found by looking at its files.

The image is untrusted: every directory is read through the image root's
descriptor (RESOLVE_IN_ROOT), non-blocking, and the whole look is bounded in
names, directories and bytes, so an image built to stall or exhaust the
launcher costs no more than a real one.  Digits are ASCII only."""
import os

from gpusandbox import number
from gpusandbox.linux import sys as lsys

# Bounds on the image scan for the CUDA runtime it carries: names read per
# directory and in all, toolkit directories (/usr/local/cuda-*) looked into,
# and the size of a version file.  A real image has one to three toolkits and
# a few thousand library names; an image built to stall the launcher
# (thousands of cuda-N links to one directory of thousands of libcudart
# names) must cost no more than a real one.
_MAX_NAMES_PER_DIR = 16384
_MAX_NAMES = 65536
_MAX_TOOLKITS = 16
_VERSION_FILE_LIMIT = 256 << 10


class _Scan:
    """What one look at the image may still read: names in all, and the
    directories already seen (by device and inode, so that a thousand links
    to one directory are read once)."""
    __slots__ = ("names_left", "seen")

    def __init__(self):
        self.names_left = _MAX_NAMES
        self.seen = set()


def _listdir_in_root(root, path, scan=None):
    """Names in a directory of the image (root: its held fd), resolved inside it;
    at most _MAX_NAMES_PER_DIR of them, none of a directory `scan` has seen."""
    rootfd, owned = lsys.tree_fd(root)
    try:
        fd = lsys.openat2(rootfd, path.lstrip("/"),
                          os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
    except OSError:
        return []
    finally:
        if owned:
            os.close(rootfd)
    try:
        return _names(fd, scan or _Scan())
    except OSError:
        return []
    finally:
        os.close(fd)


def _names(fd, scan):
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in scan.seen:
        return []
    scan.seen.add((st.st_dev, st.st_ino))
    out = []
    with os.scandir(fd) as it:
        for entry in it:
            if len(out) >= _MAX_NAMES_PER_DIR or scan.names_left <= 0:
                break
            scan.names_left -= 1
            out.append(entry.name)
    return out


def _cudart_version(name):
    # libcudart.so.12.4.127: the soname link (libcudart.so.12) lacks the minor.
    if not name.startswith("libcudart.so."):
        return None
    parts = name[len("libcudart.so."):].split(".")
    if len(parts) >= 2:
        major, minor = number(parts[0]), number(parts[1])
        if major is not None and minor is not None:
            return major, minor
    return None


def _toolkit_file_version(root, cuda_dir):
    data = lsys.read_in_root(root, cuda_dir + "/version.json", limit=_VERSION_FILE_LIMIT)
    if data is not None:
        import json
        try:
            text = json.loads(data)["cuda"]["version"]
        except (ValueError, KeyError, TypeError, IndexError, RecursionError):
            text = ""
        where = cuda_dir + "/version.json"
    else:
        data = lsys.read_in_root(root, cuda_dir + "/version.txt", limit=1 << 16)
        if data is None:
            return None
        # "CUDA Version 10.2.89"
        text = data.decode("utf-8", "replace").strip().split(" ")[-1]
        where = cuda_dir + "/version.txt"
    if not isinstance(text, str):
        return None
    parts = text.split(".")
    if len(parts) >= 2:
        major, minor = number(parts[0]), number(parts[1])
        if major is not None and minor is not None:
            return (major, minor), where
    return None


def _toolkit_key(name):
    """Sort key for cuda-X.Y directory names: numeric where they are numbers."""
    return [(0, n, "") if (n := number(p)) is not None else (1, 0, p)
            for p in name[len("cuda-"):].split(".")]


def image_cuda_version(image_root):
    """((major, minor), where) of the CUDA runtime the image carries, or None.

    Looks where the image's loader and CUDA's own layout put libcudart first,
    then at the toolkit's version file; with several toolkits under
    /usr/local/cuda-X.Y and no default, the lowest is taken: the image can
    run on it, and refusing a launch needs evidence.  The look is bounded
    (_Scan): an image with more toolkit directories than _MAX_TOOLKITS gives
    no evidence from them rather than an unbounded scan."""
    scan = _Scan()
    machine = os.uname().machine
    target = {"x86_64": "x86_64-linux", "aarch64": "sbsa-linux"}.get(machine, machine)
    libdirs = [f"/usr/lib/{machine}-linux-gnu", f"/lib/{machine}-linux-gnu",
               "/usr/lib64", "/lib64", "/usr/lib",
               "/usr/local/cuda/lib64", f"/usr/local/cuda/targets/{target}/lib"]
    for d in libdirs:
        found = sorted(v for v in map(_cudart_version, _listdir_in_root(image_root, d, scan))
                       if v)
        if found:
            v = found[0]
            return v, f"{d}/libcudart.so.{v[0]}.{v[1]}"
    hit = _toolkit_file_version(image_root, "/usr/local/cuda")
    if hit:
        return hit
    toolkits = [n for n in _listdir_in_root(image_root, "/usr/local", scan)
                if n.startswith("cuda-")]
    if len(toolkits) > _MAX_TOOLKITS:
        return None
    found = []
    for name in sorted(toolkits, key=_toolkit_key):
        for d in (f"/usr/local/{name}/lib64", f"/usr/local/{name}/targets/{target}/lib"):
            for v in map(_cudart_version, _listdir_in_root(image_root, d, scan)):
                if v:
                    found.append((v, f"{d}/libcudart.so.{v[0]}.{v[1]}"))
        hit = _toolkit_file_version(image_root, f"/usr/local/{name}")
        if hit:
            found.append(hit)
    return min(found) if found else None
