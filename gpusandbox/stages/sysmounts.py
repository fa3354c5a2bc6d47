"""The kernel's filesystems in the sandbox: /proc, /sys (alone, or with what
is mounted on it covered), /dev, /dev/pts, /dev/shm, /tmp, /run, its own
cgroup at /sys/fs/cgroup, and the /proc and /sys paths runc masks or freezes.
Run by init (stages/init.py) in the sandbox's mount namespace, before the
pivot."""
import os

from ..linux import sys as k
from ..plan import STD_DEVICES
from .mountexec import KERNEL


def sysfs_alone(kern=KERNEL):
    """sysfs without what is mounted on it (debugfs, tracefs, securityfs,
    bpffs, configfs, the host's cgroup hierarchies): (mount fd, paths to
    cover).  Devices, buses and classes (/sys/bus/pci, /sys/class,
    /sys/devices), which GPU libraries read, are sysfs itself.

    In a user namespace the host's mounts are locked to the ones below them,
    and a non-recursive clone that would uncover them is refused (EINVAL,
    fs/namespace.c has_locked_children); a fresh sysfs needs a network
    namespace of our own.  There the whole tree is cloned and each mount on
    it is covered by an empty read-only tmpfs: nothing in the sandbox holds
    CAP_SYS_ADMIN to lift one."""
    try:
        return kern.clone_tree("/sys", recursive=False), ()
    except OSError as e:
        if e.errno != 22:
            raise
    # Raw reads (k.read_fd): no io layers (fstat, TCGETS, lseek) for one file.
    fd = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = k.read_fd(fd)
    finally:
        os.close(fd)
    points = sorted({_unescape(f) for f in (line.split()[4] for line in data.splitlines())
                     if f.startswith(b"/sys/")})
    top = [p for p in points if not any(p.startswith(q + "/") for q in points)]
    return kern.clone_tree("/sys", recursive=True), top


def _unescape(field):
    # mountinfo escapes space, tab, newline and the backslash itself as \ooo
    # (proc(5)), so every backslash starts an escape.
    first, *rest = field.split(b"\\")
    out = first + b"".join(bytes([int(p[:3], 8)]) + p[3:] for p in rest)
    return out.decode("utf-8", "surrogateescape")


