"""`exec`: one more process in a running container.

This process forks a joiner, which enters the container's cgroup leaf and
its namespaces (setns(2) on the init's /proc/PID/ns/*, user first), then
forks once more (a pid namespace applies to children) into the command
stage of `gpusandbox run` (stages/command.py), which drops privileges,
installs the container's seccomp filter and execs.  --detach: the pid goes
to --pid-file and the process is left to the caller (conmon, as subreaper);
otherwise this process is the subreaper and returns the process's status.
"""
import json
import os
import socket

from ...errors import SandboxError
from ...linux import host
from ...linux import sys as k
from ...plan import LaunchPlan, set_caps
from ...spec import RunSpec
from ...stages import channel, command
# Imported before setns(2): the image's tree is the process's root afterwards.
from ...stages.init import _open_pty
from .. import config as ociconfig
from . import state
from .args import _one, _split, _truthy


def _parse(rest):
    opts, pos = _split(rest, {"--process", "-p", "--console-socket", "--pid-file", "--cwd",
                              "--env", "-e", "--user", "-u", "--process-label", "--apparmor",
                              "--cap", "-c", "--preserve-fds", "--cgroup"},
                       {"--tty", "-t", "--detach", "-d", "--no-new-privs", "--ignore-paused"})
    if not pos:
        raise SandboxError("exec: a container id is required")
    cid = state.check_id(pos[0])
    path = _one(opts, "--process") or _one(opts, "-p")
    if path:
        with open(path) as f:
            proc = json.load(f)
        if not isinstance(proc, dict):
            raise SandboxError(f"exec --process {path}", "not a JSON object")
    else:
        if len(pos) < 2:
            raise SandboxError("exec: a command is required (or --process FILE)")
        # As crun: a process given on the command line gets no_new_privs
        # only from --no-new-privs, not from the container's config.
        proc = {"args": pos[1:], "terminal": _truthy(opts, "--tty") or _truthy(opts, "-t"),
                "noNewPrivileges": False,
                "env": opts.get("--env", []) + opts.get("-e", []),
                "cwd": _one(opts, "--cwd")}
        user = _one(opts, "--user") or _one(opts, "-u")
        if user:
            uid, _, gid = user.partition(":")
            proc["user"] = {"uid": int(uid), "gid": int(gid or 0)}
    return cid, proc, opts


def _plan(st, proc, rest_flags=()):
    """A LaunchPlan holding what the command stage reads, from the exec's
    process object over the container's config."""
    conf = ociconfig.read(st["bundle"])
    base = conf.get("process") or {}
    spec = RunSpec()
    plan = LaunchPlan(spec)
    args = proc.get("args")
    if not isinstance(args, list) or not args or not all(isinstance(a, str) for a in args):
        raise SandboxError("exec: process.args must be a non-empty list of strings")
    plan.argv = args
    env = dict(e.split("=", 1) for e in (base.get("env") or []) if "=" in e)
    env.update(dict(e.split("=", 1) for e in (proc.get("env") or []) if "=" in e))
    plan.env = env
    plan.workdir = proc.get("cwd") or base.get("cwd") or "/"
    user = proc.get("user") or base.get("user") or {}
    plan.cmd_uid, plan.cmd_gid = int(user.get("uid", 0)), int(user.get("gid", 0))
    caps = (proc.get("capabilities") or base.get("capabilities") or {})
    plan.clear_groups = True
    plan.keep_fds = ()
    x = ociconfig.OciExtras()
    x.caps = ociconfig.cap_sets(caps if isinstance(caps, dict) else {})
    nnp = proc.get("noNewPrivileges", base.get("noNewPrivileges", False))
    x.nnp = nnp is True or bool(rest_flags)
    set_caps(plan, None, x.caps)
    plan.no_new_privs = x.nnp
    groups = user.get("additionalGids")
    x.groups = [g for g in groups if isinstance(g, int)] if isinstance(groups, list) else None
    x.umask = plan.umask = user.get("umask") if isinstance(user.get("umask"), int) else None
    from ..configproc import parse as proc_settings
    x.proc = proc_settings(proc) or None
    if host.setgroups_denied(st["pid"]):
        # The container's user namespace denies setgroups(2) (a map written
        # without it, or `unshare -r` above it), as create's apply() allows
        # for: the process keeps the groups it has.
        plan.clear_groups = False
        x.groups = None
    plan.groups = x.groups
    plan.oci = x
    seccomp = (conf.get("linux") or {}).get("seccomp")
    if seccomp:
        from ..configplan import seccomp_program
        plan.seccomp = seccomp_program(seccomp, conf.get("annotations"))
    return plan


