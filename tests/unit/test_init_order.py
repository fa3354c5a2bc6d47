"""The order of the init's setup steps, stated against a recording double
of the kernel (stages/mountexec.Kernel, the interface the init calls after
the clone): the root filesystem, then the system mounts, the plan's mount
ops in their order (an OCI config's /sys where it lists it), the
container's kernel settings, the masks, then the working directory, the
read-only root, the pivot, the root's propagation, and the command stage
(groups, ids, capabilities, no_new_privs, seccomp last before the execve);
no privileges and no kernel that would take them."""
import json
import os

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
        self.log.append(("open", path))
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

    # The root filesystem and the pivot.
    def open_image(self, path):
        self.log.append(("open image", path))
        return self._fd(path)

    def file_id(self, fd):
        st = os.stat(self.fds[fd])
        return st.st_dev, st.st_ino

    def open_dir(self, name, dirfd):
        return self._fd(f"{self.fds[dirfd]}/{name}")

    def mkdir(self, name, mode, dirfd):
        self.log.append(("mkdir", f"{self.fds[dirfd]}/{name}"))

    def prepare_upper(self, lowerfd, upperfd, points, links, sealed=()):
        self.log.append(("prepare upper", self.fds[upperfd]))

    def become_mapped_root(self, uid_rows, gid_rows):
        self.log.append(("mapped root",))

    def move_mount(self, from_fd, to_fd, what):
        self.log.append(("mount", self.fds[to_fd], self.fds[from_fd]))

    def mount(self, source, target, fstype, flags):
        self.log.append(("propagation", target, flags))

    def loopback_up(self):
        self.log.append(("loopback",))

    def fchdir(self, fd):
        self.log.append(("fchdir", self.fds[fd]))

    def chdir(self, path):
        self.log.append(("chdir", path))

    def pivot_root(self, new_root, put_old):
        self.log.append(("pivot_root", new_root, put_old))

    def umount(self, target, flags):
        self.log.append(("umount", target, flags))

    # The command stage: its process is this test's, so nothing of it is
    # changed; the execve ends the run (Exec is no Exception the stage catches).
    def reset_signals(self):
        self.log.append(("reset signals",))

    def setsid(self):
        self.log.append(("setsid",))

    def close_range(self, low, high, flags):
        self.log.append(("close_range", low))

    def drop_bounding(self, keep):
        self.log.append(("bounding", tuple(sorted(keep))))

    def prctl(self, option, arg):
        self.log.append(("prctl", option, arg))

    def setgroups(self, groups):
        self.log.append(("setgroups", tuple(groups)))

    def setresgid(self, gid):
        self.log.append(("setresgid", gid))

    def setresuid(self, uid):
        self.log.append(("setresuid", uid))

    def set_cap_sets(self, effective, permitted, inheritable, ambient):
        self.log.append(("capset", tuple(sorted(effective))))

    def umask(self, mask):
        self.log.append(("umask", mask))

    def install_seccomp(self, prog):
        self.log.append(("seccomp",))

    def execve(self, path, argv, env):
        self.log.append(("execve", path, tuple(argv)))
        raise Exec

    def peer_gone(self, fd):
        self.log.append(("launcher alive?",))
        return False

    def spawn(self, path, argv, env):
        self.log.append(("spawn", path, tuple(argv)))
        return 2


class Exec(BaseException):
    """The double's execve: the command stage never returns from a real one."""


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


# --- the whole init after the clone ----------------------------------------
def _init(plan):
    """The init's steps from the root filesystem to the execve, as the
    double sees them: the mount tree (init.root_steps), then the command
    stage (command.run), each stage's named steps among its calls."""
    from gpusandbox.stages import command
    kern = Recorder()
    src = {"dev:" + n: kern.clone_tree("/dev/" + n) for n in planmod.STD_DEVICES}
    src["sys"], src["sys-hide"] = kern.clone_tree("/sys"), ()
    fds = mountexec.open_sources(plan.mounts, kern)
    held = {}
    try:
        for step in init.root_steps(plan, src, fds, {"pid": 0}, None, None, held, kern):
            kern.log.append(("step", step))
        plan.env.setdefault("HOME", "/")
        try:
            command.run(plan, None, held["wdfd"], None, kern)
        except Exec:
            pass
    finally:
        os.close(plan.rootfd)    # the launcher's handle, closed by the double's "close"
    return kern.log


