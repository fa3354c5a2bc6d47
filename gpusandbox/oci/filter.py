"""`gpusandbox oci-filter`: podman's hooks.d `precreate` stage.

podman (containers/common pkg/hooks) hands the container's config.json on
stdin and takes the edited one on stdout; this is the wrapper-free path on
Debian 12's podman.  A container that asks for no GPU gets its config back
byte for byte.

Generated files (the loader cache) go to a directory of their own for this
container, inside the caller's state directory (state_dir).  The filter
never sees the container end, so it leaves the removal to the runtime: the
edited config carries a poststop hook (`oci-filter --remove DIR`), which
runc and crun run when the container is deleted.  podman runs the filter
each time it creates the container in the runtime (every start), so every
directory is paired with one runtime container and its one delete.  Only a
config the runtime never received (podman failed after the filter) leaves
its directory behind: each call removes those older than GC_AGE, so what
stays is bounded by what one day of failed creates wrote.  A long-running
container's directory may go that way too: its files were bound in at its
create, and the mounts keep them.
"""
import os
import re
import sys

from gpusandbox.oci import configedit


GC_AGE = 24 * 3600
_NAME = re.compile(r"c-[A-Za-z0-9_]{4,64}\Z")


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


def _rmtree(base, name):
    import shutil
    # shutil.rmtree works through descriptors: a link planted inside is
    # removed, never followed.
    shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def collect_garbage(base, now=None):
    """Remove the per-container directories (and the content-addressed
    files of older versions) whose config never reached a runtime: those
    older than GC_AGE."""
    import time
    now = time.time() if now is None else now
    for name in os.listdir(base):
        if not (_NAME.match(name) or name.startswith(("ld.so.cache-", ".tmp-"))):
            continue
        try:
            st = os.lstat(os.path.join(base, name))
        except FileNotFoundError:
            continue
        if now - st.st_mtime < GC_AGE:
            continue
        if os.path.isdir(os.path.join(base, name)) and not os.path.islink(
                os.path.join(base, name)):
            _rmtree(base, name)
        else:
            try:
                os.unlink(os.path.join(base, name))
            except FileNotFoundError:
                pass


def cleanup_hook(name):
    """The poststop hook that removes this container's directory."""
    from gpusandbox.oci.hook import SAFE_PATH
    exe = sys.executable
    return {"path": exe, "args": [exe, "-I", "-m", "gpusandbox.oci.filter", "--remove", name],
            "env": [f"PATH={SAFE_PATH}"], "timeout": 30}


def remove(name):
    """`oci-filter --remove NAME`: the poststop hook's end of the pairing."""
    if not _NAME.match(name):
        raise configedit.UsageError(f"oci-filter --remove {name}",
                                    "not a directory the filter made")
    try:
        sys.stdin.buffer.read(1 << 20)    # the runtime's state; not needed
    except OSError:
        pass
    _drop(state_dir(os.environ), name)
    return 0


def _drop(base, name):
    _rmtree(base, name)
    try:
        os.rmdir(base)      # the last one out leaves no empty directory
    except OSError:
        pass


def _new_dir(environ):
    """(state directory, a fresh directory of this container's in it); a
    --remove that took the emptied state directory away meanwhile is met
    by making it again."""
    import tempfile
    for _ in range(3):
        base = state_dir(environ)
        collect_garbage(base)
        try:
            mine = tempfile.mkdtemp(prefix="c-", dir=base)
        except FileNotFoundError:
            continue
        os.chmod(mine, os.stat(base).st_mode & 0o777)
        return base, mine
    raise OSError(2, f"{base} keeps disappearing")


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write("usage: gpusandbox oci-filter < config.json > config.json\n"
                         "  (podman hooks.d precreate stage; see docs/hook.md)\n")
        return 0
    if len(argv) == 2 and argv[0] == "--remove":
        return remove(argv[1])
    if argv:
        raise configedit.UsageError(f"oci-filter {argv[0]}", "takes no arguments",
                                    hint="podman passes config.json on stdin")
    from gpusandbox.errors import SandboxError
    base = mine = None
    try:
        data = sys.stdin.buffer.read(configedit.MAX_CONFIG + 1)
        cfg = configedit.load(data)
        base, mine = _new_dir(os.environ)
        out = configedit.edit(cfg, os.environ, mine)
        if out is not None and os.listdir(mine):
            hooks = configedit._section(out, "hooks", dict)
            configedit._section(hooks, "poststop", list).append(
                cleanup_hook(os.path.basename(mine)))
            mine = None
        sys.stdout.buffer.write(data if out is None else configedit.dump(out))
        sys.stdout.flush()
    except OSError as e:
        raise SandboxError("oci-filter", e.strerror or str(e)) from None
    finally:
        if mine is not None:
            _drop(base, os.path.basename(mine))
    return 0


if __name__ == "__main__":
    from gpusandbox.errors import SandboxError, message
    try:
        sys.exit(main(sys.argv[1:]))
    except SandboxError as e:
        sys.stderr.write(message(e))
        sys.exit(e.code)
