"""Stage 2: the sandbox's init (pid 1 of the new pid namespace).

Builds the new root from the plan, pivots into it, starts the command and
then only forwards signals and reaps.  Runs in the child of clone3(); every
failure travels to the launcher as one line over the error pipe and ends
this process with 125.
"""
import os

from ..linux import mounts as m
from ..linux import sys as k
from ..plan import STD_DEVICES
from . import command, mountexec, sysmounts
from .mountexec import KERNEL
from .channel import fail, pause_point

_SIGCHLD = 17
FORWARDED = (1, 2, 3, 10, 12, 15)  # HUP INT QUIT USR1 USR2 TERM


def _open_sources(plan, kern=KERNEL):
    """Clone the system mounts' host sources before the image's tree is
    attached (the plan's mount ops clone theirs: mountexec.open_sources), so
    that no source can ever be a path inside the image, and a later mount
    cannot shadow one (a -v source under /tmp stays reachable)."""
    src = {}
    for name in STD_DEVICES:
        src["dev:" + name] = kern.clone_tree("/dev/" + name, recursive=False)
    src["sys"], src["sys-hide"] = sysmounts.sysfs_alone()
    if plan.pod:
        # The pod's /dev/shm: the keeper's tmpfs, which this mount namespace
        # (a copy of the keeper's) has over the pod directory's shm/.
        src["shm"] = kern.clone_tree(plan.pod.shm_path, recursive=False)
    return src


def _image_fd(plan, kern):
    """The image root the launcher holds (plan.rootfd), as a directory of this
    mount namespace.  Mount calls refuse a mount of another namespace, so the
    held fd cannot be used directly: its kernel path is walked again without
    following any symlink, and the result must be the held inode, else the
    launch fails.  A swap of IMAGE_DIR or rootfs/ after the plan therefore
    gives a refusal, never another directory."""
    path, dev, ino = plan.root_id
    try:
        fd = kern.open_image(path)
    except OSError as e:
        raise m.MountError(e.errno, f"the image directory {plan.rootfs} changed while the "
                           f"sandbox was being set up ({os.strerror(e.errno)})") from None
    if kern.file_id(fd) != (dev, ino):
        kern.close(fd)
        raise m.MountError(116, f"the image directory {plan.rootfs} was replaced while the "
                           "sandbox was being set up")
    if not plan.squash:
        kern.close(plan.rootfd)
    return fd


def _rootfs(plan, kern=KERNEL):
    """The image's tree attached over its own directory in this private mount
    namespace: an overlay on a fresh tmpfs (default, --writable-tmpfs) or the
    directory itself (--rw).  IMAGE_DIR on disk is only ever a lower layer.
    The image is reached through its held fd only (see _image_fd).  Returns
    (the attached mount's own root, the staging tmpfs of the plan's
    generated files or None).

    The overlay's scratch tmpfs and the staging tmpfs are attached over the
    image's directory beneath the root, in this namespace's copy of the
    host's tree: a detached mount's last close unmounts it and waits for an
    RCU grace period (from 60 us to milliseconds on a busy host) on the
    launch's path; attached there, they go with the host's tree, which the
    pivot detaches in one unmount anyway.  Nothing in the sandbox sees them."""
    attrs = k.MOUNT_ATTR_NOSUID | k.MOUNT_ATTR_NODEV
    image = _image_fd(plan, kern)
    lower = image
    stage = None
    if plan.idmap and plan.idmap[0] == "full":
        # Once the image is held (its path walked with the caller's ids,
        # which may be the only ones allowed through a 0700 bundle), and
        # before the first file is created.  A written-through image gets
        # its mount points first, as the caller: the namespace's root may
        # not write in a directory the host's root owns.
        from ..linux import idmap
        if plan.spec.rootfs_mode == "rw" and idmap.caller_unmapped(plan.idmap[1],
                                                                   plan.idmap[2]):
            kern.prepare_upper(image, image, plan.points, plan.links)
        kern.become_mapped_root(plan.idmap[1], plan.idmap[2])
    try:
        if plan.squash:
            # A squashfs image: its detached mount (held fd) is attached over
            # the file's directory in this private namespace, then serves as
            # the lower layer; the root goes on top of it.  Attached first, it
            # is a mount of this namespace, which overlay accepts as a layer
            # whoever made it (the launcher, or squashfuse's helper).
            kern.move_mount(plan.rootfd, image, f"attaching the squashfs image {plan.rootfs}")
            lower = plan.rootfd
        if plan.spec.rootfs_mode == "rw":
            mnt = kern.clone_tree("", recursive=True, dirfd=image)
            kern.restrict(mnt, ro=False)
        else:
            scratch = kern.new_fs("tmpfs", ("mode=0755",), attrs)
            kern.mkdir("upper", 0o755, scratch)
            kern.mkdir("work", 0o755, scratch)
            upper = kern.open_dir("upper", scratch)
            try:
                kern.prepare_upper(lower, upper, plan.points, plan.links, plan.dirs)
            finally:
                kern.close(upper)
            top = f"/proc/self/fd/{scratch}"
            opts = [f"lowerdir=/proc/self/fd/{lower}", f"upperdir={top}/upper",
                    f"workdir={top}/work"]
            if plan.userns != "host":
                # trusted.* xattrs cannot be set in a user namespace (overlayfs docs).
                opts.append("userxattr")
            try:
                # The layers are looked up here, before anything is
                # attached over the image's directory.
                mnt = kern.new_fs("overlay", opts, attrs)
            except BaseException:
                kern.close(scratch)
                raise
            kern.attach(scratch, kern.dup(image), "attaching the overlay's scratch tmpfs")
        if mountexec.needs_stage(plan.mounts):
            fs = kern.new_fs(*mountexec.STAGE_FS)
            stage = kern.dup(fs)
            kern.attach(fs, kern.dup(image), "attaching the staging tmpfs")
        # After move_mount the detached mount's fd is the attached root.
        # The image's fd is the target, closed by attach.
        root = kern.dup(mnt)
        target, image = image, None
        kern.attach(mnt, target, f"attaching the root filesystem over {plan.rootfs}")
    except BaseException:
        if stage is not None:
            kern.close(stage)
        raise
    finally:
        if image is not None:
            kern.close(image)
        if plan.squash:
            kern.close(plan.rootfd)
    return root, stage


