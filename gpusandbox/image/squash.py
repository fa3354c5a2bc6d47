"""IMAGE as one squashfs file (FILE.sqsh, FILE.squashfs): the enroot/pyxis and
Apptainer habit of keeping images on a shared filesystem as single files.

The file is opened once, here, by the launcher (the last component without
following a symlink; a regular file; squashfs magic), and reached only
through that fd.  It is mounted before the plan reads anything, as a
*detached* mount (fsmount, never attached in the host's mount namespace)
that only descriptors hold, so the plan reads the image's /etc/environment,
/etc/passwd, ld.so.cache and CUDA files through a directory fd exactly as it
does for an IMAGE_DIR, and the init uses that mount as the overlay's lower
layer (lowerdir=/proc/self/fd/N).  The mount is read-only, nosuid and nodev.

Kernel squashfs needs a block device: the file's fd backs a loop device
configured read-only and with LO_FLAGS_AUTOCLEAR.  The loop fd is held until
the mount exists (autoclear frees the device at its last close when nothing
mounts it), and then dropped: from that point the device lives exactly as
long as the mount, which lives as long as a descriptor (the launcher's, the
init's) or the sandbox's mount namespace holds it.  A launcher killed with
SIGKILL therefore leaves no mount and no loop device: the kernel closes its
fds, the init dies with it (PR_SET_PDEATHSIG) and takes its namespace along.

Only a launch without a user namespace (real root) can mount squashfs: the
kernel does not let a user namespace mount it.  Other launches (rootless,
root with --userns/--root) mount it through squashfuse (image/squashfuse.py)."""
import ctypes
import errno
import os
import stat

from ..errors import UsageError
from ..linux import sys as k
from ..spec import names_squashfs

MAGIC = b"hsqs"

_LOOP_CTL_GET_FREE = 0x4C82
_LOOP_CONFIGURE = 0x4C0A
_LO_FLAGS_READ_ONLY = 1
_LO_FLAGS_AUTOCLEAR = 4


class _LoopInfo64(ctypes.Structure):
    _fields_ = [("lo_device", ctypes.c_uint64), ("lo_inode", ctypes.c_uint64),
                ("lo_rdevice", ctypes.c_uint64), ("lo_offset", ctypes.c_uint64),
                ("lo_sizelimit", ctypes.c_uint64), ("lo_number", ctypes.c_uint32),
                ("lo_encrypt_type", ctypes.c_uint32), ("lo_encrypt_key_size", ctypes.c_uint32),
                ("lo_flags", ctypes.c_uint32), ("lo_file_name", ctypes.c_uint8 * 64),
                ("lo_crypt_name", ctypes.c_uint8 * 64), ("lo_encrypt_key", ctypes.c_uint8 * 32),
                ("lo_init", ctypes.c_uint64 * 2)]


class _LoopConfig(ctypes.Structure):
    _fields_ = [("fd", ctypes.c_uint32), ("block_size", ctypes.c_uint32),
                ("info", _LoopInfo64), ("reserved", ctypes.c_uint64 * 8)]


def is_squashfs_arg(image):
    """Whether IMAGE names a squashfs file: by its suffix, and not a directory
    (a rootfs directory that happens to be called x.sqsh stays one)."""
    return names_squashfs(image) and not os.path.isdir(image)


def open_file(image):
    """The squashfs file, opened O_RDONLY once: parent resolved as given, the
    last component never followed (a symlink there is refused: whoever owns
    the directory could point it at a host file at the moment it is opened),
    a regular file, squashfs magic at offset 0."""
    try:
        # O_NONBLOCK: a FIFO so named is refused below instead of blocking here.
        fd = os.open(image, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY
                     | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UsageError(f"squashfs image not found: {image}", None,
                         "pass an existing FILE.sqsh (or a rootfs directory)") from None
    except OSError as e:
        why = "it is a symlink (pass the file it points to)" if e.errno == errno.ELOOP \
            else e.strerror
        raise UsageError(f"cannot open squashfs image {image}", why, None) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"squashfs image {image}", "not a regular file", None)
        if os.pread(fd, 4, 0) != MAGIC:
            raise UsageError(f"squashfs image {image}", "not a squashfs file (no 'hsqs' magic)",
                             "build one with mksquashfs, or pass a rootfs directory")
        return fd
    except BaseException:
        os.close(fd)
        raise


