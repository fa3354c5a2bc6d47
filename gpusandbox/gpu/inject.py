"""GPU injection as data: a Selection on a GpuHost -> ContainerEdits.

`plan()` decides, from host facts only, which host files a launch needs
(device nodes, libraries, binaries, firmware, config files, IPC, /proc
files); `gpusandbox list` prints it.  `build_edits()` places them in the
image the way the reference stack does and regenerates the image's
ld.so.cache.  The image is untrusted: it is read only through read_in_root
(openat2 RESOLVE_IN_ROOT), and nothing read from it becomes a mount source.
"""
import os

from gpusandbox.edits import ContainerEdits, DeviceNode, File, Mount, Symlink, Tmpfs
from gpusandbox.errors import GpuError
from gpusandbox.gpu import ldcache
from gpusandbox.gpu.discover import CAP_BINS, CAP_LIBS, effective_caps
from gpusandbox.linux.sys import kind_in_root, read_file, read_in_root

RO = ("ro", "nosuid", "nodev")
RO_PROC = ("ro", "nosuid", "nodev", "noexec")
# MPS clients reach the control daemon through the sockets and pipes in its
# pipe directory; connecting to a socket or opening a FIFO needs no write
# access to the mount (only creating or removing entries does), so it is
# shared read-only: a sandbox that could write there could replace the
# `control` socket every other client and `mps down` talk to.
MPS_IPC = ("ro", "nosuid", "nodev", "noexec")
# The pieces each capability is for, and what a launch does without them
# (README "GPUs" and docs/doctor.md carry the same table):
#   "fatal": the capability can do nothing at all without it: the launch fails;
#   "key":   the capability can do nothing without all of its key pieces; the
#            launch fails only when every capability it asked for is in that state;
#   "warn":  part of the capability works without it.
# Everything missing that does not fail the launch is named in one warning
# line and the rest is injected, as the reference stack does.  compat32 has no
# entry: 32-bit copies are injected when the host has them, and most hosts don't.
# The other libraries of a capability (CAP_LIBS) vary between driver branches
# and are injected when present, silently.
PIECES = {
    "compute": (("libcuda", "fatal"), ("libnvidia-ptxjitcompiler", "warn")),
    "utility": (("libnvidia-ml", "key"), ("nvidia-smi", "warn")),
    "video": (("libnvcuvid", "key"), ("libnvidia-encode", "key"), ("libvdpau_nvidia", "key")),
    "graphics": (("libGLX_nvidia", "key"), ("libEGL_nvidia", "key"),
                 ("libnvidia-glcore", "warn"), ("libnvidia-eglcore", "warn")),
    "display": (("/dev/nvidia-modeset", "key"),),
    "ngx": (("libnvidia-ngx", "key"),),
}
# SONAME major per family when the ELF cannot be read (driver 470-560 values).
_SONAME_MAJOR = {"libGLX_nvidia": "0", "libEGL_nvidia": "0", "libGLESv2_nvidia": "2",
                 "libnvidia-nvvm": "4", "libnvidia-nscq": "2"}
_LIBDIRS = {"x86_64": ("x86_64-linux-gnu", "/usr/lib64"),
            "aarch64": ("aarch64-linux-gnu", "/usr/lib64")}
# With --rw the image itself is the root: nothing may be created or replaced
# in it.  Libraries, their links and binaries then go to this directory on the
# sandbox's own /run tmpfs (the regenerated ld.so.cache lists it; PATH gets
# the bin directory); other driver files are bound only over paths the image
# already has.
PRIVATE = "/run/gpusandbox"
PRIVATE_BIN = PRIVATE + "/bin"
# The sandbox's own filesystems (plan.OWN_FS): mount points there never touch the image.
_OWN_FS = ("/proc/", "/sys/", "/dev/", "/tmp/", "/run/")


def _lacks(kind, host_path):
    """Whether the image lacks a mount point of the host file's kind."""
    if kind is None:
        return True
    return (kind == "dir") != os.path.isdir(host_path)


class Injection:
    """What a launch takes from the host, grouped.  nodes: DevNode list;
    libs: Library list; bins: [(name, host path)]; firmware: [host path];
    configs/ipc/proc: [(container path, host path, mount options)];
    missing: [Missing] the host lacks, none of them fatal."""
    __slots__ = ("caps", "nodes", "libs", "bins", "firmware", "configs", "ipc", "proc", "missing",
                 "skipped")


class Missing:
    """A piece of a capability the driver root lacks: cap, piece (a library
    family, a binary name or a /dev path), severity (PIECES), fix."""
    __slots__ = ("cap", "piece", "severity", "fix")

    def __init__(self, cap, piece, severity, fix):
        self.cap, self.piece, self.severity, self.fix = cap, piece, severity, fix

    def __repr__(self):
        return f"Missing({self.piece} ({self.cap}) {self.severity})"