def _at(log, entry):
    return log.index(entry)


def _first(log, what):
    return next(i for i, e in enumerate(log) if e[0] == what)


def _last(log, what):
    return max(i for i, e in enumerate(log) if e[0] == what)


def test_a_plain_run_from_the_root_filesystem_to_the_execve(tmp_path):
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    (tmp_path / "a").mkdir()
    plan = planmod.build(parse_run_args(["-w", "/work", "-v",
                                         f"{tmp_path}/a:/a", str(root), "/bin/true"]), {})
    assert plan.spec.rootfs_mode == "ro" and plan.seccomp is not None and plan.no_new_privs
    log = _init(plan)
    steps = [e[1] for e in log if e[0] == "step"]
    assert steps[0] == "building the root filesystem"
    loopback = ["bringing up loopback"] if plan.spec.net == "none" else []
    assert steps[steps.index("masking /proc and /sys paths"):] == [
        "masking /proc and /sys paths", "opening the working directory /work",
        "making the root filesystem read-only", *loopback, "pivoting into the root filesystem"]
    # The root filesystem: the image reached through its held inode, an
    # overlay whose upper layer holds the mount points, attached over the
    # image's own directory before any mount of the tree.
    assert log[_first(log, "open image")][1] == plan.root_id[0]
    overlay = _at(log, ("mount", plan.root_id[0], "overlay"))
    assert _at(log, ("prepare upper", "tmpfs/upper")) < overlay
    tree = _at(log, ("mount", "/proc", "proc"))
    assert overlay < tree
    # The tree (system mounts, the plan's ops, the masks), then the working
    # directory opened in it, then the root sealed, then the pivot.
    binds = _at(log, ("mount", "/a", f"bind {tmp_path}/a"))
    masks = _at(log, ("mount", "/proc/kcore", "bind dev/null"))
    assert tree < binds < masks
    seal = _at(log, ("seal", "overlay", k.MOUNT_ATTR_RDONLY))   # the attached root
    wd = _at(log, ("step", "opening the working directory /work"))
    assert _last(log, "mount") < wd and log[wd + 1] == ("open", "/work")
    assert wd + 1 < seal
    pivot = log[_first(log, "fchdir"):_first(log, "fchdir") + 4]
    assert pivot == [("fchdir", "overlay"), ("pivot_root", ".", "."), ("umount", ".", k.MNT_DETACH),
                     ("chdir", "/")]
    assert seal < _first(log, "pivot_root")
    # The command stage, after the pivot: its own session, the working
    # directory entered, the descriptors closed, then the privileges
    # dropped in order (the bounding set while CAP_SETPCAP is held, groups,
    # gid, uid, the sets, no_new_privs) and seccomp last before the execve.
    cmd = [e[0] if e[0] != "prctl" else ("prctl", e[1]) for e in log[_first(log, "umount"):]]
    assert cmd == ["umount", "chdir", "reset signals", "setsid", "fchdir", "close_range",
                   "bounding", ("prctl", 8), "setgroups", "setresgid", "setresuid", "capset",
                   ("prctl", k.PR_SET_NO_NEW_PRIVS), "seccomp", "execve"]
    assert [e for e in log if e[0] == "fchdir"][1] == ("fchdir", "/work")
    assert log[-1] == ("execve", "/bin/true", ("/bin/true",))


