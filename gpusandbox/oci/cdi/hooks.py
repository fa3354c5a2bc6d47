"""NVIDIA's CDI hook commands, done natively as container edits.

Specs from `nvidia-ctk cdi generate` carry createContainer hooks that run
`nvidia-cdi-hook <command> ...` (or `nvidia-ctk hook <command> ...`) on the
host, in the container's mount namespace.  gpusandbox runs no host binary
there: each recognised command becomes plain edits (symlinks, a generated
ld.so.cache, a masked params file) that the sandbox's own setup stages
apply, so a read-only image works and the container's environment never
reaches host code (CVE-2025-23266).  The image is read only through
read_in_root (openat2 RESOLVE_IN_ROOT).

  create-symlinks --link TARGET::LINK        -> Symlink edits
  update-ldcache --folder DIR                -> /etc/ld.so.cache listing the
                                                libraries the edits put in DIR
  enable-cuda-compat --host-driver-version=V -> the image's
                                                /usr/local/cuda/compat first in
                                                that cache, when newer (toolkit rule)
  disable-device-node-modification           -> /proc/driver/nvidia/params with
                                                ModifyDeviceFiles: 0
  chmod --mode M --path P                    -> nothing: the nodes are the host's,
                                                bound in; access is the device filter's
Anything else warns and is skipped, as the toolkit's own hook does with an
unknown subcommand.
"""
import os
import re

from gpusandbox.edits import File, Mount, Symlink, Tmpfs

TOOLS = ("nvidia-cdi-hook", "nvidia-ctk")
KNOWN = ("create-symlinks", "update-ldcache", "enable-cuda-compat",
         "disable-device-node-modification", "chmod")
COMPAT_DIR = "/usr/local/cuda/compat"
_COMPAT_LIB = re.compile(r"libcuda\.so\.(\d+)\.\d+(?:\.\d+)?\Z")
RO_PROC = ("ro", "nosuid", "nodev", "noexec")


class Work:
    """What the hooks of one launch ask for, gathered before anything is
    built (the ld.so.cache needs every mount and link first)."""
    __slots__ = ("links", "folders", "compat_host_version", "params", "warnings")

    def __init__(self):
        self.links = []
        self.folders = []
        self.compat_host_version = None
        self.params = False
        self.warnings = []


def _command(hook):
    """(subcommand, its args) for an NVIDIA hook, or None for any other."""
    tool = os.path.basename(hook["path"])
    args = list(hook.get("args", ()))
    if tool not in TOOLS:
        return None
    rest = args[1:] if args and os.path.basename(args[0]) == tool else args
    if tool == "nvidia-ctk":
        if not rest or rest[0] != "hook":
            return None
        rest = rest[1:]
    # Global flags (--debug, --quiet) may come before the subcommand.
    while rest and rest[0].startswith("-"):
        rest = rest[1:]
    if not rest:
        return None
    return rest[0], rest[1:]


def _flags(args):
    """[(flag, value)] of `--flag VALUE` / `--flag=VALUE` / `--bool` args."""
    out, i = [], 0
    while i < len(args):
        a = args[i]
        if not a.startswith("-"):
            out.append((None, a))
            i += 1
            continue
        name, eq, val = a.lstrip("-").partition("=")
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
            val, i = args[i + 1], i + 1
        out.append((name, val if (eq or val) else None))
        i += 1
    return out


def collect(hooks, work):
    """Sort a spec's hooks into `work`; unknown ones become warnings."""
    for hook in hooks:
        cmd = _command(hook)
        label = " ".join([hook["path"]] + list(hook.get("args", ()))[1:3])
        if cmd is None or cmd[0] not in KNOWN:
            work.warnings.append(f"warning: CDI hook {label!r} ({hook['hookName']}) is not one "
                                 "gpusandbox does natively: skipped")
            continue
        name, args = cmd
        for flag, val in _flags(args):
            if name == "create-symlinks" and flag == "link" and val and "::" in val:
                target, _, link = val.partition("::")
                if _bad_path(link, work, name) or "\0" in target or not target:
                    continue
                work.links.append((link, target))
            elif name == "update-ldcache" and flag == "folder" and val:
                if not _bad_path(val, work, name):
                    work.folders.append(val)
            elif name == "enable-cuda-compat" and flag == "host-driver-version" and val:
                work.compat_host_version = val
            elif name == "disable-device-node-modification":
                work.params = True
            elif name == "chmod" or flag in ("ldconfig-path", "debug", "quiet",
                                             "container-spec", "driver-root"):
                continue
            else:
                work.warnings.append(f"warning: CDI hook {name}: argument "
                                     f"{'--' + flag if flag else val!r} ignored")
        if name == "disable-device-node-modification":
            work.params = True


