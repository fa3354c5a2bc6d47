"""`create`: the launcher stage of `gpusandbox run`, detached.

The same plan, cgroup, clone3, id maps and init as stages/parent.py; what
differs is only what an OCI runtime must do differently:
- no reaper and no PDEATHSIG: the container outlives this process, and
  `delete` removes the cgroup leaf;
- the init stops after its setup, says READY on the error channel, and blocks
  in open(2) of the exec fifo until `start`;
- this process then writes the pid file and state.json and exits, so the
  init is re-parented to the caller (conmon, a shim: their child subreaper)
  and its exit status, the workload's, is theirs to collect;
- a terminal's master goes to the caller's console socket.
"""
import os
import time

from ... import plan as planmod
from ...errors import SandboxError
from ...linux import cgroup, host, idmap
from ...linux import sys as k
from ...linux.host import host_uid
from ...stages import channel, mountexec, parent
from ...stages.ocisetup import READY
from .. import config as ociconfig
from . import state


def _setns(join):
    """Namespaces given by path are joined by this process before the clone:
    the init then starts inside them (setns(2); no flag for them in clone3)."""
    fds, paths = [], dict(join)
    try:
        for t, path in join:
            try:
                fds.append((t, os.open(path, os.O_RDONLY | os.O_CLOEXEC)))
            except OSError as e:
                raise SandboxError(f"joining the {t} namespace {path}", e.strerror) from None
        try:
            host.join_ns(fds)
        except host.NamespaceError as e:
            raise SandboxError(f"joining the {e.ns} namespace {paths[e.ns]}", e.strerror) from None
    finally:
        host.close_ns(fds)


# Joined by path for the init only, around its clone: this process keeps its
# own mount tree (the state directory, the cgroup tree), cgroup view (its
# leaf is found through /proc/self/cgroup) and pid namespace for the hooks'
# children (setns(2) of pid sets only pid_for_children).
LATE = ("pid", "cgroup", "mount")


class _Late:
    """setns(2) into the config's pid, cgroup and mount namespaces given by
    path, then back into this process's own on exit (and its working
    directory, which setns of a mount namespace moves to its root)."""

    def __init__(self, join):
        self.join = [(t, p) for t, p in join if t in LATE]
        self.own, self.cwd = [], -1

    def __enter__(self):
        if not self.join:
            return self
        self.cwd = os.open(".", os.O_PATH | os.O_CLOEXEC)
        self.own = host.open_ns(os.getpid(), [t for t, _ in self.join], skip_own=False)
        _setns(self.join)
        return self

    def __exit__(self, *exc):
        if not self.join:
            return
        try:
            host.join_ns(self.own)
            os.fchdir(self.cwd)
        except OSError as e:
            raise SandboxError("returning from the joined namespaces", e.strerror) from None
        finally:
            host.close_ns(self.own)
            os.close(self.cwd)


def _spawn_joined_userns(plan, cg, tty, wait, join):
    """The init, cloned by a child of this process that first joins the
    config's user namespace given by path, with its pid, cgroup and mount
    namespaces given by path (host.join_ns_owned: runc's order).  setns(2)
    of a user namespace is for good, and this process still needs its own
    capabilities (the cgroup, the state directory): the child sends the
    init's pid and the pipe ends back and exits; this process, a child
    subreaper meanwhile, gets the init as its child.  Returns spawn_init's
    (pid, go_w, err_r)."""
    _import_socket()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    k.prctl(36, 1)      # PR_SET_CHILD_SUBREAPER
    try:
        mid = os.fork()
        if mid == 0:
            try:
                ours.close()
                _in_joined_userns(plan, cg, tty, wait, join, theirs)
            finally:
                os._exit(0)
        theirs.close()
        try:
            msg, fds, _, _ = socket.recv_fds(ours, 65536, 2)
        finally:
            os.waitpid(mid, 0)
            ours.close()
    finally:
        k.prctl(36, 0)
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        what, why, hint, code = (msg.decode(errors="replace").split("\0") + [""] * 4)[:4]
        raise SandboxError(what or "joining the user namespace: the helper process failed",
                           why or None, hint or None, int(code) if code.isdigit() else 125)
    # What spawn_init gives up in the launcher once the init holds it.
    os.close(plan.rootfd)
    if tty:
        tty[1].close()
    return int(msg), fds[0], fds[1]


