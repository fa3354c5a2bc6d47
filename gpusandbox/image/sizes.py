"""Sizes for people, in docker's decimal units, and the bytes an unpacked
image tree holds (what docker calls an image's size)."""
import os
import stat

_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def human(n):
    """`n` bytes as docker shows them: 512 B, 4.1 kB, 72.8 MB, 118 MB, 1.2 GB;
    None (not known) as '-'."""
    if n is None:
        return "-"
    n = float(n)
    for unit in _UNITS:
        # 999.96 kB would print as "1000.0 kB": the next unit's "1.0 MB" instead.
        if n < 999.95 or unit == _UNITS[-1]:
            break
        n /= 1000
    if unit == "B":
        return f"{n:.0f} B"
    return f"{n:.1f} {unit}" if n < 99.95 else f"{n:.0f} {unit}"


def tree_bytes(dirfd, name):
    """The apparent size of the tree `name` under `dirfd` (tree_usage)."""
    return tree_usage(dirfd, name)[0]


def tree_usage(dirfd, name):
    """(apparent, disk, own) of the tree `name` under `dirfd`: every file's
    and symlink's st_size, each inode once (an image's files are hard links
    into its layers, and a layer may hard-link its own files); the disk
    blocks of every inode, directories included, each once; and the disk
    blocks of the directories and of the inodes linked only here (what
    removing the tree alone frees).  Walked through directory fds without
    following symlinks; an entry it cannot read counts as nothing."""
    seen = set()
    apparent = disk = own = 0
    stack = []
    try:
        stack.append(os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                             dir_fd=dirfd))
    except OSError:
        return 0, 0, 0
    while stack:
        fd = stack.pop()
        try:
            blocks = os.fstat(fd).st_blocks * 512
            disk += blocks
            own += blocks
            with os.scandir(fd) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        try:
                            stack.append(os.open(e.name, os.O_RDONLY | os.O_DIRECTORY
                                                 | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd))
                        except OSError:
                            pass
                        continue
                    if st.st_nlink > 1:
                        if (st.st_dev, st.st_ino) in seen:
                            continue
                        seen.add((st.st_dev, st.st_ino))
                    else:
                        own += st.st_blocks * 512
                    apparent += st.st_size
                    disk += st.st_blocks * 512
        except OSError:
            pass
        finally:
            os.close(fd)
    return apparent, disk, own