def _has(host, piece):
    if piece.startswith("/dev/"):
        node = host.control.get(piece[5:])
        return node is not None and not node.missing
    if piece.startswith("lib"):
        return any(lib.family == piece and lib.bits == 64 for lib in host.libs)
    return piece in host.bins


def _fix(host, piece):
    if piece == "/dev/nvidia-modeset":
        return "modprobe nvidia-modeset, or nvidia-modprobe -m (creates /dev/nvidia-modeset)"
    what = "nvidia-smi" if piece == "nvidia-smi" else f"{piece}.so.{host.version}"
    return (f"install {what} of driver {host.version} into the driver root "
            f"({host.driver_root}), then run ldconfig there")


def missing_pieces(host, caps):
    """[Missing] for the capabilities `caps` (effective, see effective_caps),
    in PIECES order."""
    return [Missing(cap, piece, sev, _fix(host, piece))
            for cap in PIECES if cap in caps
            for piece, sev in PIECES[cap] if not _has(host, piece)]


def _judge(host, sel, caps, missing):
    """Raise when the launch cannot work: a fatal piece is missing, or every
    capability asked for lacks all of its key pieces."""
    for m in missing:
        if m.severity == "fatal":
            raise GpuError(f"driver library {m.piece}.so.{host.version}",
                           f"neither {host.path('/etc/ld.so.cache')} nor the driver's library "
                           f"directories hold it, and the '{m.cap}' capability cannot work "
                           "without it",
                           hint=f"{m.fix}; or drop the '{m.cap}' capability (--gpu-caps)")
    judged = [c for c in PIECES if c in caps]
    dead = [c for c in judged
            if all(not _has(host, p) for p, sev in PIECES[c] if sev in ("key", "fatal"))]
    if judged and dead == judged:
        names = ", ".join(f"{m.piece} ({m.cap})" for m in missing if m.severity != "warn")
        raise GpuError(f"--gpu-caps {','.join(sel.caps)}",
                       f"the driver root lacks {names}: none of these capabilities can work",
                       hint="; ".join(dict.fromkeys(m.fix for m in missing if m.severity != "warn")))


def warning(inj):
    """The one warning line (without the "gpusandbox: " prefix) naming what
    a launch goes without, or None."""
    if not inj.missing:
        return None
    by_cap = {}
    for m in inj.missing:
        by_cap.setdefault(m.cap, []).append(m.piece)
    what = "; ".join(f"{', '.join(p)} ({c})" for c, p in by_cap.items())
    return (f"warning: the GPU driver lacks {what}: injecting the rest "
            "('gpusandbox doctor' shows the fixes)")


def _node(node, why, hint):
    if node is None or node.problem:
        raise GpuError(f"device node {node.path if node else why}",
                       node.problem if node else "missing", hint=hint)
    return node


