"""The kernel's filesystems in the sandbox: /proc, /sys (alone, or with what
is mounted on it covered), /dev, /dev/pts, /dev/shm, /tmp, /run, its own
cgroup at /sys/fs/cgroup, and the /proc and /sys paths runc masks or freezes.
Run by init (stages/init.py) in the sandbox's mount namespace, before the
pivot."""
import os

from ..linux import mounts as m
from ..linux import sys as k
from ..plan import STD_DEVICES
from . import ocisetup


def sysfs_alone():
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
        return m.clone_tree("/sys", recursive=False), ()
    except OSError as e:
        if e.errno != 22:
            raise
    with open("/proc/self/mountinfo", "rb") as f:
        points = sorted({_unescape(line.split()[4]) for line in f
                         if line.split()[4].startswith(b"/sys/")})
    top = [p for p in points if not any(p.startswith(q + "/") for q in points)]
    return m.clone_tree("/sys", recursive=True), top


def _unescape(field):
    # mountinfo escapes space, tab, newline and the backslash itself as \ooo
    # (proc(5)), so every backslash starts an escape.
    first, *rest = field.split(b"\\")
    out = first + b"".join(bytes([int(p[:3], 8)]) + p[3:] for p in rest)
    return out.decode("utf-8", "surrogateescape")


def system_mounts(plan, rootfd, src):
    tgt = m.open_target
    # Each fresh filesystem names its type as its source (mountinfo), as runc's do.
    m.attach(m.new_fs("proc", ("source=proc",), k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC),
             tgt(rootfd, "/proc", strict=True), "mounting /proc")
    if plan.oci is None or plan.oci.sys_at is None:
        sysfs(plan, rootfd, src)
    m.attach(m.new_fs("tmpfs", ("source=tmpfs", "mode=0755", "size=4m"),
                      k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NOEXEC),
             tgt(rootfd, "/dev", strict=True), "mounting /dev")
    for name in STD_DEVICES:
        fd = src.pop("dev:" + name)
        # The host's nodes, bound: nothing on them is a program to run.
        m.restrict(fd, ro=False, nosuid=True, noexec=True, nodev=False, recursive=False)
        m.attach(fd, tgt(rootfd, "/dev/" + name, "file", strict=True), f"binding /dev/{name}")
    pts = ["source=devpts", "newinstance", "ptmxmode=0666", "mode=0620"]
    if plan.devpts_gid is not None:
        pts.append(f"gid={plan.devpts_gid}")
    m.attach(m.new_fs("devpts", pts, k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NOEXEC),
             tgt(rootfd, "/dev/pts", strict=True), "mounting /dev/pts")
    devfd = tgt(rootfd, "/dev", strict=True)
    try:
        for name, target in (("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"),
                             ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                             ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore")):
            os.symlink(target, name, dir_fd=devfd)
    finally:
        os.close(devfd)
    tmp_attrs = k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV
    for path, mode in (("/dev/shm", "1777"), ("/tmp", "1777"), ("/run", "0755")):
        data, attrs = (f"mode={mode}",), tmp_attrs
        if path == "/run" and plan.oci is not None:
            data, attrs = ocisetup.run_tmpfs(plan, data, attrs)
        fs = src.pop("shm") if path == "/dev/shm" and "shm" in src else \
            m.new_fs("tmpfs", data, attrs)
        m.attach(fs, tgt(rootfd, path, strict=True), f"mounting {path}")


def sysfs(plan, rootfd, src, fresh=False):
    """/sys read-only, what is mounted on the host's covered, the cgroup view.
    An OCI config may place it after mounts of its own (ocisetup.mounts):
    fresh then clones it again, since the mount table lists mounts in the
    order they were made (the kernel's unique mount id), not attached."""
    tgt = m.open_target
    if fresh:
        os.close(src["sys"])
        # Still the host's /sys: the image is attached over its own directory.
        src["sys"], src["sys-hide"] = sysfs_alone()
    sysfd = src.pop("sys")
    m.restrict(sysfd, ro=True, noexec=True)
    m.attach(sysfd, tgt(rootfd, "/sys", strict=True), "binding /sys read-only")
    for path in src.pop("sys-hide"):
        try:
            target = tgt(rootfd, path, create=False, strict=True)
        except OSError:
            continue       # not a directory we can reach (a file mount, say)
        empty = m.new_fs("tmpfs", ("size=4k", "mode=0555"), k.MOUNT_ATTR_RDONLY
                         | k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC)
        m.attach(empty, target, f"covering {path}")
    if plan.own_cgroup:
        _cgroup_view(rootfd, plan.clone_flags & k.CLONE_NEWCGROUP)


def _cgroup_view(rootfd, own_ns=True):
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
        k.syscall("unshare", k.CLONE_NEWCGROUP)
    try:
        fd = m.new_fs("cgroup2", (), k.MOUNT_ATTR_RDONLY | k.MOUNT_ATTR_NOSUID
                      | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC)
    except OSError:
        return
    m.attach(fd, m.open_target(rootfd, "/sys/fs/cgroup", create=False, strict=True),
             "mounting the sandbox's cgroup at /sys/fs/cgroup")


def mask(rootfd, plan):
    """Hide or freeze the kernel interfaces the plan names (runc's defaults,
    or an OCI config's lists)."""
    files, dirs, ro = plan.masked_files, plan.masked_dirs, plan.readonly_paths
    for path in files:
        try:
            target = m.open_target(rootfd, path, "file", create=False, strict=True)
        except OSError:
            continue
        null = m.clone_tree("dev/null", recursive=False, dirfd=rootfd)
        m.attach(null, target, f"masking {path}")
    for path in dirs:
        try:
            target = m.open_target(rootfd, path, "dir", create=False, strict=True)
        except OSError:
            continue
        empty = m.new_fs("tmpfs", ("size=0", "mode=0555"), k.MOUNT_ATTR_RDONLY
                         | k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC)
        m.attach(empty, target, f"masking {path}")
    for path in ro:
        try:
            target = m.open_target(rootfd, path, "dir" if path != "/proc/sysrq-trigger"
                                   else "file", create=False, strict=True)
        except OSError:
            try:
                target = m.open_target(rootfd, path, "file", create=False, strict=True)
            except OSError:
                continue
        clone = m.clone_tree("", recursive=True, dirfd=target)
        m.restrict(clone, ro=True, noexec=True)
        m.attach(clone, target, f"making {path} read-only")
