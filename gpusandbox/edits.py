"""Container edits: what a feature adds to a sandbox, as plain data.

Shaped like CDI containerEdits (deviceNodes, mounts, env, hooks-free), so that
GPU injection, CDI input and CDI output share one form.  The launcher applies
edits generically; nothing here touches the kernel.

Every container path is absolute and is resolved inside the new root without
following symlinks out of it.  Every host path is opened on the host side
before any namespace exists (never a path that came from the image).

Plain __slots__ classes, not attrs: these objects are built on every GPU
launch and attrs' import (~20 ms) would land on the launch path (see
docs/DESIGN.md, "launch path").
"""


class DeviceNode:
    """A host character device bind-mounted into the sandbox's /dev.

    major/minor are the numbers discovery expects; the launcher fstat()s the
    opened host node and refuses it when st_rdev differs (a swapped node)."""
    __slots__ = ("path", "host_path", "major", "minor", "permissions")

    def __init__(self, path, host_path, major, minor, permissions="rw"):
        self.path = path
        self.host_path = host_path
        self.major = major
        self.minor = minor
        self.permissions = permissions

    def __repr__(self):
        return f"DeviceNode({self.path!r} <- {self.host_path!r} {self.major}:{self.minor})"


class Mount:
    """A read-only (unless 'rw' in options) bind mount of a host file or dir.

    options: subset of {"ro", "rw", "nosuid", "nodev", "noexec"}.
    kind: "dir" or "file", filled in by the plan from the host path.
    ident: (st_dev, st_ino) the host path had when it was checked (a
    directory in a place other users can write, such as the MPS pipe
    directory): the init binds that inode, reached without a symlink, or
    fails; None for paths bound as named."""
    __slots__ = ("host_path", "path", "options", "kind", "ident")

    def __init__(self, host_path, path, options=("ro", "nosuid", "nodev"), kind=None,
                 ident=None):
        self.host_path = host_path
        self.path = path
        self.options = tuple(options)
        self.kind = kind
        self.ident = ident

    def __repr__(self):
        return f"Mount({self.host_path!r} -> {self.path!r} {','.join(self.options)})"


class Symlink:
    """A symlink created inside the sandbox at `path` pointing to `target`.

    The launcher checks that `target`, resolved from the link's directory,
    stays inside the root (CVE-2024-0134) before creating it."""
    __slots__ = ("path", "target")

    def __init__(self, path, target):
        self.path = path
        self.target = target

    def __repr__(self):
        return f"Symlink({self.path!r} -> {self.target!r})"


class File:
    """A generated file (bytes) placed at `path` inside the sandbox, read-only.

    Used for the container's ld.so.cache and the masked /proc/driver/nvidia
    params.  The launcher writes it into a private tmpfs and binds it."""
    __slots__ = ("path", "content", "mode")

    def __init__(self, path, content, mode=0o444):
        self.path = path
        self.content = content
        self.mode = mode

    def __repr__(self):
        return f"File({self.path!r}, {len(self.content)} bytes)"


class Tmpfs:
    """A fresh, small tmpfs at `path` (made read-only after its content is in
    place when `ro`), used to mask a directory such as /proc/driver/nvidia."""
    __slots__ = ("path", "ro")

    def __init__(self, path, ro=True):
        self.path = path
        self.ro = ro

    def __repr__(self):
        return f"Tmpfs({self.path!r})"


class ContainerEdits:
    """An ordered set of edits.  Application order: tmpfs masks, device
    nodes, mounts, symlinks, files; env is merged last over the sandbox env.

    `paths_in_proc` lists the tmpfs/mount targets under /proc: the launcher
    applies those after the fresh /proc is mounted."""
    __slots__ = ("device_nodes", "mounts", "symlinks", "files", "tmpfs", "env")

    def __init__(self):
        self.device_nodes = []
        self.mounts = []
        self.symlinks = []
        self.files = []
        self.tmpfs = []
        self.env = {}

    def extend(self, other):
        self.device_nodes += other.device_nodes
        self.mounts += other.mounts
        self.symlinks += other.symlinks
        self.files += other.files
        self.tmpfs += other.tmpfs
        self.env.update(other.env)
        return self

    def __bool__(self):
        return bool(self.device_nodes or self.mounts or self.symlinks
                    or self.files or self.tmpfs or self.env)
