"""The order of the init's setup steps, stated against a recording double
of the kernel (stages/mountexec.Kernel, the interface every tree-building step
calls): the system mounts, then the plan's mount ops in their order (an
OCI config's /sys where it lists it), then the container's kernel
settings, then the masks; no privileges and no kernel that would take them."""
import json

from gpusandbox import plan as planmod
from gpusandbox.cli import parse_run_args
from gpusandbox.linux import sys as k
from gpusandbox.oci import config as oc
from gpusandbox.stages import init, mountexec
from gpusandbox.stages.mountexec import Kernel

ROOT = 3


class Recorder(Kernel):
    """Every call recorded as (what, where, detail); detached mounts and
    targets are numbers standing for what they are."""

    def __init__(self):
        self.log = []
        self.fds = {ROOT: "/"}
        self.next = 100

    def _fd(self, name):
        self.next += 1
        self.fds[self.next] = name
        return self.next

    def new_fs(self, fstype, options, attrs):
        return self._fd(fstype)

    def clone_tree(self, source, recursive=True, dirfd=None):
        if not source and self.fds.get(dirfd, "").startswith("bind "):
            self.log.append(("reclone", self.fds[dirfd]))
            return self._fd(self.fds[dirfd])      # a detached mount cloned again
        return self._fd("bind " + (source or self.fds.get(dirfd, "?")))

    def clone_source(self, host_path, ident):
        return self._fd("bind " + host_path)

    def open_host_node(self, host_path, major, minor):
        return self._fd(host_path)

    def open_target(self, rootfd, path, kind="dir", create=True, strict=False):
        return self._fd(path)

    def restrict(self, fd, ro=True, nosuid=True, nodev=True, noexec=False, recursive=True):
        if ro:
            self.fds[fd] += " ro"

    def attach(self, fd, target, what):
        self.log.append(("mount", self.fds[target], self.fds[fd]))

    def mount_setattr(self, fd, attrs, recursive):
        self.log.append(("seal", self.fds[fd], attrs))

    def set_propagation(self, fd, flag, recursive):
        self.log.append(("propagation", self.fds[fd], flag, recursive))

    def dup(self, fd):
        return self._fd(self.fds[fd])

    def symlink(self, target, name, dirfd):
        self.log.append(("symlink", f"{self.fds[dirfd]}/{name}", target))

    def readlink(self, name, dirfd):
        raise FileNotFoundError(name)

    def create_file(self, name, mode, content, dirfd):
        pass

    def write_in_root(self, rootfd, path, data):
        self.log.append(("write", "/" + path, data))

    def setdomainname(self, name):
        self.log.append(("domainname", name))

    def unshare(self, flags):
        self.log.append(("unshare", flags))

    def close(self, fd):
        pass


def _steps(plan):
    kern = Recorder()
    src = {"dev:" + n: kern.clone_tree("/dev/" + n) for n in planmod.STD_DEVICES}
    src["sys"], src["sys-hide"] = kern.clone_tree("/sys"), ()
    fds = mountexec.open_sources(plan.mounts, kern)
    for step in init.tree_steps(plan, ROOT, src, fds, {"pid": 0}, None, None, kern):
        kern.log.append(("step", step))
    return kern.log


def _mounts(log):
    return [(e[1], e[2]) for e in log if e[0] == "mount"]


SYSTEM = [("/proc", "proc"), ("/sys", "bind /sys ro"), ("/dev", "tmpfs"),
          *[("/dev/" + n, "bind /dev/" + n) for n in planmod.STD_DEVICES],
          ("/dev/pts", "devpts"), ("/dev/shm", "tmpfs"), ("/tmp", "tmpfs"), ("/run", "tmpfs")]