def main_exec(root, rest, log):
    cid, proc, opts = _parse(rest)
    st = state.load(root, cid)
    if state.status(st) not in ("running", "created"):
        raise SandboxError("container not running")
    plan = _plan(st, proc, [a for a in rest if a.startswith("--no-new-privs")])
    detach = _truthy(opts, "--detach") or _truthy(opts, "-d")
    console = _one(opts, "--console-socket")
    tty = bool(proc.get("terminal"))
    if tty and not console:
        raise SandboxError("exec --tty needs --console-socket")
    try:
        # Those shared with us (namespaces the config did not ask for) are left out.
        nsfds = host.open_ns(st["pid"])
    except host.NamespaceError as e:
        raise SandboxError(f"exec: opening the container's {host.NS_PROC[e.ns]} namespace",
                           e.strerror) from None
    if not state.alive(st):
        raise SandboxError("container not running")
    if not detach:
        k.prctl(36, 1)     # PR_SET_CHILD_SUBREAPER: the grandchild's status is ours
    pid_r, pid_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    joiner = os.fork()
    if joiner == 0:
        os.close(pid_r)
        os.close(err_r)
        _join(st, plan, nsfds, pid_w, err_w, console if tty else None)
    host.close_ns(nsfds)
    os.close(pid_w)
    os.close(err_w)
    data = os.read(pid_r, 32)
    os.close(pid_r)
    os.waitpid(joiner, 0)
    errbuf = b""
    while True:
        chunk = os.read(err_r, 4096)
        if not chunk:
            break
        errbuf += chunk
    rec = channel.parse(errbuf)
    if rec:
        code, what, why, hint = rec
        raise SandboxError(what, why, hint, code)
    if not data:
        raise SandboxError("exec: the process could not be started")
    pid = int(data)
    pid_file = _one(opts, "--pid-file")
    if pid_file:
        tmp = f"{pid_file}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(str(pid))
        os.rename(tmp, pid_file)
    if detach:
        return 0
    while True:
        try:
            wpid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 0
        if wpid == pid:
            return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _join(st, plan, nsfds, pid_w, err_w, console):
    step = "connecting to the console socket"
    try:
        sock = None
        if console:
            # Its path is the caller's: reached before the mount namespace changes.
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(console)
        step = "joining the container's cgroup"
        if st.get("cgroup"):
            with open(os.path.join(st["cgroup"], "cgroup.procs"), "w") as f:
                f.write("0")
        step = "joining the container's namespaces"
        try:
            host.join_ns(nsfds)
        except host.NamespaceError as e:
            step = f"joining the container's {host.NS_PROC[e.ns]} namespace"
            raise
        host.close_ns(nsfds)
        step = "starting the process"
        pid = os.fork()
        if pid:
            os.write(pid_w, str(pid).encode())
            os._exit(0)
        os.close(pid_w)
        step = f"entering the working directory {plan.workdir}"
        wdfd = os.open(plan.workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        slave = None
        if sock is not None:
            step = "allocating the terminal"
            slave = _open_pty(sock)
        k.prctl(4, 0)      # not dumpable until the execve (CVE-2019-5736 class)
        command.run(plan, err_w, wdfd, slave)
    except OSError as e:
        channel.fail(err_w, 125, step, e.strerror or str(e))
    except Exception as e:  # noqa: BLE001
        channel.fail(err_w, 125, step, f"{type(e).__name__}: {e}")
    os._exit(125)
