"""The launchers under test and the command line each one gets.

Every launcher runs the same command in the same small rootfs, with the same
namespaces (user when rootless, mount, pid, uts, ipc, cgroup; the host's
network, which a root gpusandbox launch shares only with --net host), a read-only root, fresh /proc,
/dev, /tmp and /run, read-only /sys, and the same number of bind mounts as a
gpusandbox launch with two GPUs."""
import json
import os

SANDBOX_NS = ("pid", "ipc", "uts", "mount", "cgroup")


def proc_masks(binds):
    """Binds under /proc (the masked /proc/driver/nvidia) need a tmpfs first:
    nothing can be created in procfs.  gpusandbox mounts one there too."""
    return sorted({"/".join(dst.split("/")[:3]) for _s, dst, _k in binds
                   if dst.startswith("/proc/")})


class Launcher:
    """One row of the table.  `context` says which runner spawns it:
    (mode, view) where mode is "root" or "rootless" and view is True when it
    needs the private cgroup2 view of /sys/fs/cgroup."""

    def __init__(self, name, family, mode, make_argv, view=False, note=None):
        self.name = name
        self.family = family
        self.mode = mode
        self.make_argv = make_argv
        self.view = view
        self.note = note
        self.status = "ok"
        self.reason = None
        self.samples = []
        self.cpu = []           # user + system CPU ms per launch (wait4 rusage)
        self.stats = None

    @property
    def context(self):
        return (self.mode, self.view)

    def argv(self, i, cmd):
        return self.make_argv(i, cmd)

    def skip(self, reason):
        self.status = "not run"
        self.reason = reason
        return self


def gpusandbox(exe, mode, gpus, sim, image, label=None):
    """gpus: None (no GPU option), "none", or a list such as "0,1"."""
    label = label or {None: "plain", "none": "none"}.get(gpus, "gpu")

    def make(_i, cmd):
        argv = [exe, "run"]
        if mode == "root":
            argv += ["--net", "host"]     # the same namespaces as every other row
        if gpus is not None:
            argv += ["--driver-root", sim, "--gpus", gpus]
        return argv + [image, *cmd]
    return Launcher(f"gsbx-{mode}-{label}", "gsbx", mode, make)


def bwrap(exe, mode, image, binds):
    base = [exe, "--unshare-user", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup", "--die-with-parent",
            "--new-session", "--ro-bind", image, "/", "--proc", "/proc",
            "--dev", "/dev", "--ro-bind", "/sys", "/sys",
            "--tmpfs", "/tmp", "--tmpfs", "/run"]
    for mask in proc_masks(binds):
        base += ["--tmpfs", mask]
    for src, dst, kind in binds:
        base += ["--dev-bind" if kind == "dev" else "--ro-bind", src, dst]

    def make(_i, cmd):
        return base + ["--", *cmd]
    return Launcher(f"bwrap-{mode}", "bwrap", mode, make)


def floor(mode, image):
    """unshare + chroot: the namespaces and nothing else, a lower bound."""
    base = ["unshare", "--mount", "--uts", "--ipc", "--pid", "--cgroup", "--fork",
            f"--mount-proc={image}/proc"]
    if mode == "rootless":
        base.append("--map-root-user")

    def make(_i, cmd):
        return base + ["chroot", image, *cmd]
    return Launcher(f"floor-{mode}", "floor", mode, make,
                    note="unshare+chroot: namespaces only, no mounts")


