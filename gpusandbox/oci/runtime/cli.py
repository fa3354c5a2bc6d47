"""`gpusandbox oci [global options] COMMAND` (also `gpusandbox-oci`): the runc
command line as podman, conmon and containerd's runc shim call it.

Global options: --root DIR, --log FILE, --log-format text|json, --debug,
--systemd-cgroup and --cgroup-manager (accepted: the container's cgroup is
always a cgroup2 leaf under the caller's own cgroup, see docs/oci.md),
--rootless (accepted, derived from the caller).  A failure prints one
`gpusandbox: error:` line and, with --log, appends one record there (JSON
{"level","msg","time"} with --log-format json, which podman reads back).
"""
import os
import sys
import time

from ...errors import SandboxError, printable
from .args import _one, _split, _truthy  # noqa: F401 - the commands' argv reader

USAGE = """usage: gpusandbox-oci [--root DIR] [--log FILE] [--log-format text|json] COMMAND

The runc command line, for podman, docker, containerd and conmon to start containers
through gpusandbox's setup (also `gpusandbox oci`).  See docs/oci.md.

commands:
  create --bundle DIR [--pid-file F] [--console-socket S] [--preserve-fds N] ID
  start ID            state ID            kill ID [SIGNAL] [--all]
  delete [--force] [--regex] ID|RE        run --bundle DIR ID [--detach]
  exec [--process F] [--tty] [--console-socket S] [--pid-file F] [--detach] ID [CMD...]
  pause ID            resume ID           ps [--format json] ID
  update [--memory N] [--memory-swap N] [--memory-reservation N] [--pids-limit N]
         [--cpu-shares N] [--cpu-quota N] [--cpu-period N] [--cpuset-cpus L]
         [--cpuset-mems L] [--blkio-weight N] [-r FILE|-] ID
  list [--format json] [-q]               features            spec     version
"""
GLOBAL_VALUE = {"--root", "--log", "--log-format", "--cgroup-manager", "--rootless",
                "--criu"}
GLOBAL_FLAG = {"--debug", "--systemd-cgroup", "--no-pivot", "-v", "--version", "-h", "--help"}


class Log:
    def __init__(self, path=None, fmt="text"):
        self.path, self.fmt = path, fmt

    def _write(self, level, msg):
        if not self.path:
            return
        if self.fmt == "json":
            from ..fastjson import dumps
            line = dumps({"level": level, "msg": msg,
                               "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        else:
            line = f"{level}: {msg}"
        try:
            with open(self.path, "a") as f:
                f.write(line + "\n")
        except OSError:
            pass

    def warn(self, msg):
        self._write("warning", msg)

    def error(self, msg):
        self._write("error", msg)


def _id(pos, cmd):
    if len(pos) < 1:
        raise SandboxError(f"{cmd}: a container id is required")
    from .state import check_id
    return check_id(pos[0])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    from ...errors import catch_signals
    catch_signals()
    log = Log()
    try:
        gopts = {}
        while argv and argv[0].startswith("-"):
            name, eq, val = argv[0].partition("=")
            if name in GLOBAL_VALUE:
                if not eq:
                    val = argv[1] if len(argv) > 1 else ""
                    argv = argv[1:]
                gopts[name] = val
            elif name in GLOBAL_FLAG:
                gopts[name] = val or "true"
            else:
                raise SandboxError(f"unknown global option {printable(name)}")
            argv = argv[1:]
        fmt = gopts.get("--log-format", "text")
        if fmt not in ("text", "json"):
            raise SandboxError(f"--log-format {printable(fmt)}", "not text or json")
        path = gopts.get("--log")
        if path:
            # Opened once here, as runc does: a log that cannot be written is
            # an error now, not a lost record later.  crun's "file:" prefix too.
            path = path[5:] if path.startswith("file:") else path
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                                 0o600))
            except OSError as e:
                raise SandboxError(f"--log {printable(path)}", e.strerror) from None
        log = Log(path, fmt)
        if "-v" in gopts or "--version" in gopts:
            argv = ["version"]
        if "-h" in gopts or "--help" in gopts or not argv:
            sys.stdout.write(USAGE)
            return 0 if argv or gopts else 125
        cmd, rest = argv[0], argv[1:]
        return _dispatch(cmd, rest, gopts.get("--root"), log)
    except SandboxError as e:
        from ...errors import message
        log.error(e.line())
        sys.stderr.write(message(e))
        return 1 if e.code == 125 else e.code
    except KeyboardInterrupt as e:
        # SIGINT/SIGTERM to the runtime itself (not to a container it
        # supervises, whose signals the launch forwards): one line, 130/143.
        from ...errors import interrupted, message, quiet_signals
        quiet_signals()
        err = interrupted(e, "gpusandbox-oci")
        log.error(err.line())
        sys.stderr.write(message(err))
        return err.code
    except OSError as e:
        # Last resort: an OSError no command turned into its own line.
        from ...errors import message, os_error
        err = os_error("gpusandbox-oci", e)
        log.error(err.line())
        sys.stderr.write(message(err))
        return 1