def test_a_plain_run_is_spawned_by_init_after_it_takes_the_commands_privileges(tmp_path):
    """The way of a plain launch (command.spawnable): init enters the working
    directory, marks its descriptors close-on-exec, drops the privileges in
    run()'s order, sets the parent-death signal and non-dumpable again (a
    credential change clears both), checks the launcher is alive, then
    seccomp last and the spawn; a terminal takes the forked child instead."""
    from gpusandbox.stages import command
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    plan = planmod.build(parse_run_args(["-w", "/work", str(root), "/bin/true"]), {})
    plan.env.setdefault("HOME", "/")
    assert command.spawnable(plan, None) and not command.spawnable(plan, 7)
    # A profile of the caller's may deny init's calls: the forked child installs it.
    from gpusandbox.linux import seccomp
    for opt, spawned in ((seccomp.profile_path("default"), False), ("unconfined", True),
                         ("profiling", True)):
        other = planmod.build(parse_run_args(["--seccomp", opt, str(root), "/bin/true"]), {})
        os.close(other.rootfd)
        assert command.spawnable(other, None) is spawned, opt
    kern = Recorder()
    go_r, go_w = os.pipe()
    kern.fds[go_r] = "go pipe"
    wd = kern._fd("/work")
    try:
        assert command.spawn(plan, None, wd, go_r, kern) == 2
    finally:
        os.close(go_r)
        os.close(go_w)
        os.close(plan.rootfd)
    cmd = [e[0] if e[0] != "prctl" else ("prctl", e[1]) for e in kern.log]
    assert cmd == ["fchdir", "close_range",
                   "bounding", ("prctl", 8), "setgroups", "setresgid", "setresuid", "capset",
                   ("prctl", k.PR_SET_NO_NEW_PRIVS), ("prctl", k.PR_SET_PDEATHSIG),
                   ("prctl", 4), "launcher alive?", "seccomp", "spawn"]
    assert kern.log[0] == ("fchdir", "/work")
    assert kern.log[-1] == ("spawn", "/bin/true", ("/bin/true",))


def test_an_oci_config_with_privileges_left_seccomp_first_propagation_after_pivot(tmp_path):
    """noNewPrivileges false: the filter before the capabilities go (without
    no_new_privs only CAP_SYS_ADMIN may install one); rootfsPropagation on
    the new root, after the pivot; a written-through root (no overlay)."""
    (tmp_path / "rootfs" / "bin").mkdir(parents=True)
    conf = {"ociVersion": "1.0.2",
            "process": {"args": ["/bin/true"], "cwd": "/", "noNewPrivileges": False,
                        "user": {"uid": 0, "gid": 0, "additionalGids": [5]}},
            "root": {"path": "rootfs"},
            "linux": {"namespaces": [{"type": t} for t in ("pid", "mount", "user")],
                      "uidMappings": [{"containerID": 0, "hostID": 0, "size": 1}],
                      "gidMappings": [{"containerID": 0, "hostID": 0, "size": 1}],
                      "rootfsPropagation": "shared",
                      "seccomp": {"defaultAction": "SCMP_ACT_ALLOW",
                                  "syscalls": [{"names": ["chroot"],
                                                "action": "SCMP_ACT_ERRNO"}]}}}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    spec = oc.load(str(tmp_path), {})
    plan = planmod.build(spec, spec.oci.plan_env)
    assert not plan.no_new_privs and plan.seccomp is not None
    log = _init(plan)
    pivot = _first(log, "pivot_root")
    assert log[pivot + 1:pivot + 5] == [
        ("umount", ".", k.MNT_DETACH), ("chdir", "/"), ("step", "setting the root's propagation"),
        ("propagation", "/", k.MS_SHARED)]
    # A config's root, written through: the image's own tree cloned (no
    # overlay), attached over its directory before the first system mount.
    image = plan.root_id[0]
    assert plan.spec.rootfs_mode == "rw"
    assert _at(log, ("mount", image, f"bind {image}")) < _at(log, ("mount", "/proc", "proc"))
    cmd = [e[0] for e in log[pivot:]]
    assert cmd.index("seccomp") < cmd.index("bounding") < cmd.index("setresuid")
    assert cmd.count("seccomp") == 1 and ("prctl", k.PR_SET_NO_NEW_PRIVS, 1) not in log
    assert ("setgroups", (5,)) in log
