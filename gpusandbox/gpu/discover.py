"""GPU discovery: what the NVIDIA driver exposes on this host, read from files.

No NVML and no subprocess: everything comes from the driver root (default
"/", e.g. /run/nvidia/driver for a containerised driver) and the device root
(default <driver root>/dev).  Runs on every GPU launch, so it parses with
struct and resolves only the paths it keeps.

GpuHost fields (read by select, inject, report, sim tests, slurm, doctor):
    driver_root     str: the driver root as given, normalised ("/" or "/run/nvidia/driver")
    proc_root       str: where its /proc files are read (proc_root(): the driver root
                    when it holds proc/devices, as a simulated host does, else "/")
    dev_root        str: where the /dev/nvidia* nodes are looked up
    version         str: kernel module version, "550.54.15"
    majors          dict: "nvidia" -> 195, "nvidia-uvm" -> N|None, "nvidia-caps" -> N|None
    frontend_name   str: /proc/devices name of major 195 ("nvidia" >= 550, "nvidia-frontend" before)
    gpus            list[Gpu], index order (= PCI bus id order)
    migs            list[MigDevice]: existing MIG compute instances, by (gpu index, gi, ci)
    control         dict: "nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools",
                    "mig-config", "mig-monitor" -> DevNode (absent when the driver lacks it)
    libs            list[Library] (gpu/libs.py): driver libraries whose real file ends in
                    ".so.<version>", from ld.so.cache and by path in the library directories
    bins            dict: binary name -> host path
    firmware        list[str]: host paths of <root>/lib/firmware/nvidia/<version>/gsp*.bin
    configs         list[(capability, container path, host path)]: ICD/vendor JSON files
    ipc             dict: "persistenced", "fabricmanager" -> (container path, host path) of the
                    sockets, "mps" -> (container path, host path) of the MPS pipe directory,
                    only when it passes rundir's rule for a shared place (see _mps_dir)
    pinned          dict: host path -> (st_dev, st_ino) of each directory checked by
                    descriptor here; the init binds that very inode or none
    notes           list[(capability, str)]: what discovery left out on purpose, and why
    problems        list[str]: every device-node mismatch or oddity found (never used, reported)
Gpu: index, minor, model, uuid (None when the driver hides it), bus_id ("0000:06:00.0"),
    proc_dir (host path of .../gpus/<bus id>), node (DevNode of /dev/nvidia<minor>)
MigDevice: gpu (Gpu), gi, ci, gi_access / ci_access (host paths of the capability files),
    gi_node / ci_node (DevNode of /dev/nvidia-caps/nvidia-cap<N>), uuid (None until resolved)
DevNode: path (in the sandbox, "/dev/nvidia0"), host_path, major, minor, problem (None if
    the host node exists with exactly these numbers, else what is wrong), missing (True
    when the host node does not exist at all)
"""
import errno
import os
import stat

from gpusandbox.errors import GpuError
from gpusandbox.gpu import libs as _libs_mod
from gpusandbox.gpu.libs import Library  # noqa: F401 - re-exported (GpuHost.libs items)
from gpusandbox.linux import sys as lsys

