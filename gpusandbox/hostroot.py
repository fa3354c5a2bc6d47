"""IMAGE `/`: the host's own userland as the sandbox's root (docs/workstation.md).

The plan's part.  The init (stages/hostroot.py) clones the host's whole mount
tree read-only instead of building an overlay: overlayfs cannot carry the
host's submounts (a lower layer is one filesystem), and in a user namespace
the kernel refuses a lower layer whose submounts are locked to it
(clone_private_mount, CVE-2021-3732), so `/` has no overlay to write into.
What the sandbox may write is then only its own filesystems: the fresh
/tmp, /run, /dev/shm, the empty tmpfs hiding the homes, and -v binds.
Unix sockets still answer connect() on a read-only mount, so the ones the
fresh /tmp, /run and the hidden homes leave visible are covered one by one.
"""
import os
import stat

from .errors import UsageError

# Filesystems every sandbox gets fresh (plan.OWN_FS): nothing of the host's
# shows there, and mount points there are created, never refused.
_FRESH = ("/proc/", "/sys/", "/dev/", "/tmp/", "/run/")
_HINT_WRITE = ("the host's root is read-only in the sandbox: /tmp, /run and the home "
               "directory are private and writable; bind a directory the command must "
               "write with -v DIR:DIR (docs/workstation.md)")


def check(plan, spec):
    """Refuse the root filesystem modes that cannot hold for the host's root."""
    if spec.rootfs_mode == "rw":
        raise UsageError("--rw with the host's root (/)", "it would write through to the "
                         "host's own files", "drop --rw; " + _HINT_WRITE)
    if spec.rootfs_mode == "tmpfs-overlay":
        raise UsageError("--writable-tmpfs with the host's root (/)", "an overlay cannot "
                         "carry the host's submounts, and a user namespace may not make one "
                         "over them", "drop --writable-tmpfs; " + _HINT_WRITE)
    plan.host_root = True


def _under(path, tops):
    return any(path == t or path.startswith(t + "/") for t in tops)


def _fresh(path):
    return (path + "/").startswith(_FRESH)


def hidden_homes(home, caller_home):
    """[(path, the command's own HOME)] to cover with an empty tmpfs, parents
    first: /home (every user's), /root, the caller's home and the command's
    HOME (from the host's passwd), wherever they are.  A "home" that is `/`
    or a top-level system directory (a daemon's /var, nobody's /nonexistent)
    is not one to hide; one that the host lacks is made only inside another
    hidden one (the sandbox's HOME then exists, empty)."""
    own = {}
    for path in (p for p in ("/home", "/root", caller_home, home) if p and p.startswith("/")):
        # The init resolves these inside the host's root, which is this
        # one: a symlinked /home (/var/home) is hidden where it leads.
        real = os.path.realpath(path)
        own[real] = own.get(real, False) or path == home
    out = []
    for path in sorted(own, key=lambda p: p.count("/")):
        if path.count("/") < 2 and path not in ("/home", "/root"):
            continue
        if _fresh(path):
            continue
        if not _under(path, [h for h, _ in out]) and not os.path.isdir(path):
            continue
        out.append((path, own[path]))
    return out


def _reachable(path, hidden):
    """Whether a container path can serve as a mount point or working
    directory: it exists on the host (whose root the sandbox sees), or it
    lies on one of the sandbox's own filesystems, where it is created."""
    real = os.path.realpath(path)
    if real == "/" or _fresh(real) or _under(real, hidden):
        return True
    return os.path.exists(real)


def check_paths(plan, hidden):
    for b in plan.binds:
        if not _reachable(b.dst, hidden):
            raise UsageError(f"-v {b.src}:{b.dst}", f"{b.dst} does not exist on the host",
                             "the host's root is read-only in the sandbox: bind to a path "
                             "that exists there, or one under /tmp, /run or a home "
                             "directory (private in the sandbox)")
    if not _reachable(plan.workdir, hidden):
        raise UsageError(f"working directory {plan.workdir}", "it does not exist on the host",
                         "give -w an existing directory, or bind one with -v DIR:DIR")


def host_sockets(hidden, host_env, table="/proc/net/unix"):
    """Unix sockets bound on the host's filesystems that the sandbox would
    still see: every path socket of this network namespace (the kernel's
    table) and the caller's SSH_AUTH_SOCK, minus those under the fresh /tmp,
    /run, /dev and the hidden homes.  A socket on a read-only mount still
    accepts connect() (only regular files, directories and links are
    refused writes there), so each one left is covered by the init."""
    paths = set()
    try:
        with open(table, "rb") as f:
            lines = f.read(16 << 20).splitlines()[1:]
    except OSError:
        lines = []
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) == 8 and fields[7].startswith(b"/"):
            paths.add(fields[7].decode("utf-8", "surrogateescape"))
    agent = host_env.get("SSH_AUTH_SOCK") or ""
    if agent.startswith("/"):
        paths.add(agent)
    out = set()
    for path in paths:
        real = os.path.realpath(path)
        if _fresh(real) or _under(real, hidden):
            continue
        try:
            if stat.S_ISSOCK(os.stat(real).st_mode):
                out.add(real)
        except OSError:
            continue    # gone, or out of the caller's reach anyway
    return sorted(out)


def finish(plan, spec, home, host_env):
    """The homes to hide, the host sockets to cover and
    the checks of -v destinations and -w, once the plan knows the
    command's uid, HOME and paths."""
    import pwd
    try:
        caller_home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        caller_home = None
    homes = hidden_homes(home, caller_home)
    mode_of = {True: 0o700, False: 0o755}
    plan.hide = [(p, (plan.cmd_uid, plan.cmd_gid) if own else None, mode_of[own or p == "/root"])
                 for p, own in homes]
    hidden = [p for p, _ in homes]
    check_paths(plan, hidden)
    plan.masks = host_sockets(hidden, host_env)
    plan.notes.append("root: the host's own, read-only (nosuid, nodev); private /tmp, /run, "
                      "/dev/shm; hidden under an empty tmpfs: " + (", ".join(hidden) or "nothing")
                      + (f"; {len(plan.masks)} host socket(s) covered" if plan.masks else ""))
