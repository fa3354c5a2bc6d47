"""The runtime wrapper (bin/gpusandbox-runtime), in the role of
nvidia-container-runtime: on `create` (and `run`), the bundle's config.json gets the
GPUs its NVIDIA_VISIBLE_DEVICES asks for (configedit, rewritten atomically,
unknown keys kept, the toolkit's legacy prestart hook dropped); then the
real runtime (runc or crun) is exec'd with the arguments unchanged.

Every other command never reaches Python: the shell entry execs the
runtime at once (podman calls `state` many times per container).  The
wrapper never writes to stdout (the runtime's stdout is podman's protocol);
its errors go to --log in --log-format, and to stderr.
"""
import os
import sys

# Global options of runc and crun that take a value as the next argument.
_VALUED = ("--root", "--log", "--log-format", "--log-level", "--criu", "--rootless",
           "--cgroup-manager")
_CREATE_VALUED = ("--bundle", "-b", "--console-socket", "--pid-file", "--preserve-fds")


def real_runtime(environ):
    """The runtime to exec: the `runtime` setting (GPUSANDBOX_OCI_RUNTIME,
    the settings files), else runc, else crun, from the usual system
    directories (never a PATH lookup: PATH is the engine's)."""
    from gpusandbox import settings
    rt = settings.get("runtime", environ)
    if rt:
        return rt
    for d in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        for name in ("runc", "crun"):
            if os.access(os.path.join(d, name), os.X_OK):
                return os.path.join(d, name)
    return "runc"


def parse(argv):
    """(command, {global option: value}, bundle or None, container id)."""
    opts = {}
    i, cmd = 0, None
    while i < len(argv):
        a = argv[i]
        if a in _VALUED and i + 1 < len(argv):
            opts[a] = argv[i + 1]
            i += 2
            continue
        if a.startswith("--") and "=" in a:
            k, _, v = a.partition("=")
            opts[k] = v
        elif not a.startswith("-"):
            cmd = a
            i += 1
            break
        i += 1
    bundle, cid = None, None
    if cmd in ("create", "run"):
        while i < len(argv):
            a = argv[i]
            if a in _CREATE_VALUED and i + 1 < len(argv):
                if a in ("--bundle", "-b"):
                    bundle = argv[i + 1]
                i += 2
                continue
            if a.startswith("--bundle="):
                bundle = a.partition("=")[2]
            elif not a.startswith("-"):
                cid = a
            i += 1
    return cmd, opts, bundle, cid


def log_error(opts, text):
    """One error line in the runtime's --log format (json or text), and on stderr."""
    import time
    from gpusandbox.oci.fastjson import dumps
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if opts.get("--log-format") == "json":
        line = dumps({"level": "error", "msg": text, "time": stamp})
    else:
        line = f"time={dumps(stamp)} level=error msg={dumps(text)}"
    path = opts.get("--log")
    if path:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)
        except OSError:
            pass
    sys.stderr.write(f"gpusandbox-runtime: error: {text}\n")


def edit_bundle(bundle, environ):
    """Rewrite bundle/config.json with the GPU edits (atomic, same mode)."""
    from gpusandbox.oci import configedit
    bfd = os.open(bundle, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = os.open("config.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=bfd)
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode & 0o777
            data = f.read(configedit.MAX_CONFIG + 1)
        cfg = configedit.load(data)
        out = configedit.edit(cfg, environ, os.path.realpath(bundle), bundle_fd=bfd)
        if out is None:
            return False
        tmp = f".config.json.gpusandbox-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     mode, dir_fd=bfd)
        # No fsync: the runtime exec'd next reads the file from the page
        # cache, and a crash before it did leaves a container that never
        # ran (the engine writes the bundle again for the next create).
        try:
            view = memoryview(configedit.dump(out))
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(tmp, "config.json", src_dir_fd=bfd, dst_dir_fd=bfd)
        return True
    finally:
        os.close(bfd)


def main(argv=None):
    from gpusandbox.errors import SandboxError
    argv = sys.argv[1:] if argv is None else argv
    cmd, opts, bundle, _cid = parse(argv)
    try:
        runtime = real_runtime(os.environ)
        if cmd in ("create", "run"):
            edit_bundle(bundle or ".", os.environ)
    except SandboxError as e:
        log_error(opts, e.line() + (f" (hint: {e.hint})" if e.hint else ""))
        return 1
    except OSError as e:
        log_error(opts, f"editing the bundle's config.json: {e}")
        return 1
    try:
        os.execv(runtime, [runtime] + argv)
    except OSError as e:
        log_error(opts, f"cannot run {runtime}: {e.strerror}")
        return 1


# `python3 -I -S -c BOOT SITE ARGS...` (bin/gpusandbox-runtime): the
# interpreter without site (its imports and .pth files), the package from SITE.
BOOT = ("import sys;sys.path.insert(0,sys.argv.pop(1));"
        "from gpusandbox.oci.wrapper import main;sys.exit(main())")

if __name__ == "__main__":
    sys.exit(main())