def root_steps(plan, src, fds, life, err_w, go_r, out, kern=KERNEL):
    """Everything the init does to the mount tree after the id maps, in
    order, each step named before it runs (as tree_steps): the root
    filesystem, the tree over it (tree_steps), the working directory opened
    in it (out["wdfd"], entered by the command stage), the root made
    read-only, loopback, the pivot, the root's propagation."""
    yield "building the root filesystem"
    stage = None
    if plan.host_root:
        kern.close(plan.rootfd)     # the launcher's handle; this namespace's / is cloned
        from . import hostroot      # only for IMAGE `/`: off a plain launch's path
        rootfd = hostroot.root()
    else:
        rootfd, stage = _rootfs(plan, kern)
    yield from tree_steps(plan, rootfd, src, fds, life, err_w, go_r, kern, stage)
    if stage is not None:
        kern.close(stage)
    # Opened (and made, if missing) before the root turns read-only.
    yield f"opening the working directory {plan.workdir}"
    out["wdfd"] = kern.open_target(rootfd, plan.workdir, "dir", create=True)
    if plan.spec.rootfs_mode == "ro":
        yield "making the root filesystem read-only"
        kern.mount_setattr(rootfd, k.MOUNT_ATTR_RDONLY, recursive=False)
    if plan.spec.net == "none":
        yield "bringing up loopback"
        kern.loopback_up()
    yield "pivoting into the root filesystem"
    _pivot(rootfd, kern)
    kern.close(rootfd)
    if plan.rootfs_propagation is not None:
        yield "setting the root's propagation"
        from . import ocisetup      # loaded already: a plan with container settings
        ocisetup.root_propagation(plan, kern)