def _bad_path(path, work, name):
    """A container path a hook names: absolute, no `..` (the link's target
    may be relative; the launcher keeps it inside the root, CVE-2024-0134)."""
    from gpusandbox.oci.cdi.spec import check_path
    try:
        check_path(path, name)
    except ValueError as e:
        work.warnings.append(f"warning: CDI hook {e}: skipped")
        return True
    return False


def _image_compat(rootfd, host_version):
    """The image's compat directory when the toolkit would use it: exactly
    one libcuda.so.X.Y there and X above the host driver's major."""
    from gpusandbox.linux import sys as k
    rfd, owned = k.tree_fd(rootfd)
    try:
        fd = k.openat2(rfd, COMPAT_DIR.lstrip("/"), os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    finally:
        if owned:
            os.close(rfd)
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    found = [m for m in (_COMPAT_LIB.match(n) for n in names) if m]
    try:
        host_major = int(host_version.split(".")[0])
    except ValueError:
        return None
    if len(found) != 1 or int(found[0].group(1)) <= host_major:
        return None
    return [n for n in names if n.startswith("lib") and ".so" in n]


def finish(work, edits, rootfd):
    """Turn the gathered work into edits (after every mount is known)."""
    from gpusandbox.gpu import ldcache
    from gpusandbox.gpu.libs import _elf_flags
    edits.symlinks += [Symlink(link, target) for link, target in work.links]
    if work.folders:
        folders = {os.path.normpath(f) for f in work.folders}
        entries, seen = [], set()
        placed = [(m.path, m.host_path) for m in edits.mounts] + \
            [(s.path, None) for s in edits.symlinks]
        by_path = dict((p, h) for p, h in placed if h)
        for path, host in placed:
            d, name = os.path.split(path)
            if d not in folders or ".so" not in name:
                continue
            real = host or by_path.get(os.path.join(d, _target(edits, path) or ""))
            flags = (_elf_flags(real) if real else None) or ldcache.NATIVE_FLAGS
            soname = ldcache.elf_soname(real) if real else None
            for n in dict.fromkeys([name] + ([soname] if soname else [])):
                if n not in seen:
                    seen.add(n)
                    entries.append(ldcache.Entry(n.encode(), f"{d}/{n}".encode(), flags))
            if soname and soname != name and host and \
                    not any(s.path == f"{d}/{soname}" for s in edits.symlinks):
                # ldconfig makes the SONAME link of what it caches.
                edits.symlinks.append(Symlink(f"{d}/{soname}", name))
        if work.compat_host_version:
            compat = _image_compat(rootfd, work.compat_host_version)
            if compat:
                # The compat libraries shadow the host driver's (NVIDIA's
                # enable-cuda-compat writes a loader config ahead of it).
                names = {n.encode() for n in compat}
                entries = [ldcache.Entry(n.encode(), f"{COMPAT_DIR}/{n}".encode())
                           for n in compat] + [e for e in entries if e.name not in names]
        from gpusandbox.linux.sys import read_in_root
        image = read_in_root(rootfd, "/etc/ld.so.cache", limit=ldcache.MAX_FILE)
        try:
            old = ldcache.parse(image) if image else []
        except (ldcache.CacheError, ValueError):
            old = []
        ours = {(e.name, e.flags) for e in entries}
        merged = [e for e in old if (e.name, e.flags) not in ours]
        edits.files.append(File("/etc/ld.so.cache", ldcache.build(merged + entries), 0o444))
    if work.params:
        _mask_params(edits)


def _target(edits, path):
    return next((s.target for s in edits.symlinks if s.path == path), None)


def _mask_params(edits):
    """The host's params with ModifyDeviceFiles: 0, over a tmpfs on
    /proc/driver that shows the host's other entries read-only (procfs
    refuses new files; the same mask GPU injection uses)."""
    if any(f.path == "/proc/driver/nvidia/params" for f in edits.files):
        return
    try:
        with open("/proc/driver/nvidia/params", "rb") as f:
            lines = f.read(1 << 16).decode("utf-8", "replace").splitlines()
    except OSError:
        lines = []
    lines = ["ModifyDeviceFiles: 0"] + [ln for ln in lines
                                        if not ln.startswith("ModifyDeviceFiles:")]
    edits.tmpfs.append(Tmpfs("/proc/driver"))
    try:
        names = sorted(os.listdir("/proc/driver"))
    except OSError:
        names = []
    for name in names:
        if name == "nvidia":
            try:
                subs = sorted(os.listdir("/proc/driver/nvidia"))
            except OSError:
                subs = []
            for sub in subs:
                if sub != "params":
                    edits.mounts.append(Mount(f"/proc/driver/nvidia/{sub}",
                                              f"/proc/driver/nvidia/{sub}", RO_PROC))
            continue
        edits.mounts.append(Mount(f"/proc/driver/{name}", f"/proc/driver/{name}", RO_PROC))
    edits.files.append(File("/proc/driver/nvidia/params", ("\n".join(lines) + "\n").encode()))
