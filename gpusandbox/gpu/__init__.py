"""GPU discovery, selection and injection (docs/DESIGN.md, "Layers").

What an image asks of the GPU stack is read here, in the package every GPU
module loads anyway: its variables (NVIDIA_REQUIRE_*, CUDA_VERSION,
NVIDIA_DISABLE_REQUIRE) and, for an image that names no CUDA release, the
CUDA runtime it carries (image_cuda_version).  A launch whose image asks
nothing never loads the requirement check (require.py, which re-exports
these), and the look at its files costs no module of its own.

The image is untrusted: every directory is read through the image root's
descriptor (RESOLVE_IN_ROOT), non-blocking, and the whole look is bounded in
names, directories and bytes, so an image built to stall or exhaust the
launcher costs no more than a real one.  Digits are ASCII only."""
import os

from gpusandbox import number, short
from gpusandbox.errors import GpuError

_TRUE = ("1", "t", "true", "y", "yes", "on")

# The fabric's (gpusandbox/fabric) facts the planner reads on every launch,
# here so that a launch that asks for no fabric device on a host without a
# fabric adapter loads nothing of gpusandbox.fabric (plandev.fabric):
# the caller's variables that ask for fabric devices (fabric/select.py reads
# them), and the sysfs classes (under the sys root) whose entries are the
# adapters a task may be given: RDMA HCAs and HPE Slingshot NICs
# (fabric/discover.py reads them).  A host with neither entry has no fabric
# adapter to choose.
FABRIC_CALLER_VARS = ("MELLANOX_VISIBLE_DEVICES", "NVIDIA_MOFED", "NVIDIA_IMEX_CHANNELS",
                      "NVIDIA_GDRCOPY", "NVIDIA_GDS", "NVIDIA_NVSWITCH")
FABRIC_NIC_CLASSES = ("class/infiniband", "class/cxi_user")


def disabled(env):
    return str(env.get("NVIDIA_DISABLE_REQUIRE", "")).strip().lower() in _TRUE


def requirements(image_env, image_root):
    """The image's constraints as [(source, expression)].

    image_env: the sandbox's variables as the image, --env-file and -e set
    them (later rows winning).  source names where the constraint came from
    (a variable, or the file that shows the CUDA release the image carries)
    for the error message."""
    reqs = [(k, v) for k, v in sorted(image_env.items())
            if k.startswith("NVIDIA_REQUIRE_") and v.strip()]
    if "NVIDIA_REQUIRE_CUDA" in image_env:
        return reqs
    legacy = image_env.get("CUDA_VERSION", "").strip()
    if legacy:
        parts = legacy.split(".")
        major, minor = (number(parts[0]), number(parts[1])) if len(parts) >= 2 else (None, None)
        if major is None or minor is None:
            raise GpuError(f"invalid CUDA_VERSION={short(legacy)} in the image",
                           hint="set CUDA_VERSION=MAJOR.MINOR[.PATCH] in the image, "
                                "or NVIDIA_DISABLE_REQUIRE=true to skip the check")
        reqs.append((f"CUDA_VERSION={short(legacy)[1:-1]}", f"cuda>={major}.{minor}"))
        return reqs
    if image_root is not None:
        carried = image_cuda_version(image_root)    # an image that names no CUDA release
        if carried:
            (major, minor), where = carried
            reqs.append((f"the image's CUDA {major}.{minor} ({where})",
                         f"cuda>={major}.{minor}"))
    return reqs


# --- the CUDA runtime an image carries ------------------------------------------------
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



# --- CUDA forward compatibility (compat.py) ----------------------------------
# The directory and the decision are here so that a launch whose image has no
# compat directory (most) decides without loading compat.py: compat_absent.
COMPAT_DIR = "/usr/local/cuda/compat"


class Decision:
    """use: the loader prefers the compat libraries; reason: one line for
    --verbose; version: the compat libcuda's; entries: [(soname, container
    path)] the loader cache gets when used; drivers: the note's list."""
    __slots__ = ("use", "reason", "version", "entries", "drivers")

    def __init__(self, use, reason, version=None, entries=(), drivers=None):
        self.use, self.reason, self.version = use, reason, version
        self.entries, self.drivers = list(entries), drivers

    def __repr__(self):
        return f"Decision(use={self.use}, {self.reason!r})"


def no_compat_dir():
    """compat.decide's Decision (auto) for an image without COMPAT_DIR."""
    return Decision(False, f"the image carries no forward-compatibility libraries ({COMPAT_DIR})")


def compat_absent(mode, image_root):
    """The Decision compat.decide returns for an image (its held fd, or a
    path) in which COMPAT_DIR cannot be opened, when mode is auto; None
    where compat.decide has more to read (or to refuse: force)."""
    if mode != "auto":
        return None
    from gpusandbox.linux import sys as lsys
    rootfd, owned = lsys.tree_fd(image_root)
    try:
        os.close(lsys.openat2(rootfd, COMPAT_DIR.lstrip("/"),
                              os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK))
    except OSError:
        return no_compat_dir()
    finally:
        if owned:
            os.close(rootfd)
    return None


def compat_noted(decision, notes):
    """The decision, its reason added to the --verbose notes."""
    notes.append("cuda-compat: " + decision.reason)
    return decision

class _Scan:
    """What one look at the image may still read: names in all, and the
    directories already seen (by device and inode, so that a thousand links
    to one directory are read once)."""
    __slots__ = ("names_left", "seen")

    def __init__(self):
        self.names_left = _MAX_NAMES
        self.seen = set()


# linux/sys (ctypes) is imported by the scan itself, not here: the OCI
# filter's memoised path loads this package (gpu.request) without it.
def _listdir_in_root(root, path, scan=None):
    """Names in a directory of the image (root: its held fd), resolved inside it;
    at most _MAX_NAMES_PER_DIR of them, none of a directory `scan` has seen."""
    from gpusandbox.linux import sys as lsys
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
    from gpusandbox.linux import sys as lsys
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