def _ioctl(fd, req, arg):
    res = k.libc.ioctl(ctypes.c_int(fd), ctypes.c_ulong(req), arg)
    if res < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return res


def _loop_attach(filefd):
    """(loop device fd, number) of a free loop device now backed, read-only
    and autoclear, by filefd.  Another process may take the free device
    between the two ioctls: LOOP_CONFIGURE then says EBUSY and we ask again."""
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(64):
            n = _ioctl(ctl, _LOOP_CTL_GET_FREE, ctypes.c_ulong(0))
            lfd = os.open(f"/dev/loop{n}", os.O_RDONLY | os.O_CLOEXEC)
            conf = _LoopConfig()
            conf.fd = filefd
            conf.info.lo_flags = _LO_FLAGS_READ_ONLY | _LO_FLAGS_AUTOCLEAR
            try:
                _ioctl(lfd, _LOOP_CONFIGURE, ctypes.byref(conf))
                return lfd, n
            except OSError as e:
                os.close(lfd)
                if e.errno != errno.EBUSY:
                    raise
        raise OSError(errno.EBUSY, "every free loop device was taken by someone else")
    finally:
        os.close(ctl)


def mount_image(image, plan):
    """(display path, O_PATH-like fd of the detached read-only squashfs mount).

    The mount is never attached in the host's namespace: it exists only while
    a descriptor or the sandbox's namespace holds it."""
    if plan.spec.rootfs_mode == "rw":
        raise UsageError(f"--rw with the squashfs image {image}",
                         "a squashfs image is read-only",
                         "drop --rw: writes go to the sandbox's private overlay")
    filefd = open_file(image)
    try:
        if plan.userns != "host":
            # The kernel does not mount squashfs in a user namespace.
            from . import squashfuse
            pid, mnt = squashfuse.mount(image, filefd)
            plan.squash, plan.squash_pid = "fuse", pid
            return os.path.abspath(image), mnt
        plan.squash = "kernel"
        from ..hpc import nodeimage
        if nodeimage.enabled():
            # Ranks of a node running the same file share one mount (hpc/nodeimage.py).
            return os.path.abspath(image), nodeimage.acquire(
                filefd, lambda: _kernel_mount(image, filefd))
        return os.path.abspath(image), _kernel_mount(image, filefd)
    finally:
        os.close(filefd)


def _kernel_mount(image, filefd):
    """fd of a new detached read-only squashfs mount of filefd through a loop device."""
    try:
        lfd, n = _loop_attach(filefd)
    except OSError as e:
        raise UsageError(f"cannot attach {image} to a loop device", e.strerror,
                         "check that /dev/loop-control exists (modprobe loop)") from None
    try:
        fsfd = k.fsopen("squashfs")
        try:
            # The loop fd's own path: the device we configured, never a name
            # another process could have re-pointed.
            k.fsconfig(fsfd, "source", f"/proc/self/fd/{lfd}")
            # A read-only superblock: the device is opened for reading only.
            k.fsconfig(fsfd, "ro")
            return k.fsmount(fsfd, k.MOUNT_ATTR_RDONLY | k.MOUNT_ATTR_NOSUID
                             | k.MOUNT_ATTR_NODEV)
        finally:
            os.close(fsfd)
    except OSError as e:
        raise UsageError(f"cannot mount the squashfs image {image}",
                         e.strerror if e.errno != errno.EINVAL else
                         "the kernel refused it as squashfs (corrupt or unsupported "
                         "compression)", None) from None
    finally:
        # Autoclear: with the mount made, the device now lives as long as it.
        os.close(lfd)