def plan(host, sel):
    """Host-side injection plan for `sel`: what the host has of it, with
    inj.missing naming what it lacks (raises GpuError on a missing or
    mismatched required device node, or when the launch cannot work: see
    PIECES)."""
    caps = effective_caps(sel.caps)
    inj = Injection()
    inj.caps = caps
    hint_nodes = "create the nodes (nvidia-modprobe, or mknod with the numbers shown)"
    nodes = [_node(host.control.get("nvidiactl"), "/dev/nvidiactl", hint_nodes)]
    for g in sel.node_gpus():
        nodes.append(_node(g.node, None, hint_nodes))
    if "compute" in caps:
        if host.majors.get("nvidia-uvm") is None:
            raise GpuError("nvidia-uvm kernel module not loaded",
                           "/proc/devices has no nvidia-uvm major (CUDA needs it)",
                           hint="modprobe nvidia-uvm, or nvidia-modprobe -u -c=0")
        nodes.append(_node(host.control.get("nvidia-uvm"), "/dev/nvidia-uvm", hint_nodes))
        nodes.append(_node(host.control.get("nvidia-uvm-tools"), "/dev/nvidia-uvm-tools",
                           hint_nodes))
    modeset = host.control.get("nvidia-modeset")
    if "display" in caps and modeset is not None and not modeset.missing:
        # A node with the wrong numbers is refused; an absent one is a
        # missing piece (headless hosts do not load nvidia-modeset).
        nodes.append(_node(modeset, "/dev/nvidia-modeset",
                           "modprobe nvidia-modeset, or nvidia-modprobe -m"))
    for m in sel.migs:
        nodes += [_node(m.gi_node, None, hint_nodes), _node(m.ci_node, None, hint_nodes)]
    for flag, key in ((sel.mig_config, "mig-config"), (sel.mig_monitor, "mig-monitor")):
        if flag:
            nodes.append(_node(host.control.get(key), f"MIG {key[4:]} capability", hint_nodes))
    inj.nodes = nodes

    families = {f for c in caps for f in CAP_LIBS.get(c, ())}
    bits = (64, 32) if "compat32" in caps else (64,)
    inj.libs = [lib for lib in host.libs if lib.family in families and lib.bits in bits]
    inj.missing = missing_pieces(host, caps)
    _judge(host, sel, caps, inj.missing)
    wanted = {b for c in caps for b in CAP_BINS.get(c, ())}
    inj.bins = [(n, p) for n, p in sorted(host.bins.items()) if n in wanted]
    inj.firmware = list(host.firmware)
    inj.configs = [(cp, hp, RO) for cap, cp, hp in host.configs if cap in caps]
    ipc = []
    if "utility" in caps:
        ipc += [host.ipc[k] + (RO_PROC,) for k in ("persistenced", "fabricmanager")
                if k in host.ipc]
    if "compute" in caps and "mps" in host.ipc:
        ipc.append(host.ipc["mps"] + (MPS_IPC,))
    inj.ipc = ipc
    inj.skipped = [text for cap, text in host.notes if cap in caps]
    proc = [("/proc/driver/nvidia/version", host.proc("/proc/driver/nvidia/version"), RO_PROC)]
    for g in sel.node_gpus():
        proc.append((f"/proc/driver/nvidia/gpus/{g.bus_id}", g.proc_dir, RO_PROC))
    cdir = "/proc/driver/nvidia/capabilities"
    for m in sel.migs:
        for host_path in (m.gi_access, m.ci_access):
            rel = host_path.split("/capabilities/", 1)[1]
            proc.append((f"{cdir}/{rel}", host_path, RO_PROC))
    for flag, kind in ((sel.mig_config, "config"), (sel.mig_monitor, "monitor")):
        if flag:
            proc.append((f"{cdir}/mig/{kind}", host.proc(f"{cdir}/mig/{kind}"), RO_PROC))
    # The mask covers all of /proc/driver; its other entries (nvidia-caps,
    # nvidia-uvm, nvidia-nvlink, rtc, ...) show through as the reference stack
    # leaves them, read-only.
    pdir = host.proc("/proc/driver")
    try:
        others = sorted(n for n in os.listdir(pdir) if n != "nvidia")
    except OSError:
        others = []
    for name in others:
        proc.append((f"/proc/driver/{name}", f"{pdir}/{name}", RO_PROC))
    inj.proc = proc
    return inj


def device_rules(host, sel):
    """[(type, major, minor, access)] for the BPF device filter: exactly the
    nodes the sandbox receives."""
    return [("c", n.major, n.minor, "rwm") for n in plan(host, sel).nodes]


def _soname(lib):
    name = lib.soname or ldcache.elf_soname(lib.host_path)
    if name:
        return name
    return f"{lib.family}.so.{_SONAME_MAJOR.get(lib.family, '1')}"


def _params(host):
    """The host's params with ModifyDeviceFiles: 0, so libraries inside never
    try to create or chmod /dev nodes."""
    try:
        lines = read_file(host.proc("/proc/driver/nvidia/params")).decode(
            "utf-8", "replace").splitlines()
    except OSError:
        lines = []
    out = [ln for ln in lines if not ln.startswith("ModifyDeviceFiles:")]
    out.insert(0, "ModifyDeviceFiles: 0")
    return ("\n".join(out) + "\n").encode()


def image_cache(image_root):
    """The image's cache entries, or [] when it has none or it is malformed
    (ld.so ignores a malformed cache too)."""
    data = read_in_root(image_root, "/etc/ld.so.cache", limit=ldcache.MAX_FILE)
    if not data:
        return []
    try:
        return ldcache.parse(data)
    except (ldcache.CacheError, ValueError):
        return []