def tree_steps(plan, rootfd, src, fds, life, err_w, go_r, kern=KERNEL, stage=None):
    """The sandbox's tree over the attached root, in order, each step named
    (for the error line) before it runs: the system mounts, the host's homes
    and sockets covered (IMAGE `/`), the plan's mount ops (/sys where they
    place it), the container's kernel settings, the hooks point and the
    createContainer hooks, the masks.  The kernel is `kern`
    (mountexec.Kernel); stage: the staging tmpfs _rootfs attached, if any."""
    yield "mounting /proc, /sys, /dev, /tmp, /run"
    sysmounts.system_mounts(plan, rootfd, src, kern)
    if plan.host_root:
        yield "hiding the homes and host sockets"
        from . import hostroot
        hostroot.cover(plan, rootfd)
    pause_point(plan, "init-mounts")
    yield "mounting the GPU edits, -v/--mount and the config's mounts"
    mountexec.apply(plan.mounts, rootfd, fds,
                    lambda: sysmounts.sysfs(plan, rootfd, src, True, kern), kern, stage)
    if plan.container_settings():
        from . import ocisetup      # only for a plan with something for it
        yield "setting the container's kernel settings"
        ocisetup.kernel_settings(plan, rootfd, kern)
        if ocisetup.runtime_hooks(plan):
            yield "waiting for the prestart and createRuntime hooks"
            ocisetup.hooks_point(plan, err_w, go_r)
            os.close(go_r)
        if plan.hook_state:
            yield "running the createContainer hooks"
            ocisetup.container_hooks(plan, "createContainer", life["pid"],
                                     plan.hook_state["bundle"])
    from .. import settingswhere
    if settingswhere.configured():  # else no hook can exist (no site directory)
        from .. import sitehooks    # its list read by the launcher, before the clone
        if sitehooks.hooks():
            yield "running the site hooks"
            sitehooks.rootfs_point(plan, rootfd)
    yield "masking /proc and /sys paths"
    sysmounts.mask(rootfd, plan, kern)


def _pivot(rootfd, kern):
    # pivot_root(".", ".") stacks the old root under the new one; detaching it
    # leaves nothing of the host's tree reachable (pivot_root(2), NOTES).
    kern.fchdir(rootfd)
    kern.pivot_root(".", ".")
    kern.umount(".", k.MNT_DETACH)
    kern.chdir("/")


def _close_except(keep):
    low = 3
    for fd in sorted(keep) + [0x7FFFFFFF]:
        if fd >= low:
            if fd > low:
                k.syscall("close_range", low, fd - 1, 0)
            low = fd + 1


def _open_pty(sock, sized=True):
    """A pty in the sandbox's devpts; the master goes to the launcher.  Its
    window size is the caller's terminal's, which the launcher wrote on the
    socket first (parent.winsize), set before the command exists: a size
    set later reaches the command as a SIGWINCH it may not handle yet (a
    shell before its trap), and it would keep the new pty's 0x0.  Not
    sized: an OCI caller's console socket, whose owner sets the size."""
    import socket
    master = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    k.libc.ioctl(master, 0x40045431, k.byref(k.c_int(0)))  # TIOCSPTLCK: unlock
    size = sock.recv(8) if sized else b""
    if len(size) == 8:
        k.libc.ioctl(master, 0x5414, size)                  # TIOCSWINSZ
    slave = k.libc.ioctl(master, 0x5441, os.O_RDWR | os.O_NOCTTY)  # TIOCGPTPEER
    if slave < 0:
        raise OSError(k.get_errno(), "opening the pty's slave failed")
    socket.send_fds(sock, [b"m"], [master])
    os.close(master)
    sock.close()
    return slave


