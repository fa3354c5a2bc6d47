"""`exec`: one more process in a running container.

This process forks a joiner, which enters the container's cgroup leaf and
its namespaces (setns(2) on the init's /proc/PID/ns/*, user first), then
forks once more (a pid namespace applies to children) into the command
stage of `gpusandbox run` (stages/command.py), which drops privileges,
installs the container's seccomp filter and execs.  --detach: the pid goes
to --pid-file and the process is left to the caller (conmon, as subreaper);
otherwise this process is the subreaper and returns the process's status.
"""
import os
import socket

from ...errors import SandboxError, UsageError, printable
from ...linux import host
from ...linux import sys as k
from ...plan import LaunchPlan
from ...spec import RunSpec
# Imported before setns(2): the image's tree is the process's root afterwards.
from ...stages import channel, enter
from .. import config as ociconfig
from .. import configplan
from .. import fastjson as json
from ..configfield import _get, _strs
from ..configprocess import parse as parse_process
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
        try:
            with open(path, "rb") as f:
                proc = json.loads(f.read(ociconfig.MAX_CONFIG + 1))
        except OSError as e:
            raise UsageError(f"exec --process {printable(path)}", e.strerror) from None
        except (ValueError, RecursionError):
            raise UsageError(f"exec --process {printable(path)}", "not valid JSON") from None
        if not isinstance(proc, dict):
            raise UsageError(f"exec --process {printable(path)}", "not a JSON object")
        where = f"exec --process {printable(path)}"
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
            if not (uid.isascii() and uid.isdigit()) or \
                    not (gid == "" or (gid.isascii() and gid.isdigit())):
                raise UsageError(f"exec --user {printable(user)}", "not UID[:GID] (numbers)",
                                 "give numeric ids, e.g. --user 1000:1000")
            proc["user"] = {"uid": int(uid), "gid": int(gid or 0)}
        where = "exec"
    return cid, proc, opts, where


# The exec's own kernel settings only: never the container's process's.
_OWN_ONLY = ("scheduler", "ioPriority", "execCPUAffinity")


def _plan(st, proc, nnp_flag=False, where="exec"):
    """The plan of one more process in the container: the exec's process
    object over the container's config.process (its fields win, its env is
    added), read by create's typed parser (configprocess.parse) and turned
    into the same plan fields (configplan.process); the container's
    linux.seccomp through create's entry point (configplan.seccomp)."""
    conf = ociconfig.read(st["bundle"])
    try:
        base = _get(conf, "process", dict, "process", {})
        merged = {key: val for key, val in base.items() if key not in _OWN_ONLY}
        merged.update((key, val) for key, val in proc.items() if val is not None)
        merged["env"] = (_strs(_get(base, "env", list, "process", []), "process.env")
                         + _strs(_get(proc, "env", list, "process", []), "process.env"))
        pr = parse_process(merged)
    except UsageError as e:
        # The field named as the exec's (a bad one in the container's own
        # config would have failed its `create`).
        raise UsageError(f"{where}: {e.what.replace('OCI config ', '', 1)}", e.why,
                         e.hint) from None
    plan = LaunchPlan(RunSpec())
    plan.argv = pr.args
    plan.env = dict(pr.env)
    plan.workdir = pr.cwd
    plan.clear_groups = True
    plan.keep_fds = ()
    # The container's user namespace may deny setgroups(2) (a map written
    # without it, or `unshare -r` above it), as create's identity allows for:
    # the process keeps the groups it has.
    configplan.process(plan, pr, host.setgroups_denied(st["pid"]))
    plan.no_new_privs = pr.nnp or nnp_flag
    linux = _get(conf, "linux", dict, "linux", {})
    plan.seccomp = configplan.seccomp(_get(linux, "seccomp", dict, "linux"),
                                      _get(conf, "annotations", dict, "annotations", {}))
    return plan


def main_exec(root, rest, log):
    cid, proc, opts, where = _parse(rest)
    st = state.load(root, cid)
    if state.status(st) not in ("running", "created"):
        raise SandboxError("container not running")
    plan = _plan(st, proc, any(a.startswith("--no-new-privs") for a in rest), where)
    detach = _truthy(opts, "--detach") or _truthy(opts, "-d")
    console = _one(opts, "--console-socket")
    tty = proc.get("terminal") is True
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
    leaves = ([st["cgroup"]] if st.get("cgroup") else []) + list(st.get("cgroup_v1") or ())
    joiner, born = enter.fork(st.get("cgroup") if st.get("cgroup_version") == 2 else None)
    if joiner == 0:
        os.close(pid_r)
        os.close(err_r)
        _join(plan, leaves[1:] if born else leaves, nsfds, pid_w, err_w,
              console if tty else None)
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


def _join(plan, leaves, nsfds, pid_w, err_w, console):
    """The joiner (stages/enter.py), after connecting to the console socket,
    whose path is the caller's: reached before the mount namespace changes."""
    sock = None
    if console:
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(console)
        except OSError as e:
            channel.fail(err_w, 125, "connecting to the console socket", e.strerror or str(e))
            os._exit(125)
    enter.joiner(plan, leaves, nsfds, pid_w, err_w, sock, "container", sized=False)
