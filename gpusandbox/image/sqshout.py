"""`gpusandbox pull REF -o FILE.sqsh`: the pulled image's root filesystem as
one squashfs file, for a shared filesystem (run it with `gpusandbox run
FILE.sqsh`).

mksquashfs (squashfs-tools; Debian 12 has 4.5.1, without sqfstar) reads the
store's unpacked tree, which the pull has verified and unpacked without
following any of the image's links; mksquashfs does not follow symlinks
either.  It runs with an argv list (no shell), as the caller, and writes into
a private directory (0700) made next to the target, so no other user can
swap the file it writes for a link; the finished file is renamed over the
target, so a reader of FILE.sqsh sees the old file or the new one, never a
half-written one.

Ownership: as root the store's tree has the image's owners, kept as they are.
Rootless, every file of the tree is the caller's (an unprivileged unpack
cannot chown), which says nothing about the image: the file gets -all-root,
which is what the image meant for nearly all files and what a rootless `run`
of it maps to the caller.  A store other users read holds its trees sealed
(root's or the caller's, no group/other write: unpack.py); the directories
the seal changed get back the image's owner and mode in the file (pseudo
"m" definitions), as a sandbox of the store image shows them.  No xattrs (-no-xattrs): security.capability and
overlay xattrs never travel into the file.

The image config travels in the file: the config blob, as pulled and
verified, is /.gpusandbox/config.json inside it (an mksquashfs pseudo file,
0444 root; an entry of that name in the image is left out), and `run
FILE.sqsh` applies its Env, Entrypoint, Cmd, WorkingDir and User as for a
store image (sqshconfig.py)."""
import os
import shutil
import subprocess

from ..errors import UsageError
from ..spec import names_squashfs
from .digest import ImageError

MKSQUASHFS = "mksquashfs"
POLL = 0.25


def check_target(path):
    """Refuse an -o target before the pull does any work."""
    if not names_squashfs(path):
        raise UsageError(f"pull -o {path}", "the file name must end in .sqsh or .squashfs",
                         "gpusandbox run recognises a squashfs image by that suffix")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(f"pull -o {path}", f"no directory {parent}", None)
    if os.path.isdir(path):
        raise UsageError(f"pull -o {path}", "it is a directory", None)
    if shutil.which(MKSQUASHFS) is None:
        raise UsageError(f"pull -o {path}", "mksquashfs is not installed",
                         "install squashfs-tools (Debian/Ubuntu: apt install squashfs-tools)")


def write(dirfd, rel, path, config=None, sealed=(), progress=None):
    """Write the tree at rel under the directory fd dirfd (the store's
    unpacked image: the store is reached through its held fd) to path, with
    the config blob bytes `config` as /.gpusandbox/config.json, and the
    directories of `sealed` (StoreReader.sealed) as the image had them.
    progress: a pull Progress, told how much of the file is written as it
    goes."""
    rootfs = f"/proc/self/fd/{dirfd}/{rel}"
    target = os.path.abspath(path)
    parent, name = os.path.split(target)
    import tempfile
    tmpdir = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    try:
        out = os.path.join(tmpdir, name)
        argv = [MKSQUASHFS, rootfs, out, "-noappend", "-no-xattrs", "-no-progress",
                "-quiet"]
        if os.geteuid() != 0:
            argv.append("-all-root")
        defs = [f"{_pseudo_name(p)} m {mode:o} {uid or 0} {gid or 0}\n"
                for p, uid, gid, mode in sealed
                if p and "\n" not in p and p.partition("/")[0] != ".gpusandbox"]
        if defs:
            spath = os.path.join(tmpdir, "sealed.pf")
            with open(spath, "x", encoding="utf-8", errors="surrogateescape") as f:
                f.writelines(defs)
            argv += ["-pf", spath]
        if config is not None:
            import shlex
            from .sqshconfig import CONFIG_DIR, CONFIG_PATH
            cpath = os.path.join(tmpdir, "config.json")
            with open(cpath, "xb") as f:
                f.write(config)
            # mksquashfs runs the pseudo file's command with /bin/sh; -e
            # (last, as mksquashfs wants it) leaves out the image's own entry.
            argv += ["-p", f"{CONFIG_DIR} d 755 0 0",
                     "-p", f"{CONFIG_PATH} f 444 0 0 cat {shlex.quote(cpath)}",
                     "-e", CONFIG_DIR.lstrip("/")]
        code, err = _run(argv, dirfd, tmpdir, out, path, progress)
        if code != 0:
            last = (err.decode("utf-8", "replace").strip().splitlines() or ["?"])[-1]
            raise ImageError(f"writing {path} with mksquashfs",
                             f"it exited with {code}: {last[:200]}")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(out, 0o666 & ~umask)
        with open(out, "rb") as f:
            os.fsync(f.fileno())
        os.rename(out, target)
        if progress is not None:
            progress("squashed", {"path": target, "size": os.stat(target).st_size})
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _pseudo_name(path):
    """A path as a pseudo definition names it: every character but
    [A-Za-z0-9._/-] escaped with a backslash (image names are arbitrary)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "._/-") else "\\" + c
                   for c in path)


def _run(argv, dirfd, tmpdir, out, path, progress):
    """Run mksquashfs; (exit status, its stderr).  With progress, the bytes
    written so far are passed on as "squash" events every POLL seconds:
    mksquashfs's own bar is no help here (4.5.1 never flushes it to a pipe
    or a terminal before the end, and it counts blocks of an estimate)."""
    with open(os.path.join(tmpdir, "stderr"), "w+b") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=err, close_fds=True, pass_fds=(dirfd,))
        try:
            if progress is not None:
                progress("squash-start", {"path": os.path.abspath(path)})
            while True:
                try:
                    code = proc.wait(timeout=POLL if progress is not None else None)
                    break
                except subprocess.TimeoutExpired:
                    try:
                        written = os.stat(out).st_size
                    except OSError:
                        written = 0
                    progress("squash", {"written": written})
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        err.seek(0)
        return code, err.read(64 << 10)
