"""Container edits: what a feature adds to a sandbox, as plain data, and the
plan's mount operations they become.

Shaped like CDI containerEdits (deviceNodes, mounts, env, hooks-free), so that
GPU injection, CDI input and CDI output share one form.  The launcher applies
edits generically; nothing here touches the kernel.

Every container path is absolute and is resolved inside the new root without
following symlinks out of it.  Every host path is opened on the host side
before any namespace exists (never a path that came from the image).

Mounts as data: the plan's one mount type is MountOp, and the translators
here turn each door's mount requests into the plan's one ordered list of
operations (plan.mounts), which one executor applies in a single pass
(stages/mountexec.py: the init, and the OCI hook over a running
container's root), as bubblewrap's setup ops are.  The requests keep the
forms their producers share with others: a GPU or CDI injection is
ContainerEdits, `-v`/`--mount` are RunSpec binds (spec.Bind, spec.Tmpfs),
an OCI config's mounts are read by oci/configmount.py straight into
MountOps.  A host path named here is opened by the executor's open_sources,
on the host side, before the image's tree is attached.

Plain __slots__ classes, not attrs: these objects are built on every GPU
launch and attrs' import (~20 ms) would land on the launch path (see
docs/DESIGN.md, "launch path").
"""
import os


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

# Paths under these are on filesystems the init mounts itself (a fresh procfs,
# sysfs, our tmpfs): mount points there are created whatever the image is,
# and never in the image.
OWN_FS = ("/proc/", "/sys/", "/dev/", "/tmp/", "/run/")

# What each op is:
#   bind     a host path (source), cloned on the host side (recursive), bound
#            at path; checked by (st_dev, st_ino) when ident is set
#   node     a host device node (source, major:minor checked), bound at path
#   fs       a fresh filesystem (fstype, data) mounted at path
#   symlink  a link at path to target (checked to stay in the root)
#   file     content (bytes, mode) placed read-only at path
#   seal     the mount at path made read-only (a tmpfs mask, once filled)
#   sysfs    the init's /sys goes here (an OCI config's own place for it)
#   mknod    a device node made at path (dev_type, major, minor, mode, uid, gid)
#   premade  a node made by the runtime before the clone (fd), bound at path
OPS = ("bind", "node", "fs", "symlink", "file", "seal", "sysfs", "mknod", "premade")


class MountOp:
    """One mount operation; the fields an op does not use stay None/False."""
    __slots__ = ("op", "path", "kind", "create", "source", "ident", "recursive", "ro",
                 "nosuid", "nodev", "noexec", "fstype", "data", "target", "content",
                 "mode", "dev_type", "major", "minor", "uid", "gid", "fd",
                 # (MS_* flag, recursive) set once attached (oci/propagation.py),
                 # or None; a bind cloned again at attach time, so that its
                 # mount id follows the mounts before it (an OCI config's)
                 "propagation", "reclone")

    def __init__(self, op, path, kind="dir", **fields):
        assert op in OPS, op
        self.op = op
        self.path = path
        self.kind = kind          # the target's kind: "dir" or "file"
        self.create = True        # the target may be created in the root
        self.source = self.ident = self.fstype = self.target = self.content = None
        self.mode = self.dev_type = self.major = self.minor = self.uid = self.gid = None
        self.fd = self.propagation = None
        self.reclone = False
        self.recursive = self.ro = self.nosuid = self.nodev = self.noexec = False
        self.data = ()
        for key, val in fields.items():
            setattr(self, key, val)

    def __repr__(self):
        flags = ",".join(f for f in ("ro", "nosuid", "nodev", "noexec", "recursive")
                         if getattr(self, f))
        what = self.source or self.fstype or self.target or ""
        return f"MountOp({self.op} {self.path} {what} {flags})".replace("  ", " ")


def from_edits(edits, keep_image=False):
    """The ops of ContainerEdits, in the order edits.py documents: tmpfs
    masks, device nodes, mounts, symlinks, files, then the masks sealed.
    keep_image (--rw, the host's root, plan.keep_image): nothing is created
    in the image, only on our own filesystems; links elsewhere are left out
    (the plan keeps them on those filesystems)."""
    def create(path):
        return not keep_image or path.startswith(OWN_FS)
    ops = []
    for t in edits.tmpfs:
        ops.append(MountOp("fs", t.path, fstype="tmpfs", data=("mode=0755", "size=1m"),
                           nosuid=True, nodev=True, noexec=True, create=create(t.path)))
    for n in edits.device_nodes:
        ops.append(MountOp("node", n.path, "file", source=n.host_path, major=n.major,
                           minor=n.minor, nosuid=True, create=create(n.path)))
    for mnt in edits.mounts:
        if mnt.kind is None:
            mnt.kind = "dir" if os.path.isdir(mnt.host_path) else "file"
        ops.append(MountOp("bind", mnt.path, mnt.kind, source=mnt.host_path, ident=mnt.ident,
                           ro="rw" not in mnt.options, nosuid="nosuid" in mnt.options,
                           nodev="nodev" in mnt.options, noexec="noexec" in mnt.options,
                           create=create(mnt.path)))
    for ln in edits.symlinks:
        if create(ln.path):
            ops.append(MountOp("symlink", ln.path, "file", target=ln.target,
                               create=create(ln.path.rpartition("/")[0] or "/")))
    for f in edits.files:
        ops.append(MountOp("file", f.path, "file", content=f.content, mode=f.mode, ro=True,
                           nosuid=True, nodev=True, noexec=True, create=create(f.path)))
    for t in edits.tmpfs:
        if t.ro:
            ops.append(MountOp("seal", t.path, create=create(t.path)))
    return ops


def from_binds(binds):
    """`-v`/`--mount` (and the job's PMIx directories), in the order given (a
    later one may sit inside an earlier one), each nosuid and nodev."""
    ops = []
    for b in binds:
        if b.src is None:
            # --mount type=tmpfs: made by the init where the id maps are
            # written, so that its root is owned by the sandbox's ids.
            ops.append(MountOp("fs", b.dst, fstype="tmpfs", data=b.options(), ro=not b.rw,
                               nosuid=True, nodev=True))
        else:
            ops.append(MountOp("bind", b.dst, b.kind, source=b.src, recursive=True,
                               ro=not b.rw, nosuid=True, nodev=True))
    return ops


def devices(nodes, premade=None):
    """An OCI config's linux.devices: nodes made by the runtime before the
    clone (premade: [(path, fd)]) or by mknod in the root ([(path, S_IF
    type, major, minor, mode, uid, gid)]), after its mounts so that a tmpfs
    there does not hide them."""
    if premade:
        return [MountOp("premade", path, "file", fd=fd) for path, fd in premade]
    return [MountOp("mknod", path, "file", dev_type=kind, major=major, minor=minor,
                    mode=mode, uid=uid, gid=gid)
            for path, kind, major, minor, mode, uid, gid in nodes]


def run_tmpfs(ops):
    """The writable tmpfs at /run among ops (an OCI config's, as containerd's
    default spec has), which the init's own /run stands for, else None."""
    for op in ops:
        if op.path == "/run" and op.op == "fs" and op.fstype == "tmpfs" and not op.ro:
            return op
    return None


def op_points(ops):
    """(path, kind) of the mount points the ops need in the image."""
    return [(op.path, op.kind) for op in ops if op.op in ("bind", "fs", "file")]


def op_links(ops):
    return [(op.path, op.target) for op in ops if op.op == "symlink"]