# The commands that read or write the state root: each checks it first
# (state.open_root), whether --root gave it or not.
STATE_COMMANDS = {"create", "run", "start", "state", "kill", "delete", "pause", "resume", "ps",
                  "list", "exec", "update"}


def _dispatch(cmd, rest, given_root, log):
    if "--help" in rest or "-h" in rest:
        sys.stdout.write(USAGE)
        return 0
    root = None
    if cmd in STATE_COMMANDS:
        from .state import open_root
        # create makes it (create.py, by the same rule), the others only read.
        root, fd = open_root(given_root)
        if fd is not None:
            os.close(fd)
    if cmd == "spec":
        opts, _ = _split(rest, {"--bundle", "-b"}, {"--rootless"})
        from .specgen import write_spec
        return write_spec(_one(opts, "--bundle") or _one(opts, "-b") or ".",
                          _truthy(opts, "--rootless"))
    if cmd in ("create", "run"):
        opts, pos = _split(rest, {"--bundle", "-b", "--pid-file", "--console-socket",
                                  "--preserve-fds", "--pidfd-socket", "--config", "-f"},
                           {"--no-pivot", "--no-new-keyring", "--detach", "-d",
                            "--no-subreaper", "--keep"})
        cid = _id(pos, cmd)
        bundle = _one(opts, "--bundle") or _one(opts, "-b") or os.getcwd()
        try:
            nfds = int(_one(opts, "--preserve-fds", "0"))
        except ValueError:
            raise SandboxError("--preserve-fds needs a number") from None
        from .create import create
        # crun's --config FILE: the config read instead of BUNDLE/config.json
        # (relative paths from the current directory, as crun does).
        conf = _one(opts, "--config") or _one(opts, "-f")
        create(root, cid, bundle, _one(opts, "--pid-file"), _one(opts, "--console-socket"),
               nfds, log, conf and os.path.abspath(conf))
        if cmd == "create":
            return 0
        from . import ops
        ops.start(root, cid, log)
        if _truthy(opts, "--detach") or _truthy(opts, "-d"):
            return 0
        return _wait_and_delete(root, cid, log, keep=_truthy(opts, "--keep"))
    # ops (json, select) only for the commands that use it: not `create`.
    from . import ops
    if cmd == "start":
        return ops.start(root, _id(rest, cmd), log)
    if cmd == "state":
        return ops.state_cmd(root, _id(rest, cmd))
    if cmd == "kill":
        opts, pos = _split(rest, set(), {"--all", "-a"})
        return ops.kill(root, _id(pos, cmd), pos[1] if len(pos) > 1 else "TERM",
                        _truthy(opts, "--all") or _truthy(opts, "-a"))
    if cmd == "delete":
        opts, pos = _split(rest, set(), {"--force", "-f", "--regex", "-r"})
        force = _truthy(opts, "--force") or _truthy(opts, "-f")
        if _truthy(opts, "--regex") or _truthy(opts, "-r"):
            if len(pos) != 1:
                raise SandboxError("delete --regex: one regular expression is required")
            return ops.delete_matching(root, pos[0], force, log)
        return ops.delete(root, _id(pos, cmd), force, log)
    if cmd in ("pause", "resume"):
        return ops.freeze(root, _id(rest, cmd), cmd == "pause")
    if cmd == "ps":
        opts, pos = _split(rest, {"--format", "-f"}, set())
        return ops.ps(root, _id(pos, cmd), _one(opts, "--format") or _one(opts, "-f"))
    if cmd == "list":
        opts, pos = _split(rest, {"--format", "-f"}, {"--quiet", "-q"})
        return ops.list_cmd(root, _one(opts, "--format") or _one(opts, "-f"),
                            _truthy(opts, "-q") or _truthy(opts, "--quiet"))
    if cmd == "exec":
        from .execute import main_exec
        return main_exec(root, rest, log)
    if cmd == "update":
        from .update import main_update
        return main_update(root, rest)
    if cmd == "features":
        return ops.features()
    if cmd == "version":
        from ... import __version__
        sys.stdout.write(f"gpusandbox-oci version {__version__}\nspec: {ops.SPEC_VERSION}\n")
        return 0
    raise SandboxError(f"unknown command: {printable(cmd)}", None,
                       "run 'gpusandbox-oci --help' for the list of commands")


def _wait_and_delete(root, cid, log, keep=False):
    """`run` without --detach: the caller waits for the workload's status.
    The init is this process's child until then (create forked it)."""
    from . import ops, state
    st = state.load(root, cid)
    try:
        _, status = os.waitpid(st["pid"], 0)
        code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    except ChildProcessError:
        code = 0
    if not keep:      # --keep (crun's): the stopped container stays for `state`
        ops.delete(root, cid, True, log)
    return code
