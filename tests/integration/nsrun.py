"""The CLI started in a private mount namespace of the test's child, to show
the launcher a host layout this machine does not have, or private /tmp
directories the test can inspect.

`unshare --mount --propagation private` gives the child its own copy of the
mount table, with every mount private (nothing it mounts or unmounts there
reaches the host's table); a shell then runs the setup lines and execs the
given argv, so the child's pid is the launcher's (kill -9 reaches it, its
leaf is named after it).  Only root can do this; a rootless launch keeps its
`setpriv` inside the argv, after the setup."""
import os
import shutil
import uuid

from .conftest import BASE

UNIFIED = "/sys/fs/cgroup/unified"
TOP = "/sys/fs/cgroup"


def private_mounts(argv, script):
    """argv run after `script` (sh lines, -e) in a private mount namespace."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-ec",
            script + '\nexec "$@"', "sh", *argv]


def scratch_dir(tag):
    """An empty directory outside /tmp and /var/tmp (under GSBX_TEST_BASE),
    for a mount point in a private namespace; remove with rmdir."""
    d = BASE / "mnt" / f"{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    d.mkdir(parents=True)
    os.chmod(BASE / "mnt", 0o755)
    os.chmod(d, 0o755)
    return d


def cgroup2_mount(mountinfo="/proc/self/mountinfo"):
    """Where this process sees the cgroup2 hierarchy, or None."""
    try:
        with open(mountinfo) as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"]:
                    return left.split()[4]
    except OSError:
        pass
    return None


class Layout:
    """A cgroup layout the launcher is shown: 'hybrid' (v1 controllers, cgroup2
    at /sys/fs/cgroup/unified) or 'pure-v2' (cgroup2 at /sys/fs/cgroup, no v1
    mount).  `mount` is where the launcher sees cgroup2, `host_mount` where
    the test process does; wrap(argv) starts a launch in that layout."""

    def __init__(self, name, mount, host_mount, setup=None):
        self.name, self.mount, self.host_mount, self._setup = name, mount, host_mount, setup

    def wrap(self, argv):
        return private_mounts(argv, self._setup) if self._setup else list(argv)

    def host(self, path):
        """A cgroup path as the launcher printed it, as the test reaches it."""
        assert path == self.mount or path.startswith(self.mount + "/"), path
        return self.host_mount + path[len(self.mount):]

    def launcher(self, path):
        """A host cgroup path as the launcher names it."""
        assert path == self.host_mount or path.startswith(self.host_mount + "/"), path
        return self.mount + path[len(self.host_mount):]

    def __str__(self):
        return self.name


def pure_v2_setup(stage):
    """sh lines that turn a hybrid layout into a pure v2 one in a private
    mount namespace: the cgroup2 hierarchy is bound at `stage`, the namespace's
    copy of /sys/fs/cgroup (the tmpfs and every v1 hierarchy on it) is
    detached, and the bind is moved to /sys/fs/cgroup.  A fresh cgroup2 mount
    is avoided on purpose: mounting cgroup2 again applies its mount options
    to the one hierarchy, the host's included."""
    return "\n".join([
        "mount --make-rprivate /",
        f"mount --bind {UNIFIED} {stage}",
        f"umount --lazy {TOP}",
        f"mount --move {stage} {TOP}",
        # Refuse to run in any other layout than the one promised.
        f"[ \"$(awk '$5 == \"{TOP}\" && / - cgroup2 /' /proc/self/mountinfo | wc -l)\" = 1 ]",
        "! grep -q ' - cgroup ' /proc/self/mountinfo",
    ])


def layout(name):
    """(Layout, None) where this machine can show the launcher `name`, else
    (None, why not)."""
    at = cgroup2_mount()
    if at is None:
        return None, "no cgroup2 hierarchy is mounted on this machine"
    if name == "hybrid":
        if at == UNIFIED:
            return Layout("hybrid", UNIFIED, UNIFIED), None
        return None, (f"this machine mounts cgroup2 at {at}, not the hybrid {UNIFIED}; "
                      "a hybrid layout cannot be made from a pure v2 host")
    if at == TOP:
        return Layout("pure-v2", TOP, TOP), None
    if at != UNIFIED:
        return None, f"cgroup2 is mounted at {at}, neither {TOP} nor {UNIFIED}"
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return None, "showing a pure v2 layout needs root and unshare(1) for a private mount namespace"
    # The stage is only ever a mount point inside private namespaces; it
    # stays, empty, for every test that needs it.
    stage = BASE / "mnt" / "cgroup2-stage"
    stage.mkdir(parents=True, exist_ok=True)
    os.chmod(BASE / "mnt", 0o755)
    return Layout("pure-v2", TOP, UNIFIED, setup=pure_v2_setup(stage)), None
