"""A small root filesystem made from the host's own binaries (no network).

/bin/true, /bin/sh and /bin/sleep with the shared libraries ldd names, the
same /usr-merge layout as the host, and a minimal /etc.  The peers' copy also
carries empty mount targets for the GPU bind mounts, so that bwrap and the OCI
runtimes mount onto existing files instead of writing into the image."""
import os
import shutil
import subprocess

BINARIES = ("true", "sh", "sleep")
TOP_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _ldd(path):
    """Absolute paths of the libraries and the loader a binary needs."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts:
            i = parts.index("=>")
            if i + 1 < len(parts) and parts[i + 1].startswith("/"):
                libs.append(parts[i + 1])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])
    return libs


def _copy_in(root, host_path, dest=None):
    dest = dest or host_path
    target = os.path.join(root, dest.lstrip("/"))
    _mkdirs_in(root, os.path.dirname(target))
    shutil.copyfile(os.path.realpath(host_path), target)
    os.chmod(target, 0o755)


def build(root, user=None):
    """Write the rootfs into `root` (created); `user` is (name, uid, gid) of
    the benchmark user, listed in /etc/passwd and /etc/group."""
    os.makedirs(root, mode=0o755)
    for d in ("usr/bin", "usr/sbin", "usr/lib", "etc", "proc", "dev", "sys",
              "tmp", "run", "root", "home", "var/tmp"):
        os.makedirs(os.path.join(root, d), mode=0o755, exist_ok=True)
    os.chmod(os.path.join(root, "tmp"), 0o1777)
    os.chmod(os.path.join(root, "var/tmp"), 0o1777)
    # Mirror the host's /usr merge so the paths ldd prints resolve the same way.
    for top in TOP_DIRS:
        host = "/" + top
        if os.path.islink(host):
            link = os.readlink(host)
            os.symlink(link, os.path.join(root, top))
            # An absolute link (/lib64 -> /usr/lib64) is read in the sandbox,
            # where it resolves inside; the host paths below never follow it.
            os.makedirs(os.path.join(root, link.lstrip("/")), mode=0o755, exist_ok=True)
        elif os.path.isdir(host):
            os.makedirs(os.path.join(root, top), mode=0o755, exist_ok=True)
    needed = set()
    for name in BINARIES:
        path = shutil.which(name, path="/usr/bin:/bin")
        if path is None:
            raise RuntimeError(f"host has no {name} to put in the benchmark rootfs")
        _copy_in(root, path, "/usr/bin/" + name)
        needed.update(_ldd(path))
    for lib in sorted(needed):
        _copy_in(root, lib)
    users = ["root:x:0:0:root:/root:/bin/sh",
             "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin"]
    groups = ["root:x:0:", "nogroup:x:65534:"]
    if user:
        name, uid, gid = user
        users.append(f"{name}:x:{uid}:{gid}:{name}:/tmp:/bin/sh")
        groups.append(f"{name}:x:{gid}:")
    _write(root, "etc/passwd", "\n".join(users) + "\n")
    _write(root, "etc/group", "\n".join(groups) + "\n")
    _write(root, "etc/hostname", "bench\n")
    _write(root, "etc/hosts", "127.0.0.1 localhost\n")
    _write(root, "etc/resolv.conf", "")
    # As in Debian images; podman creates it when missing, which fails
    # rootless on a root-owned image.
    os.symlink("../proc/self/mounts", os.path.join(root, "etc/mtab"))
    if os.path.exists("/etc/debian_version"):
        # Tells GPU injection this is a Debian-style image (multiarch lib dir).
        shutil.copyfile("/etc/debian_version", os.path.join(root, "etc/debian_version"))
    return root


def _write(root, rel, text):
    with open(os.path.join(root, rel), "w") as f:
        f.write(text)


def add_mount_targets(root, binds):
    """Create an empty file or directory at each bind target inside `root`
    (never following a symlink out of it: targets come from our own bind
    list, and the parents are created as plain directories)."""
    for src, dst, _kind in binds:
        if dst == "/dev" or dst.startswith("/dev/") or dst.startswith("/proc/"):
            continue          # /dev and /proc are fresh mounts made by each peer
        target = os.path.join(root, dst.lstrip("/"))
        parent = os.path.dirname(target)
        _mkdirs_in(root, parent)
        if os.path.lexists(target):
            continue
        if os.path.isdir(src):
            os.mkdir(target, 0o755)
        else:
            with open(target, "w"):
                pass


def _mkdirs_in(root, path):
    rel = os.path.relpath(path, root)
    cur = root
    for part in rel.split(os.sep):
        if part in ("", "."):
            continue
        nxt = os.path.join(cur, part)
        if os.path.islink(nxt):
            # Follow only links that stay inside (the /usr-merge links).
            real = os.path.realpath(nxt)
            if not (real + os.sep).startswith(os.path.realpath(root) + os.sep):
                raise RuntimeError(f"{nxt} leads outside the rootfs")
        elif not os.path.isdir(nxt):
            os.mkdir(nxt, 0o755)
        cur = nxt
