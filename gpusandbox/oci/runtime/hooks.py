"""OCI hooks (runtime-spec config.md, POSIX-platform hooks): each is run
with the container's state JSON on stdin, its own args and env, and an
optional timeout; a failing createRuntime/prestart/poststart hook fails the
operation, a failing poststop hook is only logged (the spec's rule)."""
import json
import subprocess

from ...errors import SandboxError


def run(hooks, stages, public_state, log, fatal=True):
    data = json.dumps(public_state).encode()
    for stage in stages:
        for i, h in enumerate((hooks or {}).get(stage) or []):
            if not isinstance(h, dict) or not isinstance(h.get("path"), str):
                raise SandboxError(f"hooks.{stage}[{i}]", "needs a path")
            argv = h.get("args") or [h["path"]]
            env = dict(e.split("=", 1) for e in (h.get("env") or []) if "=" in e)
            try:
                r = subprocess.run(argv, executable=h["path"], input=data, env=env,
                                   capture_output=True, timeout=h.get("timeout"))
                why = None if r.returncode == 0 else \
                    f"exit {r.returncode}: {r.stderr.decode(errors='replace').strip()[-200:]}"
            except subprocess.TimeoutExpired:
                why = f"timed out after {h.get('timeout')} s"
            except OSError as e:
                why = e.strerror
            if why:
                err = SandboxError(f"{stage} hook {h['path']}", why)
                if fatal:
                    raise err
                log.warn(err.line())
