"""`gpusandbox oci-filter`: podman's hooks.d `precreate` stage.

podman (containers/common pkg/hooks) hands the container's config.json on
stdin and takes the edited one on stdout; this is the wrapper-free path on
Debian 12's podman.  A container that asks for no GPU gets its config back
byte for byte.

Generated files (the loader cache) go to a directory of their own for this
container, inside the caller's state directory (state_dir).  The filter
never sees the container end, so it leaves the removal to the runtime: the
edited config carries a poststop hook (`sh -c 'rm -rf -- DIR ...'`), which
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
import sys

from gpusandbox.oci import configedit
from gpusandbox import rundir

GC_AGE = 24 * 3600
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
# The poststop hook: reads the runtime's state (not needed), removes the
# container's directory, and the state directory when it was the last one.
# A shell and rm rather than Python: it runs in every `podman rm`.
_REMOVE = ('while read -r _; do :; done; rm -rf -- "$1"; '
           'rmdir -- "${1%/*}" 2>/dev/null; exit 0')


def _is_name(name):
    """c- and 4 to 64 of [A-Za-z0-9_]: a directory the filter makes (no re:
    its import alone costs more than a cached create)."""
    return name.startswith("c-") and 4 <= len(name) - 2 <= 64 and \
        all(ch in _NAME_CHARS for ch in name[2:])


def state_dir(environ, fresh=True):
    """The caller's directory for generated files: the part "oci" of the
    caller's base directory (gpusandbox/rundir.py: /run/gpusandbox/oci as
    real root).  Hooks get no XDG_RUNTIME_DIR, so rootless it is usually
    under /tmp; when that name is another user's and no recorded one
    exists, a fresh directory of this call's (None unless `fresh`: a
    --remove has nothing to find there)."""
    try:
        return rundir.part("oci", environ, meet=not fresh)
    except configedit.UsageError:
        if not fresh:
            return None
        raise


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
        if not (_is_name(name) or name.startswith(("ld.so.cache-", ".tmp-"))):
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


def cleanup_hook(path):
    """The poststop hook that removes this container's directory (its
    absolute path, made by _new_dir)."""
    if not (path.startswith("/") and _is_name(os.path.basename(path))):
        raise configedit.UsageError(f"oci-filter cleanup {path}",
                                    "not a directory the filter made")
    return {"path": "/bin/sh", "args": ["sh", "-c", _REMOVE, "sh", path],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "timeout": 30}


def remove(name):
    """`oci-filter --remove NAME`: the poststop hook's end of the pairing in
    configs an earlier version edited (cleanup_hook now runs rm)."""
    if not _is_name(name):
        raise configedit.UsageError(f"oci-filter --remove {name}",
                                    "not a directory the filter made")
    try:
        sys.stdin.buffer.read(1 << 20)    # the runtime's state; not needed
    except OSError:
        pass
    base = state_dir(os.environ, fresh=False)
    if base is not None:        # else no directory of the caller's holds it
        _drop(base, name)
    return 0


def _drop(base, name):
    try:
        os.rmdir(os.path.join(base, name))      # empty: no shutil import
    except FileNotFoundError:
        pass
    except OSError:
        _rmtree(base, name)
    try:
        os.rmdir(base)      # the last one out leaves no empty directory
    except OSError:
        pass


def _new_dir(environ):
    """(state directory, a fresh directory of this container's in it); a
    --remove that took the emptied state directory away meanwhile is met
    by making it again."""
    for _ in range(3):
        base = state_dir(environ)
        collect_garbage(base)
        mine = os.path.join(base, "c-" + os.urandom(8).hex())
        try:
            os.mkdir(mine, 0o700)
        except FileNotFoundError:
            continue
        os.chmod(mine, os.stat(base).st_mode & 0o777)
        return base, mine
    raise OSError(2, f"{base} keeps disappearing")


HELP = """usage: gpusandbox oci-filter < config.json > config.json

podman's hooks.d precreate filter: reads a container's config.json on stdin and
writes it back with the GPUs its NVIDIA_VISIBLE_DEVICES names added (gpusandbox
hook install --stage precreate registers it; see docs/hook.md).
"""


def main(argv):
    if argv and argv[0] in ("-h", "--help"):
        sys.stdout.write(HELP)
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
                cleanup_hook(mine))
            mine = None
        sys.stdout.buffer.write(data if out is None else configedit.dump(out))
        sys.stdout.flush()
    except OSError as e:
        raise SandboxError("oci-filter", e.strerror or str(e)) from None
    finally:
        if mine is not None:
            _drop(base, os.path.basename(mine))
    return 0


def cli():
    """The process entry (`-m gpusandbox.oci.filter`, and the `-S` entry
    that `hook install` writes: BOOT)."""
    from gpusandbox.errors import exit_main
    exit_main(main, sys.argv[1:])


# `python3 -I -S -c BOOT SITE`: the interpreter without site (its imports and
# .pth files) and the package from SITE, the directory that holds it.
BOOT = "import sys;sys.path.insert(0,sys.argv.pop(1));from gpusandbox.oci.filter import cli;cli()"


def entry_args(python):
    """argv of the filter for hooks.d (hook install --stage precreate)."""
    site = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [python, "-I", "-S", "-c", BOOT, site]


if __name__ == "__main__":
    cli()
