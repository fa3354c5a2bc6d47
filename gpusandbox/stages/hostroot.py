"""The host's own root as the sandbox's (plan.host_root, gpusandbox/hostroot.py).
Run by init (stages/init.py) in the sandbox's mount namespace."""
import errno
import os

from ..linux import mounts as m
from ..linux import sys as k

_LOCKED = k.MOUNT_ATTR_RDONLY | k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV


def root():
    """A recursive clone of this namespace's `/` (the host's, submounts
    included), every mount in it read-only, nosuid and nodev in one
    mount_setattr(AT_RECURSIVE) before it is attached, so no moment shows a
    writable host mount; bubblewrap's remount of each mountinfo line leaves
    out a mount made between its read and its remount.  Private, so a
    mount the host makes later (a USB stick, an automounted share) does not
    propagate in with the host's flags.  Attached over `/` here; the pivot
    then leaves only the clone.  Returns the attached clone's fd."""
    mnt = m.clone_tree("/", recursive=True)
    try:
        k.mount_setattr(mnt, _LOCKED, recursive=True, propagation=k.MS_PRIVATE)
        top = os.dup(mnt)
    except BaseException:
        os.close(mnt)
        raise
    m.attach(mnt, os.open("/", k.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
             "attaching the host's root read-only")
    return top


def cover(plan, rootfd):
    """The homes under an empty tmpfs each (the command's own HOME owned by
    it, 0700), then each host socket in plan.masks under an empty read-only
    file: connect() there finds no socket.  Before the -v binds, which may
    bring a directory of a hidden home back."""
    for path, owner, mode in plan.hide:
        opts = ["source=tmpfs", f"mode={mode:o}"]
        if owner is not None:
            opts += [f"uid={owner[0]}", f"gid={owner[1]}"]
        fs = m.new_fs("tmpfs", opts, k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV)
        m.attach(fs, m.open_target(rootfd, path, "dir"), f"hiding {path}")
    if not plan.masks:
        return
    stage = m.new_fs("tmpfs", ("size=4k", "mode=0755"), k.MOUNT_ATTR_NOSUID
                     | k.MOUNT_ATTR_NODEV | k.MOUNT_ATTR_NOEXEC)
    try:
        os.close(os.open("empty", os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o444,
                         dir_fd=stage))
        for path in plan.masks:
            try:
                target = m.open_target(rootfd, path, "file", create=False)
            except OSError as e:
                if e.errno == errno.ENOENT:
                    continue        # removed since the plan: nothing to reach
                raise
            clone = m.clone_tree("empty", recursive=False, dirfd=stage)
            m.restrict(clone, ro=True, noexec=True)
            m.attach(clone, target, f"covering the host socket {path}")
    finally:
        os.close(stage)
