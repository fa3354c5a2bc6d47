"""RunSpec: what the user asked `gpusandbox run` for, parsed but not yet
checked against the host.  Plain __slots__ classes: built on every launch,
where attrs' import cost (~20 ms) would double the launcher's own time."""

# IMAGE given as one squashfs file (image/squash.py) is known by its name.
SQUASHFS_SUFFIXES = (".sqsh", ".squashfs")


def names_squashfs(image):
    """Whether IMAGE's name marks a squashfs file (FILE.sqsh, FILE.squashfs);
    a string check only: the caller decides what a directory of that name is."""
    return image.endswith(SQUASHFS_SUFFIXES)


class Bind:
    __slots__ = ("src", "dst", "rw", "kind")

    def __init__(self, src, dst, rw=True, kind=None):
        self.src = src
        self.dst = dst
        self.rw = rw
        self.kind = kind         # "dir" or "file", from the plan's stat of src

    def __repr__(self):
        return f"Bind({self.src!r}:{self.dst!r}:{'rw' if self.rw else 'ro'})"


class Tmpfs:
    """--mount type=tmpfs: a fresh tmpfs at dst, in the list of binds so that
    every user mount lands in the order given.  src is None: nothing of the
    host is opened for it."""
    __slots__ = ("dst", "size", "mode", "rw")
    src = None
    kind = "dir"

    def __init__(self, dst, size=None, mode=0o1777, rw=True):
        self.dst = dst
        self.size = size         # bytes, or None: the kernel's default (half of RAM)
        self.mode = mode
        self.rw = rw

    def options(self):
        opts = ["source=tmpfs", f"mode={self.mode:o}"]
        if self.size is not None:
            opts.append(f"size={self.size}")
        return tuple(opts)

    def __repr__(self):
        return f"Tmpfs({self.dst!r} size={self.size} mode={self.mode:o})"


class RunSpec:
    __slots__ = (
        "image", "argv",
        # namespaces and identity
        "net", "userns", "fakeroot", "user", "user_by_image", "hostname",
        # root filesystem
        "rootfs_mode", "binds",
        # process
        "workdir", "env_set", "env_files", "env_host", "tty", "verbose",
        # GPU and other devices
        "devices", "cdi_devices", "gpus", "gpu_caps", "gpu_request",
        "driver_root", "dev_root", "no_require",
        # cgroup
        "cgroup_parent", "memory", "memory_swap", "pids_limit", "cpus", "best_effort",
        # security
        "seccomp",
        # images (an image reference as IMAGE): --entrypoint, --platform, --store
        "entrypoint", "platform", "store", "image_ref", "image_env", "image_fd",
        "image_dirs",
        # tests only: stop at a named setup stage (GPUSANDBOX_TEST_PAUSE, honoured
        # only by the test suite's install: testhook.pause_hook_enabled)
        "pause_at",
        # one-line notes of the parser for the user (a --gpus N that docker
        # would read as a count)
        "notes",
        # GPU sharing and forward compatibility (docs/sharing.md)
        "cuda_compat", "gpu_memory", "gpu_compute",
        # pod mode (hpc/pod.py): --share, --shm-size, --gpu-visibility
        "share", "shm_size", "gpu_visibility",
        # --profile untrusted (profile.py)
        "profile",
        # --mount-home / --no-mount-home; None: the mount-home setting (siterun.py)
        "mount_home",
        # the network half (fabric/, docs/fabric.md): --fabric, --fabric-libs, --mpi
        "fabric", "fabric_libs", "mpi",
        # an OCI runtime launch: its config.json read as typed data
        # (oci/configplan.OciRequest), else None
        "oci",
        # run --name/--detach: name, detach, auto-remove, and the launch's
        # record (live/launch.Live, set by the front end), else None
        "name", "detach", "auto_remove", "live",
    )

    def __init__(self):
        self.image = None
        self.argv = []
        self.net = None              # host | none; None: chosen by the plan (_identity)
        self.userns = "auto"         # auto | single | subids | host
        self.fakeroot = False        # --root
        self.user = None             # (uid, gid) under real root
        # spec.user is the image's User (a store image's or a .sqsh file's
        # config), not --user: the plan gives it no host network by default.
        self.user_by_image = False
        self.hostname = None
        self.rootfs_mode = "ro"      # ro | tmpfs-overlay | rw
        self.binds = []              # Bind and Tmpfs, in the order given
        self.workdir = None
        self.env_set = []            # -e items in order: "K=V" or "K"
        self.env_files = []
        self.env_host = False
        self.tty = False
        self.verbose = False
        self.devices = []           # --device HOST[:DST], in order
        self.cdi_devices = []       # --device VENDOR/CLASS=NAME, in order
        self.gpus = None
        self.gpu_caps = None
        self.gpu_request = None     # a door's own GpuRequest (gpu/request.py); None: from the above
        self.driver_root = None
        self.dev_root = None
        self.no_require = False
        self.cgroup_parent = None
        self.memory = None
        self.memory_swap = None
        self.pids_limit = None
        self.cpus = None
        self.best_effort = False
        self.seccomp = "default"
        self.entrypoint = None
        self.platform = None
        self.store = None
        self.image_ref = False       # IMAGE is an image reference (cli.is_image_ref)
        self.image_env = None        # (env items, workdir) of a store image's config
        self.image_fd = None         # O_PATH fd of a store image's rootfs (storeread.py)
        # A shared store's image: its directories' own owner and mode, which
        # the publish sealed and the overlay shows again (StoreReader.sealed)
        self.image_dirs = ()
        self.pause_at = None
        self.notes = []
        self.cuda_compat = "auto"    # auto | off | force (gpu/compat.py)
        self.gpu_memory = None       # --gpu-memory text, checked by gpu/share.py
        self.gpu_compute = None      # --gpu-compute text
        self.share = None            # node | none; None: node in a multi-task Slurm step
        self.shm_size = None
        self.gpu_visibility = None   # task | step
        self.profile = None          # untrusted, or None
        self.mount_home = None       # True | False | None (the setting)
        self.fabric = None           # auto | all | none | HCA names; None: fabric/select.py
        self.fabric_libs = None      # host | None (the image's own rdma-core)
        self.mpi = None              # host | None
        self.oci = None
        self.name = None
        self.detach = False
        self.auto_remove = False
        self.live = None