def oci_config(image, binds, mode, ids, cgroups_path, proc_elsewhere=None):
    """An OCI runtime config equivalent to the gpusandbox launch.

    Rootless, the caller is mapped to uid 0 inside (what `runc spec
    --rootless` writes; runc requires a mapping for root).  proc_elsewhere:
    a directory that takes the place of /proc for the masked
    /proc/driver/nvidia binds, for runtimes that refuse any mount inside /proc
    (runc); the number of mounts stays the same."""
    uid, gid = ids if mode == "rootless" else (0, 0)
    masks = proc_masks(binds)
    if proc_elsewhere:
        binds = [(s, proc_elsewhere + d[5:] if d.startswith("/proc/") else d, k)
                 for s, d, k in binds]
        masks = [proc_elsewhere + m[5:] for m in masks]
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
         "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
        {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
         "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=1777"]},
        {"destination": "/run", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "nodev", "mode=755"]},
        # rbind, not a fresh sysfs: sysfs needs the network namespace's owner.
        {"destination": "/sys", "type": "none", "source": "/sys",
         "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]},
    ]
    for mask in masks:
        mounts.append({"destination": mask, "type": "tmpfs", "source": "tmpfs",
                       "options": ["nosuid", "nodev", "noexec", "mode=755"]})
    for src, dst, kind in binds:
        opts = ["bind", "ro", "nosuid"] + ([] if kind == "dev" else ["nodev"])
        mounts.append({"destination": dst, "type": "bind", "source": src, "options": opts})
    caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
    linux = {
        "namespaces": [{"type": t} for t in SANDBOX_NS],
        "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                        "/proc/timer_list", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
                          "/proc/sysrq-trigger"],
    }
    if mode == "rootless":
        linux["namespaces"].append({"type": "user"})
        linux["uidMappings"] = [{"containerID": 0, "hostID": uid, "size": 1}]
        linux["gidMappings"] = [{"containerID": 0, "hostID": gid, "size": 1}]
        uid = gid = 0
    if cgroups_path:
        linux["cgroupsPath"] = cgroups_path
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False, "user": {"uid": uid, "gid": gid},
            "args": ["/bin/true"], "cwd": "/", "noNewPrivileges": True,
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "capabilities": {k: ([] if mode == "rootless" else caps)
                             for k in ("bounding", "effective", "permitted")},
        },
        "root": {"path": image, "readonly": True},
        "hostname": "bench",
        "mounts": mounts,
        "linux": linux,
    }


def write_bundle(path, config, owner=None):
    os.makedirs(path, mode=0o755)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    if owner:
        os.chown(path, *owner)
        os.chown(os.path.join(path, "config.json"), *owner)


def oci(runtime, exe, mode, bundle, state, view, note=None):
    """`crun|runc --root STATE run --bundle B ID`: the command is in the
    bundle's config, so each call writes nothing but the runtime's state."""
    extra = []
    if runtime == "crun" and mode == "rootless":
        # No delegated cgroup for the benchmark user: say so up front rather
        # than have crun try and fall back.
        extra = ["--cgroup-manager=disabled"]

    def make(i, cmd):
        if cmd != ["/bin/true"]:
            raise ValueError("OCI bundles are written for /bin/true")
        return [exe, "--root", state, *extra, "run", "--bundle", bundle,
                f"gsbx-bench-{os.getpid()}-{i}"]
    return Launcher(f"{runtime}-{mode}", runtime, mode, make, view=view, note=note)


def podman(exe, mode, image, binds, store, view, note=None, runtime=None):
    """runtime: (row label, OCI runtime binary) for `--runtime`; None: podman's default."""
    base = [exe, *(["--runtime", runtime[1]] if runtime else []), "--root", f"{store}/root", "--runroot", f"{store}/run",
            "--tmpdir", f"{store}/tmp", "--storage-driver", "vfs",
            "--events-backend", "none", "--cgroup-manager", "cgroupfs",
            "run", "--rm", "--read-only", "--network", "host",
            "--cgroups", "disabled", "--log-driver", "none",
            # podman's default nofile and nproc limits are above many hosts'
            # hard limits, and crun then fails in setrlimit.
            "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
    if runtime:
        # Only crun implements podman's --cgroups disabled (podman refuses
        # it for other runtimes): these rows keep podman's cgroup default.
        i = base.index("--cgroups")
        del base[i:i + 2]
    for mask in proc_masks(binds):
        base += ["--mount", f"type=tmpfs,destination={mask}"]
    for src, dst, _kind in binds:
        # --mount, not -v: PCI bus ids in the paths hold colons.
        base += ["--mount", f"type=bind,source={src},destination={dst},readonly"]

    def make(_i, cmd):
        return base + ["--rootfs", image, *cmd]
    name = f"podman-{runtime[0]}-{mode}" if runtime else f"podman-{mode}"
    return Launcher(name, "podman", mode, make, view=view, note=note)
