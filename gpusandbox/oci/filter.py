"""`gpusandbox oci-filter`: podman's hooks.d `precreate` stage.

podman (containers/common pkg/hooks) hands the container's config.json on
stdin and takes the edited one on stdout; this is the wrapper-free path on
Debian 12's podman.  A container that asks for no GPU gets its config back
byte for byte.  Generated files (the loader cache) go to a state directory
of the caller's (state_dir).  The cache files are content-addressed and
small; nothing removes them (the container's end is not seen here).
"""
import os
import sys

from gpusandbox.oci import configedit


def _uid_map():
    try:
        with open("/proc/self/uid_map") as f:
            return [ln.split() for ln in f if ln.strip()]
    except OSError:
        return []


def _host_uid():
    """The caller's uid on the host (rootless podman runs hooks as root of
    its user namespace)."""
    uid = os.geteuid()
    for inside, outside, count in _uid_map():
        if int(inside) <= uid < int(inside) + int(count):
            return int(outside) + uid - int(inside)
    return uid


def _own_dir(d, mode):
    try:
        os.mkdir(d, mode)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not os.path.isdir(d) or os.path.islink(d) or st.st_uid != os.geteuid() \
            or st.st_mode & 0o022:
        raise configedit.UsageError(f"state directory {d}", "not a directory owned by the "
                                    "caller and closed to others")


def state_dir(environ):
    """The caller's directory for generated files: /run/gpusandbox/oci as
    real root, /tmp/gpusandbox-<host uid>/oci otherwise (hooks get no
    XDG_RUNTIME_DIR)."""
    real_root = os.geteuid() == 0 and _uid_map() == [["0", "0", "4294967295"]]
    if real_root:
        os.makedirs("/run/gpusandbox", 0o755, exist_ok=True)
        base = "/run/gpusandbox"
    else:
        base = f"/tmp/gpusandbox-{_host_uid()}"
        _own_dir(base, 0o700)
    d = os.path.join(base, "oci")
    _own_dir(d, 0o755 if real_root else 0o700)
    return d


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write("usage: gpusandbox oci-filter < config.json > config.json\n"
                         "  (podman hooks.d precreate stage; see docs/hook.md)\n")
        return 0
    if argv:
        raise configedit.UsageError(f"oci-filter {argv[0]}", "takes no arguments",
                                    hint="podman passes config.json on stdin")
    from gpusandbox.errors import SandboxError
    try:
        data = sys.stdin.buffer.read(configedit.MAX_CONFIG + 1)
        cfg = configedit.load(data)
        out = configedit.edit(cfg, os.environ, state_dir(os.environ))
        sys.stdout.buffer.write(data if out is None else configedit.dump(out))
        sys.stdout.flush()
    except OSError as e:
        raise SandboxError("oci-filter", e.strerror or str(e)) from None
    return 0


if __name__ == "__main__":
    from gpusandbox.errors import SandboxError, message
    try:
        sys.exit(main(sys.argv[1:]))
    except SandboxError as e:
        sys.stderr.write(message(e))
        sys.exit(e.code)
