"""OCI hooks (runtime-spec config.md, POSIX-platform hooks): each is run
with the container's state JSON on stdin, its own args and env, and an
optional timeout; a failing prestart/createRuntime/createContainer/
startContainer hook fails the operation, a failing poststart or poststop
hook is only logged (runtime-spec runtime.md, Lifecycle: "log a warning,
but the remaining hooks and lifecycle continue")."""
import json
import os
import subprocess

from ...errors import SandboxError


def _outputs(annotations):
    """crun's run.oci.hooks.stdout / run.oci.hooks.stderr annotations: files
    (opened for appending, created 0600) that get the hooks' output instead
    of the runtime's error text.  The config is the caller's, who runs the
    runtime with its own privileges: it names files as the caller could."""
    out = []
    for key in ("run.oci.hooks.stdout", "run.oci.hooks.stderr"):
        path = annotations.get(key) if isinstance(annotations, dict) else None
        if isinstance(path, str) and path:
            try:
                out.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
                                   | os.O_NOCTTY, 0o600))
            except OSError as e:
                raise SandboxError(f"annotation {key} {path}", e.strerror) from None
        else:
            out.append(subprocess.PIPE)
    return out


def _env(h):
    """A hook's `env` is its whole environment; a hook without one inherits
    the runtime's (runc: Go's exec.Cmd with a nil Env; crun's
    test_hook_env_inherit), the caller's own variables, PATH among them."""
    if h.get("env") is None:
        return None
    return dict(e.split("=", 1) for e in h["env"] if isinstance(e, str) and "=" in e)


def run(hooks, stages, public_state, log, fatal=True, cwd=None):
    """Runs the hooks of `stages` in order; the first failure raises when
    `fatal`, else each is logged as a warning and returned, as lines."""
    data = json.dumps(public_state).encode()
    box = [None]     # the output files, opened for the first hook that runs
    try:
        return _run(hooks, stages, data, log, fatal, cwd, public_state, box)
    finally:
        for fd in box[0] or ():
            if fd != subprocess.PIPE:
                os.close(fd)


def _run(hooks, stages, data, log, fatal, cwd, public_state, box):
    failed = []
    for stage in stages:
        for i, h in enumerate((hooks or {}).get(stage) or []):
            if not isinstance(h, dict) or not isinstance(h.get("path"), str):
                raise SandboxError(f"hooks.{stage}[{i}]", "needs a path")
            argv = h.get("args") or [h["path"]]
            env = _env(h)
            if box[0] is None:
                box[0] = _outputs(public_state.get("annotations"))
            redirect = box[0]
            try:
                r = subprocess.run(argv, executable=h["path"], input=data, env=env, cwd=cwd,
                                   stdout=redirect[0], stderr=redirect[1],
                                   timeout=h.get("timeout"))
                err = (r.stderr or b"").decode(errors="replace").strip()[-200:]
                why = None if r.returncode == 0 else f"exit {r.returncode}: {err}"
            except subprocess.TimeoutExpired:
                why = f"timed out after {h.get('timeout')} s"
            except OSError as e:
                why = e.strerror
            if why:
                err = SandboxError(f"{stage} hook {h['path']}", why)
                if fatal:
                    raise err
                log.warn(err.line())
                failed.append(err.line())
    return failed