def test_run_system_mounts_then_binds_then_masks(tmp_path):
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (tmp_path / "a").mkdir()
    plan = planmod.build(parse_run_args(["-v", f"{tmp_path}/a:/a:ro", "--mount",
                                         "type=tmpfs,dst=/a/t", str(root), "true"]), {})
    log = _steps(plan)
    mounts = _mounts(log)
    n = len(SYSTEM)
    assert mounts[:n] == SYSTEM
    assert mounts[n:n + 2] == [("/a", f"bind {tmp_path}/a ro"), ("/a/t", "tmpfs")]
    # Then runc's masks: /dev/null over the files, empty tmpfs over the
    # directories, read-only clones of the rest.
    assert mounts[n + 2] == ("/proc/kcore", "bind dev/null")
    assert mounts[-1] == ("/proc/sysrq-trigger", "bind /proc/sysrq-trigger ro")
    steps = [e[1] for e in log if e[0] == "step"]
    assert steps == ["mounting /proc, /sys, /dev, /tmp, /run",
                     "mounting the GPU edits, -v/--mount and the config's mounts",
                     "masking /proc and /sys paths"]
    # A plain run has no kernel settings, hooks or OCI life: the init never
    # loads stages/ocisetup.py for it (the launch's import count, issue 24).
    assert not plan.container_settings()
    # The /dev links come with /dev, before anything of the plan's.
    links = [i for i, e in enumerate(log) if e[0] == "symlink"]
    assert [log[i][1] for i in links][:2] == ["/dev/ptmx", "/dev/fd"]
    assert max(links) < log.index(("step", steps[1]))


def test_an_oci_config_in_its_order_sys_among_its_mounts_then_its_settings(tmp_path):
    (tmp_path / "rootfs" / "bin").mkdir(parents=True)
    (tmp_path / "src").mkdir()
    conf = {"ociVersion": "1.0.2", "process": {"args": ["sh"], "cwd": "/"},
            "root": {"path": "rootfs"}, "domainname": "example",
            "mounts": [{"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
                       {"destination": "/sys", "type": "sysfs", "source": "sysfs"},
                       {"destination": "/src", "type": "bind", "source": "src",
                        "options": ["rbind", "ro", "rslave"]}],
            "linux": {"namespaces": [{"type": t} for t in ("pid", "mount", "user", "uts",
                                                            "ipc")],
                      "uidMappings": [{"containerID": 0, "hostID": 0, "size": 1}],
                      "gidMappings": [{"containerID": 0, "hostID": 0, "size": 1}],
                      "sysctl": {"kernel.msgmax": "4096"},
                      "maskedPaths": ["/proc/kcore"], "readonlyPaths": []}}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    spec = oc.load(str(tmp_path), {})
    plan = planmod.build(spec, spec.oci.plan_env)
    log = _steps(plan)
    mounts = _mounts(log)
    system = [m for m in SYSTEM if m[0] != "/sys"]
    assert mounts[:len(system)] == system
    # The config's order, /sys (cloned again, so that the mount table lists
    # it there) between its mqueue and its bind.
    assert mounts[len(system):] == [
        ("/dev/mqueue", "mqueue"), ("/sys", "bind /sys ro"),
        ("/src", f"bind {tmp_path}/src ro"),
        # A config's masked path is tried as a file, then as a directory
        # (the double has every path of both kinds).
        ("/proc/kcore", "bind dev/null"), ("/proc/kcore", "tmpfs")]
    # The bind cloned again just before it is attached (its mount id then
    # follows the mounts before it), its propagation set once attached.
    src = f"bind {tmp_path}/src"
    at = log.index(("mount", "/src", src + " ro"))
    assert log[at - 1] == ("reclone", src) or ("reclone", src) in log[:at]
    assert log[at + 1] == ("propagation", src + " ro", k.MS_SLAVE, True)
    settings = [e for e in log if e[0] in ("domainname", "write")]
    assert settings == [("domainname", b"example"),
                        ("write", "/proc/sys/kernel/msgmax", b"4096")]
    assert log.index(settings[-1]) < log.index(("mount", "/proc/kcore", "bind dev/null"))
