"""IMAGE_DIR -> one held directory fd, and container paths in normal form.

The image is untrusted and its owner may rename things in it at any time:
it is opened once, here, and reached only through that fd afterwards (the
launcher's reads, and the init, which finds it again by inode)."""
import os
import stat

from .errors import UsageError
from .linux import sys as k


def container_path(path):
    """A container path in lexical normal form: absolute, no `.`/`..`/empty
    components, `..` above / staying at / (as runc cleans destinations).
    The init then never meets `..` on a path it creates (see mounts.py)."""
    out = []
    for comp in path.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if out:
                out.pop()
            continue
        out.append(comp)
    return "/" + "/".join(out)


_DIR_PATH = k.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_image_dir(image):
    """O_PATH fd of IMAGE_DIR, opened once.  The parent is resolved as the
    caller names it; the last component is opened without following a
    symlink, and a symlink there is followed only when it belongs to the
    caller or to root: whoever else owns the parent could exchange IMAGE_DIR
    with a symlink to a host directory at the moment it is opened."""
    path = image.rstrip("/") or "/"
    parent, name = os.path.split(path)
    try:
        if not name:
            return os.open("/", _DIR_PATH)
        pfd = os.open(parent or ".", k.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fd = os.open(name, k.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
            try:
                st = os.fstat(fd)
                if stat.S_ISLNK(st.st_mode):
                    if st.st_uid not in (0, os.geteuid()):
                        raise UsageError(f"image directory {image} is a symlink owned by "
                                         f"uid {st.st_uid}",
                                         "only your own or root's symlinks are followed there",
                                         "pass the directory it points to (realpath)")
                    # The link's own inode is read, not the name again.
                    target = os.readlink("", dir_fd=fd)
                    return os.open(target, k.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC,
                                   dir_fd=pfd)
                if not stat.S_ISDIR(st.st_mode):
                    raise UsageError(f"image is not a directory: {image}", None,
                                     "IMAGE_DIR must be an unpacked root filesystem "
                                     "directory, not a file")
                return os.dup(fd)
            finally:
                os.close(fd)
        finally:
            os.close(pfd)
    except FileNotFoundError:
        raise UsageError(f"image directory not found: {image}", None,
                         "pass a directory holding a root filesystem "
                         "(e.g. from 'docker export' or debootstrap)") from None
    except NotADirectoryError:
        raise UsageError(f"image is not a directory: {image}", None,
                         "IMAGE_DIR must be an unpacked root filesystem directory, "
                         "not a file") from None
    except OSError as e:
        raise UsageError(f"cannot access image directory {image}", e.strerror, None) from None


def _bundle(imgfd, image):
    """(rootfs fd, config.json bytes) when IMAGE_DIR is an OCI bundle, else None.

    Everything is looked up relative to IMAGE_DIR's fd without following a
    symlink: rootfs/ must be a real directory (a symlink would name a host
    directory as the root) and config.json a regular file (a symlink is
    refused: following it would tell the image's owner whether a host path
    exists)."""
    try:
        rfd = os.open("rootfs", _DIR_PATH, dir_fd=imgfd)
    except OSError:
        return None
    try:
        try:
            st = os.stat("config.json", dir_fd=imgfd, follow_symlinks=False)
        except OSError:
            os.close(rfd)
            return None
        if stat.S_ISLNK(st.st_mode):
            raise UsageError(f"invalid OCI bundle {image}", "its config.json is a symlink",
                             "make config.json a regular file in the bundle")
        if not stat.S_ISREG(st.st_mode):
            os.close(rfd)
            return None
        config = k.read_in_root(imgfd, "config.json", 4 << 20,
                                resolve=k.RESOLVE_BENEATH | k.RESOLVE_NO_SYMLINKS
                                | k.RESOLVE_NO_MAGICLINKS)
        if config is None:
            raise UsageError(f"invalid OCI bundle {image}",
                             "its config.json changed while it was read", None)
        return rfd, config
    except BaseException:
        os.close(rfd)
        raise


def image_root(image, held=None):
    """IMAGE_DIR is a rootfs, or an OCI bundle (config.json + rootfs/).

    Returns (display path, O_PATH fd of the root, config bytes or None).  The
    fd is the only way the launcher and the init reach the image afterwards:
    a directory swapped for a symlink after this point changes nothing.
    `held`: the root already opened by fd (a store image, opened relative to
    its store's fd by image/storeread.py): taken as it is, `image` only shown."""
    config = None
    if held is not None:
        imgfd, display = held, image
    else:
        imgfd = _open_image_dir(image)
        display = os.path.abspath(image)
        try:
            found = _bundle(imgfd, image)
        except BaseException:
            os.close(imgfd)
            raise
        if found is not None:
            os.close(imgfd)
            imgfd, config = found
            display = os.path.join(display, "rootfs")
    ok = False
    for d in ("bin", "usr/bin", "sbin"):
        try:
            os.close(k.openat2(imgfd, d, k.O_PATH | os.O_DIRECTORY))
            ok = True
            break
        except OSError:
            pass
    if not ok:
        os.close(imgfd)
        raise UsageError(f"{display} does not look like a root filesystem",
                         "it has no /bin, /usr/bin or /sbin",
                         "point IMAGE_DIR at the top of an unpacked image")
    return display, imgfd, config


def is_host_root(rootfd):
    """Whether the image directory the launcher holds is this host's `/`
    (`/`, `//`, `/.`, or a symlink to it: the same inode)."""
    st, top = os.fstat(rootfd), os.stat("/")
    return (st.st_dev, st.st_ino) == (top.st_dev, top.st_ino)


def root_identity(rootfd, display):
    """What the init needs to find the held root again in its own mount
    namespace (mount calls refuse a mount of another namespace): the path
    the kernel gives for the fd, and the inode it must lead to."""
    st = os.fstat(rootfd)
    try:
        path = os.readlink(f"/proc/self/fd/{rootfd}")
    except OSError:
        path = ""
    if not path.startswith("/") or path.endswith(" (deleted)"):
        raise UsageError(f"image directory {display}", "it has no reachable path "
                         "(removed, or outside this process's root)", None)
    return path, st.st_dev, st.st_ino
