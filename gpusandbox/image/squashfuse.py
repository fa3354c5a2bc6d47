"""Rootless squashfs: a FUSE mount served by squashfuse, never attached on the host.

The kernel mounts squashfs only for real root; FUSE is mountable in a user
namespace (FS_USERNS_MOUNT, Linux >= 4.18).  The launcher forks one helper
that
  1. sets PR_SET_PDEATHSIG (it dies with the launcher, kill -9 included),
  2. enters a user namespace of its own (uid 0 there is the caller, no other
     id is mapped, so it holds no privilege on the host) and a private mount
     namespace,
  3. opens /dev/fuse and makes a *detached* fuse mount for it (fsopen/fsmount:
     read-only, nosuid, nodev, default_permissions; it is never attached in
     any namespace the host sees),
  4. hands the mount's fd to the launcher over a socket, and
  5. becomes squashfuse (a host binary, /usr/bin/squashfuse) serving that
     connection: the mountpoint argument /dev/fd/N is libfuse's (>= 3.3) form
     for "already mounted, here is the /dev/fuse fd".
squashfuse thus parses the untrusted file as the caller, inside that user
namespace, with no capability outside it, as enroot and Apptainer do; it is
the one host binary that runs for a launch (rootless .sqsh images only).

The launcher reads the image through the mount fd as through an IMAGE_DIR's
fd, and the init attaches it in the sandbox's mount namespace as the overlay's
lower layer.  Nothing is ever mounted in the host's namespace, so nothing is
left to unmount: when the launcher dies, squashfuse gets SIGKILL, its private
namespace goes with it, and the sandbox (pid 1 dies with the launcher too)
takes its own mounts along."""
import errno
import os
import socket

from ..errors import UsageError
from ..linux import sys as k

SQUASHFUSE = "/usr/bin/squashfuse"


def _child(sock, filefd, uid, gid):
    """The helper, in the forked child; never returns."""
    try:
        k.prctl(k.PR_SET_PDEATHSIG, 9)
        # The launcher may have died before the prctl: then the socket's peer is gone.
        if os.getppid() == 1:
            os._exit(1)
        # Its own session: a Ctrl-C meant for the command must not end the
        # server of the sandbox's root filesystem.
        os.setsid()
        k.unshare(k.CLONE_NEWUSER | k.CLONE_NEWNS)
        from ..linux import idmap
        idmap.write_single("self", 0, uid, 0, gid, False)
        k.mount(None, "/", None, k.MS_REC | k.MS_PRIVATE)
        dev = os.open("/dev/fuse", os.O_RDWR)
        os.set_inheritable(dev, True)  # squashfuse serves it
        fs = k.fsopen("fuse")
        for key, val in (("fd", str(dev)), ("rootmode", "40000"), ("user_id", "0"),
                         ("group_id", "0"), ("default_permissions", None)):
            k.fsconfig(fs, key, val)
        mnt = k.fsmount(fs, k.MOUNT_ATTR_RDONLY | k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV)
        os.close(fs)
        socket.send_fds(sock, [b"m"], [mnt])
        os.close(mnt)
        sock.close()
        os.set_inheritable(filefd, True)
        null = os.open("/dev/null", os.O_RDWR)
        for std in (0, 1, 2):
            os.dup2(null, std)
        # -f: stay in the foreground (this process is the one the launcher
        # reaps); -s: one thread.  Its messages would break the one-line
        # error: a file it refuses is reported by mount() below.
        os.execv(SQUASHFUSE, ["squashfuse", "-f", "-s", f"/proc/self/fd/{filefd}",
                              f"/dev/fd/{dev}"])
    except OSError as e:
        try:
            sock.send(b"e" + str(e.errno or 0).encode() + b" " + (e.strerror or str(e)).encode())
        except OSError:
            pass
    os._exit(1)


def mount(image, filefd):
    """(pid of squashfuse, fd of the detached fuse mount of the image)."""
    if not os.access(SQUASHFUSE, os.X_OK):
        raise UsageError(f"squashfs image {image}", f"{SQUASHFUSE} is not installed",
                         "install squashfuse (Debian/Ubuntu: apt install squashfuse fuse3), "
                         "or unpack the image: unsquashfs -d DIR FILE")
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    uid, gid = os.geteuid(), os.getegid()
    pid = os.fork()
    if pid == 0:
        parent.close()
        _child(child, filefd, uid, gid)
    child.close()
    try:
        msg, fds, _flags, _addr = socket.recv_fds(parent, 512, 1)
    finally:
        parent.close()
    if fds:
        try:
            # The first request waits for squashfuse's answer to FUSE_INIT; a
            # squashfuse that refused the file has closed the connection.
            os.fstatvfs(fds[0])
            return pid, fds[0]
        except OSError as e:
            os.close(fds[0])
            stop(pid)
            raise UsageError(f"cannot mount the squashfs image {image} with squashfuse",
                             f"squashfuse did not serve it ({e.strerror})",
                             "check the file with 'unsquashfs -s FILE'") from None
    os.waitpid(pid, 0)
    why = msg[1:].decode("utf-8", "replace").partition(" ") if msg[:1] == b"e" else \
        ("0", "the helper ended early")
    hint = None
    if why[0] in (str(errno.EACCES), str(errno.EPERM)):
        hint = ("rootless squashfs needs /dev/fuse usable by you (mode 0666, the "
                "distributions' default) and user namespaces; or unpack the image: "
                "unsquashfs -d DIR FILE")
    raise UsageError(f"cannot mount the squashfs image {image} with squashfuse", why[1], hint)


def stop(pid):
    """End squashfuse once the sandbox is gone (it would die with the launcher
    anyway, through PR_SET_PDEATHSIG)."""
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