def build_edits(host, sel, image_root, environ=None, private=False, notes=None, compat=None,
                in_place=False):
    """ContainerEdits that give the image the selection.

    image_root: the image's held root fd (or a path).  private: the image is
    not ours to change (--rw, the host's root); see PRIVATE.  compat: a
    gpu.compat.Decision; when it says so, the cache names the image's
    forward-compat libraries instead.  in_place: the image is the driver
    root itself (the host's root with the host's driver): its libraries,
    binaries, firmware, configs and loader cache are already where they
    belong, so only the nodes, IPC, /proc and environment are added."""
    inj = plan(host, sel)
    if in_place:
        inj.libs, inj.bins, inj.firmware, inj.configs = [], [], [], []
    edits = ContainerEdits()
    for n in inj.nodes:
        edits.device_nodes.append(DeviceNode(n.path, n.host_path, n.major, n.minor, "rw"))

    multiarch, other64 = _LIBDIRS.get(os.uname().machine, _LIBDIRS["x86_64"])
    debian = read_in_root(image_root, "/etc/debian_version", limit=4096) is not None
    libdir = {64: f"/usr/lib/{multiarch}" if debian else other64,
              32: "/usr/lib/i386-linux-gnu" if debian else "/usr/lib"}
    bindir = "/usr/bin"
    if private:
        libdir = {64: PRIVATE + "/lib", 32: PRIVATE + "/lib32"}
        bindir = PRIVATE_BIN
        if not in_place and kind_in_root(image_root, "/etc/ld.so.cache") != "file":
            raise GpuError("--rw with GPUs", "the image has no /etc/ld.so.cache to place "
                           "the driver's loader cache over",
                           hint="run ldconfig in the image once, or drop --rw "
                                "(the default overlay leaves the image untouched)")
    entries, links = [], {}
    for lib in inj.libs:
        d = libdir[lib.bits]
        if lib.subdir:
            # A plugin its loader opens by path (libvdpau: <libdir>/vdpau/
            # libvdpau_nvidia.so.1): its directory and SONAME link, no cache entry.
            d = f"{d}/{lib.subdir}"
            edits.mounts.append(Mount(lib.host_path, f"{d}/{lib.name}", RO))
            soname = _soname(lib)
            if soname != lib.name and "/" not in soname:
                links[f"{d}/{soname}"] = lib.name
            continue
        edits.mounts.append(Mount(lib.host_path, f"{d}/{lib.name}", RO))
        soname = _soname(lib)
        if soname == lib.name or "/" in soname:
            entries.append(ldcache.Entry(lib.name.encode(), f"{d}/{lib.name}".encode(), lib.flags))
            continue
        links[f"{d}/{soname}"] = lib.name
        dev = f"{lib.family}.so"
        if soname != dev:
            links[f"{d}/{dev}"] = soname
            entries.append(ldcache.Entry(dev.encode(), f"{d}/{dev}".encode(), lib.flags))
        entries.append(ldcache.Entry(soname.encode(), f"{d}/{soname}".encode(), lib.flags))
    edits.symlinks += [Symlink(p, t) for p, t in links.items()]
    for name, host_path in inj.bins:
        edits.mounts.append(Mount(host_path, f"{bindir}/{name}", RO))
    others = [(host_path, f"/lib/firmware/nvidia/{host.version}/{os.path.basename(host_path)}",
               RO) for host_path in inj.firmware]
    others += [(host_path, cpath, opts) for cpath, host_path, opts in inj.configs + inj.ipc]
    for host_path, cpath, opts in others:
        if private and cpath.startswith("/var/run/"):
            # Every current distribution links /var/run to /run, which is
            # the sandbox's own tmpfs: the socket needs nothing in the image.
            cpath = cpath[4:]
        if private and not cpath.startswith(_OWN_FS) and \
                _lacks(kind_in_root(image_root, cpath), host_path):
            if notes is not None:
                notes.append(f"{cpath} is not in the image; not injected (with --rw or "
                             "the host's root, it is never modified for GPU files)")
            continue
        edits.mounts.append(Mount(host_path, cpath, opts, ident=host.pinned.get(host_path)))
    if notes is not None:
        notes += inj.skipped

    if compat is not None and compat.use:
        from gpusandbox.gpu.compat import prefer
        entries = prefer(entries, compat, lambda n, p: ldcache.Entry(n.encode(), p.encode()))
    if not in_place:
        # The image's own entries for the injected names would shadow the
        # host driver (an image-shipped libcuda.so.1 of another version).
        ours = {(e.name, e.flags) for e in entries}
        merged = [e for e in image_cache(image_root) if (e.name, e.flags) not in ours]
        edits.files.append(File("/etc/ld.so.cache", ldcache.build(merged + entries), 0o444))

    # /proc/driver/nvidia shows every GPU of the host: mask it and show the
    # selected GPUs' directories only.  The mask sits on /proc/driver, which
    # every procfs has, so the same edits work where the host's procfs has no
    # nvidia entry (a containerised driver root, a simulated host); procfs
    # refuses new directories, a tmpfs does not.
    edits.tmpfs.append(Tmpfs("/proc/driver"))
    for cpath, host_path, opts in inj.proc:
        edits.mounts.append(Mount(host_path, cpath, opts))
    edits.files.append(File("/proc/driver/nvidia/params", _params(host), 0o444))

    edits.env["NVIDIA_VISIBLE_DEVICES"] = sel.visible
    edits.env["NVIDIA_DRIVER_CAPABILITIES"] = ",".join(sel.caps)
    if environ and "CUDA_VISIBLE_DEVICES" in environ:
        # The caller's value names host devices; inside, CUDA numbers the
        # sandbox's devices 0..n-1.
        edits.env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(sel.device_count()))
    return edits