def run(plan, go_r, err_w, tty_sock, wait):
    """Entry of the clone3() child; never returns.

    wait: the launcher has work to do on this process before it may go on
    (id maps through newuidmap, a cgroup v1 join) and says "G" when done.
    Otherwise it never writes: its end of the pipe only tells whether it is
    alive."""
    step = "starting"
    try:
        # Die with the launcher.  A launcher that died before this prctl has
        # closed its end of the go pipe: EOF there, checked next, closes the race.
        if plan.oci is None:   # an OCI container outlives its `create` by design
            k.prctl(k.PR_SET_PDEATHSIG, 9)
        if not wait and KERNEL.peer_gone(go_r):
            os._exit(125)
        # Nothing the caller's process left open stays open in the sandbox's
        # init for its whole life (stdio, the pipes and the tty socket stay).
        _close_except({0, 1, 2, go_r, err_w, plan.rootfd, *plan.keep_fds,
                       *mountexec.held_fds(plan.mounts)}
                      | ({tty_sock.fileno()} if tty_sock else set()))
        k.set_comm("gpusandbox-init")
        # Leave the caller's process group and session: keyboard signals reach
        # the launcher only, which forwards them once.
        os.setsid()
        # What needs no id map runs first: the capabilities in a new user
        # namespace exist from the clone on, and host paths are looked up with
        # the caller's unchanged kernel uid.
        if plan.clone_flags & k.CLONE_NEWUTS:
            step = "setting the hostname"
            k.sethostname(plan.hostname)
        if plan.pod:
            # A pod's rank is not pid 1: what its command leaves behind is
            # reaped here, and killed by the pod's keeper once this exits.
            k.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
        step = "making the mount tree private"
        cs = None
        if plan.container_settings():
            from . import ocisetup as cs       # else it has nothing to do
        k.mount(None, "/", None, k.MS_REC | (cs.start_propagation(plan) if cs else k.MS_SLAVE))
        if wait:
            # The launcher's work first (a full id map, a v1 cgroup join).
            # Host sources only after a full map: podman --uidmap chowns its
            # bind sources (hosts, resolv.conf, the userdata directory) to
            # ids of that map, which this namespace's capabilities reach only
            # once they are mapped here (capabilities(7), the inode's owner
            # must be mapped); before, their walk is refused (EACCES).
            if os.read(go_r, 1) != b"G":
                os._exit(125)
        step = "opening host sources"
        src = _open_sources(plan)
        fds = mountexec.open_sources(plan.mounts)
        # The exec fifo of a created container (plan.oci: its life), the
        # pid its hooks are told.
        life = cs.open_sources(plan) if cs else {"fifo": -1, "pid": 0}
        created = plan.oci is not None
        # Files created from here on need the caller's id mapped.
        if not wait and plan.idmap:
            # A one-id map of its own euid is one a process may write for
            # itself (user_namespaces(7)): no round trip with the launcher.
            step = "writing the user namespace's id maps"
            _, uin, uout, gin, gout = plan.idmap
            k.write_single("self", uin, uout, gin, gout, plan.real_root)
        spawn = command.spawnable(plan, tty_sock)
        if not (spawn or cs and cs.runtime_hooks(plan)):
            os.close(go_r)     # else kept for the hooks point, or the command stage
        # Not dumpable: the command cannot open /proc/1/exe, /proc/1/fd/* or
        # ptrace this process (CVE-2019-5736 class).  After the id maps, which
        # the launcher may write into /proc/<pid> of a still-dumpable child.
        k.prctl(4, 0)  # PR_SET_DUMPABLE
        pause_point(plan, "init-start")
        held = {}
        for step in root_steps(plan, src, fds, life, err_w, go_r, held):
            pass
        wdfd = held["wdfd"]
        tty_slave = None
        if tty_sock is not None:
            step = "allocating the terminal"
            tty_slave = _open_pty(tty_sock)
        if created:
            step = "waiting for start"
            err_w = cs.wait_start(plan, err_w, life, tty_slave)
        step = "starting the command"
        if created:
            # An OCI container's init becomes its workload (pid 1 of its pid
            # namespace, parent 0, as runc's and crun's): the caller reaps
            # the workload's own status and signals reach it unforwarded.
            command.run(plan, err_w, wdfd, tty_slave)
        if spawn:
            pid = command.spawn(plan, err_w, wdfd, go_r)
        else:
            pid = os.fork()
            if pid == 0:
                command.run(plan, err_w, wdfd, tty_slave)
            os.close(wdfd)
        os.close(err_w)
        if created:
            cs.release_stdio()
        if tty_slave is not None:
            os.close(tty_slave)
    except OSError as e:
        fail(err_w, 125, step, e.strerror or str(e), _hint(e, step))
    except Exception as e:  # noqa: BLE001 - any failure must reach the user as one line
        fail(err_w, 125, step, f"{type(e).__name__}: {e}")
    os._exit(_reap(pid))


def _hint(e, step):
    import errno
    if e.errno == errno.EPERM and "root filesystem" in step:
        return ("the kernel refused the overlay or bind over IMAGE_DIR; "
                "try --rw, or check 'gpusandbox doctor'")
    if e.errno == errno.ELOOP or "symlink" in str(e):
        return "the image has a symlink where the sandbox needs a directory; fix the image"
    return None


def _reap(cmd_pid):
    """Forward signals to the command, reap every orphan, and return the
    command's status (128+N when signal N killed it)."""
    import _signal
    waitset = set(FORWARDED) | {_SIGCHLD}
    while True:
        info = _signal.sigwaitinfo(waitset)
        sig = info.si_signo
        if sig != _SIGCHLD:
            try:
                os.kill(cmd_pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            continue
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 125
            if pid == 0:
                break
            if pid == cmd_pid:
                if os.WIFSIGNALED(status):
                    return 128 + os.WTERMSIG(status)
                return os.WEXITSTATUS(status)