def _points_before_join(plan):
    """A written-through root gets the mount points it lacks here, before
    the user namespace is joined: once in it, this process's ids (the
    host's root, which such a namespace does not map) hold no capability
    over the root's directories (capable_wrt_inode_uidgid), and podman's
    overlay root is 0555, so the init could not make them (podman
    `--userns ns:PATH`: `cannot create mount point /tmp in the root`).
    The init's own pass (stages/init.py _rootfs) then has nothing to do.
    runc makes them inside the namespace, where podman chowns the root to
    the namespace's root for maps it writes itself, never for ns:PATH."""
    if plan.spec.rootfs_mode != "rw" or not plan.idmap or plan.idmap[0] != "full" \
            or not idmap.caller_unmapped(plan.idmap[1], plan.idmap[2]):
        return
    try:
        mountexec.KERNEL.prepare_upper(plan.rootfd, plan.rootfd, plan.points, plan.links)
    except OSError as e:     # MountError's strerror names the path
        raise SandboxError("building the root filesystem", e.strerror) from None
    # Done: the init, cloned from this process, has nothing left to make
    # there (its pass would remake each link, which it may not either).
    plan.points, plan.links = [], []


def _in_joined_userns(plan, cg, tty, wait, join, sock):
    fds = []
    try:
        _points_before_join(plan)
        try:
            for t, path in join:
                fds.append((t, os.open(path, os.O_RDONLY | os.O_CLOEXEC)))
            host.join_ns_owned(fds)
        except OSError as e:
            t = getattr(e, "ns", None) or t
            raise SandboxError(f"joining the {t} namespace {dict(join)[t]}", e.strerror) from None
        pid, _, go_w, err_r = parent.spawn_init(plan, cg, tty, wait)
        socket.send_fds(sock, [str(pid).encode()], [go_w, err_r])
    except SandboxError as e:
        sock.send("\0".join((e.what, e.why or "", e.hint or "", str(e.code))).encode())


def _rlimits(plan):
    import resource
    for res, soft, hard in plan.rlimits:
        try:
            resource.setrlimit(res, (soft, hard))
        except (OSError, ValueError) as e:
            name = [n for n, v in ociconfig.RLIMITS.items() if v == res][0]
            raise SandboxError(f"setting {name} to {soft}:{hard}", str(e),
                               "lower it in the config (podman: --ulimit)") from None
    if plan.oom_score_adj is not None:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(plan.oom_score_adj))


def _import_socket():
    """socket, whose import builds its enum classes, only for a terminal:
    bound as this module's global for the uses below."""
    global socket
    import socket


def _send_console(path, master):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        socket.send_fds(s, [b"/dev/ptmx"], [master])
    except OSError as e:
        raise SandboxError(f"console socket {path}", e.strerror) from None
    finally:
        s.close()


def _wait_ready(err_r, record=READY):
    """Until the init's `record` (READY, or HOOKS at the hooks point); an
    error record or the init's end instead fails the create."""
    buf = b""
    while True:
        chunk = os.read(err_r, 4096)
        if not chunk:
            break
        buf += chunk
        if buf.startswith(record):
            return
        if b"\n" in buf:
            break
    rec = channel.parse(buf) or (125, "the container's init exited during setup", None, None)
    code, what, why, hint = rec
    raise SandboxError(what, why, hint, code)