def system_mounts(plan, rootfd, src, kern=KERNEL):
    tgt = kern.open_target
    # Each fresh filesystem names its type as its source (mountinfo), as runc's do.
    kern.attach(kern.new_fs("proc", ("source=proc",), k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC),
             tgt(rootfd, "/proc", strict=True), "mounting /proc")
    if not any(op.op == "sysfs" for op in plan.mounts):
        sysfs(plan, rootfd, src, kern=kern)      # else where the ops place it (mountexec)
    kern.attach(kern.new_fs("tmpfs", ("source=tmpfs", "mode=0755", "size=4m"),
                      k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NOEXEC),
             tgt(rootfd, "/dev", strict=True), "mounting /dev")
    for name in STD_DEVICES:
        fd = src.pop("dev:" + name)
        # The host's nodes, bound: nothing on them is a program to run.
        kern.restrict(fd, ro=False, nosuid=True, noexec=True, nodev=False, recursive=False)
        kern.attach(fd, tgt(rootfd, "/dev/" + name, "file", strict=True), f"binding /dev/{name}")
    pts = ["source=devpts", "newinstance", "ptmxmode=0666", "mode=0620"]
    if plan.devpts_gid is not None:
        pts.append(f"gid={plan.devpts_gid}")
    kern.attach(kern.new_fs("devpts", pts, k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NOEXEC),
             tgt(rootfd, "/dev/pts", strict=True), "mounting /dev/pts")
    devfd = tgt(rootfd, "/dev", strict=True)
    try:
        for name, target in (("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"),
                             ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                             ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore")):
            kern.symlink(target, name, devfd)
    finally:
        kern.close(devfd)
    tmp_attrs = k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV
    for path, mode in (("/dev/shm", "1777"), ("/tmp", "1777"), ("/run", "0755")):
        data, attrs = (f"mode={mode}",), tmp_attrs
        if path == "/run" and plan.run_tmpfs is not None:
            # An OCI config's tmpfs at /run (containerd's default spec has
            # one) is our own /run with its options (size, mode; noexec
            # added): mounted over ours later, it would hide what GPU
            # injection put under /run (the persistenced socket).
            own = plan.run_tmpfs
            data = own.data
            attrs |= ((k.MOUNT_ATTR_RDONLY if own.ro else 0)
                      | (k.MOUNT_ATTR_NOSUID if own.nosuid else 0)
                      | (k.MOUNT_ATTR_NODEV if own.nodev else 0)
                      | (k.MOUNT_ATTR_NOEXEC if own.noexec else 0))
        fs = src.pop("shm") if path == "/dev/shm" and "shm" in src else \
            kern.new_fs("tmpfs", data, attrs)
        kern.attach(fs, tgt(rootfd, path, strict=True), f"mounting {path}")


def sysfs(plan, rootfd, src, fresh=False, kern=KERNEL):
    """/sys read-only, what is mounted on the host's covered, the cgroup view.
    An OCI config may place it after mounts of its own (a "sysfs" mount op):
    fresh then clones it again, since the mount table lists mounts in the
    order they were made (the kernel's unique mount id), not attached."""
    tgt = kern.open_target
    if fresh:
        kern.close(src["sys"])
        # Still the host's /sys: the image is attached over its own directory.
        src["sys"], src["sys-hide"] = sysfs_alone(kern)
    sysfd = src.pop("sys")
    kern.restrict(sysfd, ro=True, noexec=True)
    kern.attach(sysfd, tgt(rootfd, "/sys", strict=True), "binding /sys read-only")
    for path in src.pop("sys-hide"):
        try:
            target = tgt(rootfd, path, create=False, strict=True)
        except OSError:
            continue       # not a directory we can reach (a file mount, say)
        empty = kern.new_fs("tmpfs", ("size=4k", "mode=0555"), k.MOUNT_ATTR_RDONLY
                         | k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC)
        kern.attach(empty, target, f"covering {path}")
    if plan.own_cgroup:
        _cgroup_view(rootfd, plan.own_cgroup, plan.clone_flags & k.CLONE_NEWCGROUP, kern)


def _cgroup_view(rootfd, view=True, own_ns=True, kern=KERNEL):
    """/sys/fs/cgroup: a fresh cgroup2 mount, read-only.  It is made inside the
    sandbox's cgroup namespace, whose root is the sandbox's own leaf, so it
    shows that leaf and nothing above it (cgroup_namespaces(7)); hybrid hosts
    get the same single cgroup2 view, none of their v1 hierarchies.  Only
    with a leaf of its own: without one (rootless outside a delegated
    subtree, the v1 fallback) the namespace's root is the launcher's cgroup,
    which may be the host's root cgroup, so /sys/fs/cgroup stays sysfs's
    empty directory, as it does when the kernel refuses the mount."""
    # The namespace root is the cgroup this process was in at clone time; a
    # new namespace here pins it to the leaf whatever clone3 did first.  A
    # cgroup namespace joined by path (an OCI config's) is kept: the view is
    # its root's, as runc's.
    if own_ns:
        kern.unshare(k.CLONE_NEWCGROUP)
    if view is not True:
        return _cgroup_v1_view(rootfd, view, kern)
    try:
        fd = kern.new_fs("cgroup2", (), k.MOUNT_ATTR_RDONLY | k.MOUNT_ATTR_NOSUID
                      | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC)
    except OSError:
        return
    kern.attach(fd, kern.open_target(rootfd, "/sys/fs/cgroup", create=False, strict=True),
             "mounting the sandbox's cgroup at /sys/fs/cgroup")


def _cgroup_v1_view(rootfd, view, kern=KERNEL):
    """The v1 layout (linux/cgroupv1.py's leaves): a tmpfs at /sys/fs/cgroup
    with a fresh read-only mount of each hierarchy the sandbox has a leaf
    in (the namespace root is that leaf), and of cgroup2 at unified beside
    them on a hybrid host; the tmpfs is made read-only last.  A hierarchy the
    kernel refuses to mount here (a user namespace) is left out."""
    ro = k.MOUNT_ATTR_RDONLY | k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC
    top = kern.new_fs("tmpfs", ("size=4k", "mode=0755"), ro & ~k.MOUNT_ATTR_RDONLY)
    kern.attach(top, kern.open_target(rootfd, "/sys/fs/cgroup", create=False, strict=True),
                "mounting a tmpfs at /sys/fs/cgroup")
    for name, ctls in view:
        try:
            fd = (kern.new_fs("cgroup2", (), ro) if ctls is None
                  else kern.new_fs("cgroup", ctls, ro))
        except OSError:
            continue
        kern.attach(fd, kern.open_target(rootfd, f"/sys/fs/cgroup/{name}", strict=True),
                    f"mounting the sandbox's cgroup at /sys/fs/cgroup/{name}")
    fd = kern.open_target(rootfd, "/sys/fs/cgroup", create=False, strict=True)
    try:
        kern.restrict(fd, ro=True, noexec=True, recursive=False)
    finally:
        kern.close(fd)


def mask(rootfd, plan, kern=KERNEL):
    """Hide or freeze the kernel interfaces the plan names (runc's defaults,
    or an OCI config's lists)."""
    files, dirs, ro = plan.masked_files, plan.masked_dirs, plan.readonly_paths
    for path in files:
        try:
            target = kern.open_target(rootfd, path, "file", create=False, strict=True)
        except OSError:
            continue
        null = kern.clone_tree("dev/null", recursive=False, dirfd=rootfd)
        kern.attach(null, target, f"masking {path}")
    for path in dirs:
        try:
            target = kern.open_target(rootfd, path, "dir", create=False, strict=True)
        except OSError:
            continue
        empty = kern.new_fs("tmpfs", ("size=0", "mode=0555"), k.MOUNT_ATTR_RDONLY
                         | k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC)
        kern.attach(empty, target, f"masking {path}")
    for path in ro:
        try:
            target = kern.open_target(rootfd, path, "dir" if path != "/proc/sysrq-trigger"
                                   else "file", create=False, strict=True)
        except OSError as e:
            if e.errno == 2:
                continue        # missing as any kind
            try:
                target = kern.open_target(rootfd, path, "file", create=False, strict=True)
            except OSError:
                continue
        clone = kern.clone_tree("", recursive=True, dirfd=target)
        kern.restrict(clone, ro=True, noexec=True)
        kern.attach(clone, target, f"making {path} read-only")