# Driver libraries per capability (GPU-FACTS.md); "video" and "display" also
# receive what they build on (IMPLIES).
CAP_LIBS = {
    "utility": ("libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"),
    "compute": ("libcuda", "libcudadebugger", "libnvidia-opencl", "libnvidia-gpucomp",
                "libnvidia-ptxjitcompiler", "libnvidia-fatbinaryloader",
                "libnvidia-allocator", "libnvidia-compiler", "libnvidia-pkcs11",
                "libnvidia-pkcs11-openssl3", "libnvidia-nvvm"),
    "video": ("libvdpau_nvidia", "libnvidia-encode", "libnvidia-opticalflow", "libnvcuvid"),
    "graphics": ("libnvidia-eglcore", "libnvidia-glcore", "libnvidia-tls", "libnvidia-glsi",
                 "libnvidia-fbc", "libnvidia-ifr", "libnvidia-rtcore", "libnvoptix",
                 "libGLX_nvidia", "libEGL_nvidia", "libGLESv2_nvidia", "libGLESv1_CM_nvidia",
                 "libnvidia-glvkspirv", "libnvidia-cbl"),
    "display": (),
    "ngx": ("libnvidia-ngx",),
    "compat32": (),
}
CAPABILITIES = ("compute", "utility", "video", "graphics", "display", "ngx", "compat32")
IMPLIES = {"video": ("compute",), "display": ("graphics",)}
CAP_BINS = {
    "utility": ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager"),
    "compute": ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"),
}
_CONFIGS = (
    ("compute", "/etc/OpenCL/vendors/nvidia.icd"),
    ("graphics", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
    ("graphics", "/etc/vulkan/icd.d/nvidia_icd.json"),
    ("graphics", "/usr/share/vulkan/icd.d/nvidia_icd.json"),
)
_BIN_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin", "usr/local/bin", "usr/local/sbin")
_FAMILIES = frozenset(f.encode() for libs in CAP_LIBS.values() for f in libs)
NVIDIA_MAJOR = 195
CTL_MINOR, MODESET_MINOR = 255, 254


def effective_caps(caps):
    """The driver capabilities `caps` stand for: themselves and those they
    imply (IMPLIES: video needs compute, display needs graphics)."""
    out = set(caps)
    for c in caps:
        out.update(IMPLIES.get(c, ()))
    return out


class DevNode:
    __slots__ = ("path", "host_path", "major", "minor", "problem", "missing")

    def __init__(self, path, host_path, major, minor, problem=None):
        self.path, self.host_path = path, host_path
        self.major, self.minor, self.problem = major, minor, problem
        self.missing = False

    def __repr__(self):
        return f"DevNode({self.path} {self.major}:{self.minor}{' ' + self.problem if self.problem else ''})"


class Gpu:
    __slots__ = ("index", "minor", "model", "uuid", "bus_id", "proc_dir", "node")

    def __init__(self, index, minor, model, uuid, bus_id, proc_dir, node):
        self.index, self.minor, self.model, self.uuid = index, minor, model, uuid
        self.bus_id, self.proc_dir, self.node = bus_id, proc_dir, node

    def __repr__(self):
        return f"Gpu({self.index} minor={self.minor} {self.bus_id} {self.uuid})"


class MigDevice:
    __slots__ = ("gpu", "gi", "ci", "gi_access", "ci_access", "gi_node", "ci_node", "uuid")

    def __init__(self, gpu, gi, ci, gi_access, ci_access, gi_node, ci_node, uuid=None):
        self.gpu, self.gi, self.ci = gpu, gi, ci
        self.gi_access, self.ci_access = gi_access, ci_access
        self.gi_node, self.ci_node, self.uuid = gi_node, ci_node, uuid

    def __repr__(self):
        return f"MigDevice({self.gpu.index}:{self.gi}:{self.ci})"


class GpuHost:
    __slots__ = ("driver_root", "proc_root", "dev_root", "version", "majors", "frontend_name", "gpus",
                 "migs", "control", "libs", "bins", "firmware", "configs", "ipc", "problems",
                 "pinned", "notes")

    def path(self, p):
        """Host path of `p` (absolute, as seen from the driver root)."""
        return self.driver_root.rstrip("/") + "/" + p.lstrip("/")

    def proc(self, p):
        """Host path of a /proc file `p` (see proc_root())."""
        return self.proc_root.rstrip("/") + "/" + p.lstrip("/")


def proc_root(driver_root):
    """Where the driver's /proc files are read: the driver root's own proc/
    when it holds a snapshot of them (a simulated host has proc/devices), else
    the host's /proc.  The kernel module is host-wide: a containerised driver
    root such as /run/nvidia/driver carries libraries and binaries but no
    procfs of its own."""
    root = os.path.abspath(driver_root or "/")
    return root if os.path.isfile(os.path.join(root, "proc", "devices")) else "/"


def _read(path):
    try:
        return lsys.read_file(path).decode("utf-8", "replace")
    except FileNotFoundError:
        return None


def _kv(text):
    out = {}
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        if sep:
            out[key.strip()] = val.strip()
    return out


def _check_node(dev_root, name, major, minor, problems):
    host_path = os.path.join(dev_root, name)
    node = DevNode("/dev/" + name, host_path, major, minor)
    try:
        st = os.stat(host_path)
    except OSError as e:
        node.problem = f"{host_path}: {os.strerror(e.errno)}"
        node.missing = e.errno == errno.ENOENT
    else:
        if not stat.S_ISCHR(st.st_mode):
            node.problem = f"{host_path} is not a character device"
        elif (os.major(st.st_rdev), os.minor(st.st_rdev)) != (major, minor):
            node.problem = (f"{host_path} is {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}, "
                            f"expected {major}:{minor}")
    if node.problem:
        problems.append(node.problem)
    return node


def _version(host):
    vpath = host.proc("/proc/driver/nvidia/version")
    text = _read(vpath)
    if text is None:
        raise GpuError("NVIDIA kernel driver not loaded", f"{vpath} does not exist",
                       hint="load it (modprobe nvidia), or name the driver's root with "
                            "--driver-root (e.g. /run/nvidia/driver)")
    for tok in text.split("\n", 1)[0].split():
        parts = tok.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return tok
    raise GpuError("NVIDIA kernel driver", f"no version number in {vpath}",
                   hint="the driver root does not hold a driver's /proc files")


def _majors(host):
    text = _read(host.proc("/proc/devices")) or ""
    majors = {"nvidia": None, "nvidia-uvm": None, "nvidia-caps": None}
    frontend = None
    for line in text.split("Block devices:", 1)[0].splitlines():
        num, _, name = line.strip().partition(" ")
        if not num.isdigit():
            continue
        if name in ("nvidia", "nvidia-frontend") and int(num) == NVIDIA_MAJOR:
            majors["nvidia"], frontend = NVIDIA_MAJOR, name
        elif name in ("nvidia-uvm", "nvidia-caps"):
            majors[name] = int(num)
    if majors["nvidia"] is None:
        raise GpuError("NVIDIA kernel driver not loaded",
                       f"{host.proc('/proc/devices')} has no character major "
                       f"{NVIDIA_MAJOR} named nvidia or nvidia-frontend",
                       hint="load the kernel module (modprobe nvidia)")
    return majors, frontend


def _gpus(host):
    gdir = host.proc("/proc/driver/nvidia/gpus")
    try:
        names = sorted(n.lower() for n in os.listdir(gdir))
    except FileNotFoundError:
        names = []
    gpus = []
    for bus in names:
        pdir = os.path.join(gdir, bus)
        info = _kv(_read(os.path.join(pdir, "information")) or "")
        minor = info.get("Device Minor", "")
        if not minor.isdigit():
            host.problems.append(f"{pdir}/information has no Device Minor; GPU ignored")
            continue
        uuid = info.get("GPU UUID") or None
        if uuid and "?" in uuid:
            # The driver masks the UUID for unprivileged readers.
            host.problems.append(f"{pdir}/information hides the GPU UUID from this user")
            uuid = None
        node = _check_node(host.dev_root, f"nvidia{minor}", NVIDIA_MAJOR, int(minor), host.problems)
        gpus.append(Gpu(len(gpus), int(minor), info.get("Model", "unknown"), uuid,
                        info.get("Bus Location", bus).lower(), pdir, node))
    if not gpus:
        raise GpuError("no NVIDIA GPU found", f"{gdir} lists no GPU",
                       hint="check that the GPU is bound to the nvidia driver (lspci -k)")
    return gpus


def _cap_minor(path):
    text = _read(path)
    val = _kv(text).get("DeviceFileMinor", "") if text else ""
    return int(val) if val.isdigit() else None


def _migs(host):
    cdir = host.proc("/proc/driver/nvidia/capabilities")
    caps_major = host.majors["nvidia-caps"]
    by_minor = {g.minor: g for g in host.gpus}
    out = []
    for kind in ("config", "monitor"):
        m = _cap_minor(os.path.join(cdir, "mig", kind))
        if m is not None and caps_major is not None:
            # Optional like nvidia-modeset: an error only when a launch asks for it.
            host.control["mig-" + kind] = _check_node(
                host.dev_root, f"nvidia-caps/nvidia-cap{m}", caps_major, m, [])
    try:
        gdirs = [n for n in os.listdir(cdir) if n.startswith("gpu") and n[3:].isdigit()]
    except OSError:
        return out
    for gname in gdirs:
        # The capability tree names a GPU by its device minor, not its index.
        gpu = by_minor.get(int(gname[3:]))
        mdir = os.path.join(cdir, gname, "mig")
        try:
            gis = [n for n in os.listdir(mdir) if n.startswith("gi") and n[2:].isdigit()]
        except OSError:
            continue
        if gpu is None:
            host.problems.append(f"{mdir}: no GPU with minor {gname[3:]}")
            continue
        for gi_name in gis:
            gi_access = os.path.join(mdir, gi_name, "access")
            gi_minor = _cap_minor(gi_access)
            try:
                cis = [n for n in os.listdir(os.path.join(mdir, gi_name))
                       if n.startswith("ci") and n[2:].isdigit()]
            except OSError:
                continue
            for ci_name in cis:
                ci_access = os.path.join(mdir, gi_name, ci_name, "access")
                ci_minor = _cap_minor(ci_access)
                if gi_minor is None or ci_minor is None or caps_major is None:
                    host.problems.append(f"{ci_access}: no DeviceFileMinor or no nvidia-caps "
                                         f"major in /proc/devices; MIG device ignored")
                    continue
                gi_node = _check_node(host.dev_root, f"nvidia-caps/nvidia-cap{gi_minor}",
                                      caps_major, gi_minor, host.problems)
                ci_node = _check_node(host.dev_root, f"nvidia-caps/nvidia-cap{ci_minor}",
                                      caps_major, ci_minor, host.problems)
                out.append(MigDevice(gpu, int(gi_name[2:]), int(ci_name[2:]), gi_access,
                                     ci_access, gi_node, ci_node))
    out.sort(key=lambda m: (m.gpu.index, m.gi, m.ci))
    _check_mig_minors(host, out)
    return out


def _check_mig_minors(host, migs):
    """Cross-check the access files against nvidia-caps/mig-minors."""
    if not migs:
        return
    table = {}
    for line in (_read(host.proc("/proc/driver/nvidia-caps/mig-minors")) or "").splitlines():
        name, _, num = line.strip().rpartition(" ")
        if num.isdigit():
            table[name] = int(num)
    for m in migs:
        for key, node in ((f"gpu{m.gpu.minor}/gi{m.gi}/access", m.gi_node),
                          (f"gpu{m.gpu.minor}/gi{m.gi}/ci{m.ci}/access", m.ci_node)):
            if key in table and table[key] != node.minor:
                host.problems.append(f"mig-minors says {key} is {table[key]}, "
                                     f"its access file says {node.minor}")


def _files(host, resolve, environ):
    host.bins = {}
    for name in sorted({b for bins in CAP_BINS.values() for b in bins}):
        for d in _BIN_DIRS:
            real = resolve(f"{d}/{name}")
            if real is not None:
                host.bins[name] = real
                break
    host.firmware = []
    fdir = resolve(f"lib/firmware/nvidia/{host.version}", stat.S_ISDIR)
    if fdir is not None:
        for n in sorted(os.listdir(fdir)):
            if n.startswith("gsp") and n.endswith(".bin"):
                real = resolve(f"lib/firmware/nvidia/{host.version}/{n}")
                if real is not None:
                    host.firmware.append(real)
    host.configs = []
    for cap, cpath in _CONFIGS:
        real = resolve(cpath)
        if real is not None:
            host.configs.append((cap, cpath, real))
    host.ipc = {}
    for key, cpath in (("persistenced", "/var/run/nvidia-persistenced/socket"),
                       ("fabricmanager", "/var/run/nvidia-fabricmanager/socket")):
        real = resolve(cpath, stat.S_ISSOCK)
        if real is not None:
            host.ipc[key] = (cpath, real)
    _mps_dir(host, (environ or {}).get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def _mps_dir(host, mps):
    """The MPS pipe directory, injected only when it passes rundir's rule for
    a shared place: /tmp/nvidia-mps is a name any local user can take (a
    link to /root, another user's private directory, a directory of theirs
    with a fake control socket), so the path is walked from / by descriptor
    without following a link, every component root's or the caller's and
    closed to others' writes (a sticky /tmp aside), the directory itself
    root's (the system daemon) or the caller's.  Its inode is kept: the
    sandbox's init binds that one or fails.  Anything else is left out with
    a note (`list`, `run --verbose`)."""
    # rundir's rule, from linux/host.py, where it lives (rundir itself is not
    # loaded: a launch has no runtime directory of its own to find).
    from gpusandbox.linux.host import Taken, trusted_dir
    if not mps.startswith("/"):
        return
    # The driver root is the caller's own choice; below it is the shared place.
    path = os.path.realpath(host.driver_root).rstrip("/") + "/" + mps.strip("/")
    # Most hosts run no MPS daemon: a directory that is not there is left
    # out, as the walk would leave it, without the walk.  lstat: a link at
    # the path is there, and the walk refuses it.
    try:
        os.lstat(path)
    except FileNotFoundError:
        return
    try:
        fd = trusted_dir(path, own=False)
    except Taken as e:
        why = e.why if e.path == path else f"{e.path}: {e.why}"
        host.notes.append(("compute", f"MPS pipe directory {path} not injected: {why}"))
        return
    except OSError as e:
        if e.errno != errno.ENOENT:
            why = ("a symlink or a non-directory at or above it" if e.errno in (
                errno.ELOOP, errno.ENOTDIR) else os.strerror(e.errno))
            host.notes.append(("compute", f"MPS pipe directory {path} not injected: {why}"))
        return
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    host.ipc["mps"] = (mps, path)
    host.pinned[path] = (st.st_dev, st.st_ino)


def discover(driver_root="/", dev_root=None, environ=None):
    """Read the driver's files under driver_root; return a GpuHost or raise
    GpuError naming the missing layer (kernel module, GPUs, libraries).

    environ supplies CUDA_MPS_PIPE_DIRECTORY (the launcher's own environment
    when None)."""
    root = os.path.abspath(driver_root or "/")
    if not os.path.isdir(root):
        raise GpuError(f"--driver-root {driver_root}", "not a directory",
                       hint="name the directory that holds the driver's /proc, /dev and /usr")
    host = GpuHost()
    host.driver_root = root
    host.proc_root = proc_root(root)
    host.dev_root = os.path.abspath(dev_root) if dev_root else os.path.join(root, "dev")
    host.problems = []
    host.notes = []
    host.pinned = {}
    host.version = _version(host)
    host.majors, host.frontend_name = _majors(host)
    host.gpus = _gpus(host)
    ctl = host.control = {}
    ctl["nvidiactl"] = _check_node(host.dev_root, "nvidiactl", NVIDIA_MAJOR, CTL_MINOR, host.problems)
    ctl["nvidia-modeset"] = _check_node(host.dev_root, "nvidia-modeset", NVIDIA_MAJOR,
                                        MODESET_MINOR, [])   # optional: only display needs it
    uvm = host.majors["nvidia-uvm"]
    if uvm is not None:
        ctl["nvidia-uvm"] = _check_node(host.dev_root, "nvidia-uvm", uvm, 0, host.problems)
        ctl["nvidia-uvm-tools"] = _check_node(host.dev_root, "nvidia-uvm-tools", uvm, 1,
                                              host.problems)
    host.migs = _migs(host)
    resolve = _libs_mod.Resolver(root)
    try:
        host.libs = _libs_mod.find(host, resolve, _FAMILIES)
        _files(host, resolve, os.environ if environ is None else environ)
    finally:
        resolve.close()
    return host