def create(root, cid, bundle, pid_file=None, console=None, preserve_fds=0, log=None,
           config_path=None):
    d = state.make_container_dir(root, cid)
    fifo = os.path.join(d, "exec.fifo")
    ok = False
    child = None
    cg = None
    plan = None
    try:
        os.mkfifo(fifo, 0o622)
        os.chmod(fifo, 0o622)
        spec = ociconfig.load(bundle, os.environ, fifo, preserve_fds, config_path, cid)
        x = spec.oci.extras
        if spec.tty and not console:
            raise SandboxError("process.terminal is set but no --console-socket was given")
        if spec.tty:
            _import_socket()
        spec.best_effort = True
        plan = planmod.build(spec, spec.oci.plan_env)
        for w in plan.warnings:
            log.warn(w)
        if plan.hook_state:
            from . import hooks  # noqa: F401 - run by the init, a clone of this process
        from ... import sitehooks   # the init's list, read here (warnings to the log)
        site_exit = sitehooks.info(plan, "exit") \
            if sitehooks.hooks(log.warn) and not plan.host_root else None
        _rlimits(plan)
        _setns([(t, p) for t, p in x.ns_join if t not in LATE and t != "user"])
        if spec.hostname and any(t == "uts" for t, _ in x.ns_join):
            # A uts namespace given by path is the container's: its hostname
            # is set there (the init sets it only in a new one), as runc does.
            try:
                k.sethostname(spec.hostname)
            except OSError as e:
                raise SandboxError("setting the hostname in the joined uts namespace",
                                   e.strerror) from None
        tty = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) if spec.tty else None
        if tty:
            # The pty's first window size (init._open_pty reads it first): none,
            # as a new pty's; the console socket's owner sets the real one.
            tty[0].sendall(bytes(8))
        parent.hold_signals()
        limits = None if x.limits.empty() else x.limits
        try:
            cg = cgroup.prepare(limits=limits, device_rules=plan.device_rules,
                                best_effort=True, name_prefix="gpusandbox-oci", detached=True,
                                v1_all=True, v1_parent=("/",),
                                v1_path=_v1_path(x.cgroups_path))
        except SandboxError as e:
            if host_uid() == 0:
                raise
            # Rootless, a caller whose cgroup is not in the cgroup2 tree (podman's
            # pause process on a hybrid host) gets no leaf, as rootless `run`
            # outside a delegated subtree: nothing to attach a filter to anyway.
            log.warn(f"no cgroup for the container: {e.line()}")
            cg = cgroup.CgroupHandle()
        for w in cg.warnings:
            log.warn(w)
        plan.own_cgroup = cg.view()
        v1_join = cg.needs_join
        wait = bool(plan.idmap and plan.idmap[0] == "full") or v1_join
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        joined_user = any(t == "user" for t, _ in x.ns_join)
        if joined_user:
            pid, go_w, err_r = _spawn_joined_userns(
                plan, cg, tty, wait, [(t, p) for t, p in x.ns_join if t in LATE + ("user",)])
        else:
            with _Late(x.ns_join):
                pid, _, go_w, err_r = parent.spawn_init(plan, cg, tty, wait)
        child = pid
        if not joined_user:     # a joined namespace's maps are its own
            parent._write_maps(plan, pid)
        if v1_join:
            cg.join(pid)
        if wait:
            os.write(go_w, b"G")
        if plan.hooks.get("createRuntime") or plan.hooks.get("prestart"):
            # The init waits at the hooks point (ocisetup.hooks_point): its
            # namespaces and mounts made, before the pivot.  Before the
            # terminal, which the init opens after the pivot.
            from ...stages.ocisetup import HOOKS
            from . import hooks     # subprocess: only when there are hooks to run
            _wait_ready(err_r, HOOKS)
            hstate = {"ociVersion": "1.0.2", "id": cid, "status": "created", "pid": pid,
                      "bundle": os.path.abspath(bundle), "rootfs": plan.rootfs,
                      "created": created, "owner": "", "annotations": x.annotations}
            # prestart (deprecated, once run by `start`) sees the container
            # created, as runtime-tools' hooks_stdin expects; createRuntime
            # sees it creating, as runc has both.
            hooks.run(plan.hooks, ("prestart",), hstate, log)
            hooks.run(plan.hooks, ("createRuntime",), dict(hstate, status="creating"), log)
            os.write(go_w, b"H")
        if tty:
            _, fds, _, _ = socket.recv_fds(tty[0], 1, 1)
            tty[0].close()
            if fds:
                _send_console(console, fds[0])
                os.close(fds[0])
        _wait_ready(err_r)
        os.close(err_r)
        os.close(go_w)
        st = {"id": cid, "pid": pid, "start_time": state.start_time(pid)[0],
              "bundle": os.path.abspath(bundle), "rootfs": plan.rootfs,
              "created": created,
              "annotations": x.annotations, "cgroup": cg.path, "cgroup_version": cg.version,
              "cgroup_v1": cg.v1,
              "hooks": plan.hooks, "_dir": d}
        if site_exit is not None:
            st["site_exit"] = site_exit     # delete runs the site's exit point
        state.save(st)
        if pid_file:
            tmp = f"{pid_file}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(str(pid))
            os.rename(tmp, pid_file)
        ok = True
    finally:
        for fd in mountexec.held_fds(plan.mounts) if plan is not None else ():
            os.close(fd)      # the init holds its own copies
        if not ok:
            if child:
                try:
                    os.kill(child, 9)    # not yet waited for: the number is still ours
                    os.waitpid(child, 0)
                except OSError:
                    pass
            if cg is not None:
                cg.teardown()
            _remove_dir(d)
        elif cg is not None:
            cg._close()
    return 0


def _v1_path(path):
    """Where the container's cgroup v1 leaves go: linux.cgroupsPath in each
    hierarchy, as runc's and crun's cgroupfs placement (podman's
    /libpod_parent/libpod-ID); a relative path under the hierarchy's root
    (the spec leaves its base to the runtime; never under the caller's own
    cgroups).  None (a leaf of this runtime's own name under the root) for a
    config without one and for systemd's slice:prefix:name form."""
    if not path or ":" in path:
        return None
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return "/".join(parts) or None      # config.py refused ".."


def _remove_dir(d):
    for name in state.FILES:
        try:
            os.unlink(os.path.join(d, name))
        except OSError:
            pass
    try:
        os.rmdir(d)
    except OSError:
        pass
