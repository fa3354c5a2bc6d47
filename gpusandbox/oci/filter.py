"""`gpusandbox oci-filter`: podman's hooks.d `precreate` stage.

podman (containers/common pkg/hooks) hands the container's config.json on
stdin and takes the edited one on stdout; this is the wrapper-free path on
Debian 12's podman.  A container that asks for no GPU gets its config back
byte for byte.  Generated files (the loader cache) go to a state directory
of the caller's: /run/gpusandbox/oci as root, $XDG_RUNTIME_DIR/gpusandbox/oci
rootless.
"""
import os
import sys

from gpusandbox.oci import configedit


def _in_init_userns():
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split() == ["0", "0", "4294967295"]
    except OSError:
        return False


def state_dir(environ):
    """The caller's directory for generated files (0755 as real root, 0700
    otherwise; rootless podman runs its hooks as root of its user namespace)."""
    real_root = os.geteuid() == 0 and _in_init_userns()
    if real_root:
        d = "/run/gpusandbox/oci"
    elif environ.get("XDG_RUNTIME_DIR", "").startswith("/"):
        d = os.path.join(environ["XDG_RUNTIME_DIR"], "gpusandbox", "oci")
    else:
        d = f"/tmp/gpusandbox-{os.getuid()}/oci"
    os.makedirs(d, mode=0o755 if real_root else 0o700, exist_ok=True)
    st = os.stat(d)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise configedit.UsageError(f"state directory {d}",
                                    "not owned by the caller or writable by others")
    return d


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write("usage: gpusandbox oci-filter < config.json > config.json\n"
                         "  (podman hooks.d precreate stage; see docs/hook.md)\n")
        return 0
    if argv:
        raise configedit.UsageError(f"oci-filter {argv[0]}", "takes no arguments",
                                    hint="podman passes config.json on stdin")
    data = sys.stdin.buffer.read(configedit.MAX_CONFIG + 1)
    cfg = configedit.load(data)
    out = configedit.edit(cfg, os.environ, state_dir(os.environ))
    sys.stdout.buffer.write(data if out is None else configedit.dump(out))
    sys.stdout.flush()
    return 0
