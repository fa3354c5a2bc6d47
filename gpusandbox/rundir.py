"""Every directory gpusandbox keeps runtime state in: where it is, how it is
made, how it is checked (docs/runtime.md).  No other module makes these.

    real root      /run/gpusandbox/            root's, 0755
                       pods/ mps/ nodeimage/ oci-memo/ live/   0700
                       oci/                    0755: files the precreate filter
                                               generates, which a user-namespaced
                                               runtime (podman --userns) binds
                   /run/gpusandbox-oci/        the OCI runtime's state root, 0700
    anyone else    BASE/ and every part, 0700, where BASE is the first usable of
                       $XDG_RUNTIME_DIR/gpusandbox
                       /run/user/<host uid>/gpusandbox   (hooks get no XDG_RUNTIME_DIR)
                       /tmp/gpusandbox-<host uid>
                   the OCI state root: $XDG_RUNTIME_DIR/gpusandbox-oci, else
                   /run/user/<host uid>/gpusandbox-oci, the first whose
                   runtime directory is usable (runc's order); 0700

"Usable" is one rule, used for every directory here and for every path the
host side takes from a shared or user-writable place (trusted_dir): walked
from / by descriptor without following a symlink, each component a
directory owned by root or the caller that no one else can write (a sticky
directory such as /tmp aside), the last one the caller's.  A directory of
the caller's with another mode (left by an older version) is repaired; one
that belongs to someone else is refused with a hint.

The /tmp name is predictable: another user may have made it first.  Then
the base is a fresh directory under an unguessable name
(/tmp/gpusandbox-<uid>.<random>), recorded in the caller's own state
directory (~/.local/state/gpusandbox/rundir.<host>) so that every later
launch on this node (pod ranks, MPS clients) finds the same one; without a
home of the caller's to record it in, parts that need a meeting point fail
with the hint to set XDG_RUNTIME_DIR, the others use a fresh directory of
their own for this call.

Light: os, stat and errno only (the OCI fast paths call it).
"""
import os
import stat

from .linux.host import host_uid, real_root, root_uids  # noqa: F401 (root_uids: API)
# The one rule (Taken, trusted_dir, ensure_dir) is linux/host.py's, so that the
# GPU discovery's check of the MPS pipe directory loads no more than it.
from .linux.host import _DIR, Taken, _check_step, ensure_dir, trusted_dir  # noqa: F401

ROOT_BASE = "/run/gpusandbox"
ROOT_OCI = "/run/gpusandbox-oci"
OCI_NAME = "gpusandbox-oci"
# part: (mode as real root, mode otherwise)
PARTS = {
    "pods": (0o700, 0o700),
    "mps": (0o700, 0o700),
    "nodeimage": (0o700, 0o700),
    "oci-memo": (0o700, 0o700),
    # named and detached sandboxes' records and logs (live/record.py)
    "live": (0o700, 0o700),
    "oci": (0o755, 0o700),
}
ROOT_BASE_MODE = 0o755
USER_MODE = 0o700
HINT_XDG = "set XDG_RUNTIME_DIR to a directory of your own (mode 0700) and run again"


def _error(path, why, hint):
    from .errors import UsageError
    return UsageError(f"runtime directory {path}", why, hint)


def read_owned(dir_fd, name, limit, uid=None, closed=False):
    """At most `limit` bytes of regular file `name` in the directory held by
    `dir_fd`, which must be `uid`'s (default: the caller's) and, when
    `closed`, writable by no one else.  Opened without following a link and
    without blocking (a FIFO or a device planted under that name must
    neither stall the caller nor lead it to another file), checked on the
    opened inode.  Taken when it is not such a file; OSError (ENOENT, ELOOP)
    as the kernel says."""
    uid = os.geteuid() if uid is None else uid
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY,
                 dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Taken(name, "not a regular file", False)
        if st.st_uid != uid:
            whose = f"you (uid {uid})" if uid == os.geteuid() else f"uid {uid}"
            raise Taken(name, f"owned by uid {st.st_uid}, not by {whose}", True)
        if closed and st.st_mode & 0o022:
            raise Taken(name, f"mode {st.st_mode & 0o7777:04o} lets others write to it", False)
        chunks, left = [], limit
        while left > 0:
            b = os.read(fd, min(left, 1 << 16))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


# --- where ----------------------------------------------------------------------
def usable_runtime(path):
    """Whether `path` (XDG_RUNTIME_DIR, /run/user/UID) passes the rule."""
    if not path or not path.startswith("/"):
        return False
    try:
        os.close(trusted_dir(path))
        return True
    except (Taken, OSError):
        return False


def runtime_home(environ=None):
    """The caller's runtime directory (XDG_RUNTIME_DIR or /run/user/UID)
    when one passes the rule, else None."""
    environ = os.environ if environ is None else environ
    for cand in (environ.get("XDG_RUNTIME_DIR") or "", f"/run/user/{host_uid()}"):
        if usable_runtime(cand):
            return cand.rstrip("/") or "/"
    return None


def oci_root(environ=None):
    """The OCI runtime's default state root (not made here), or None when
    an unprivileged caller has no runtime directory."""
    if host_uid() == 0:
        return ROOT_OCI
    home = runtime_home(environ)
    return os.path.join(home, OCI_NAME) if home else None


def open_oci_root(path, given, make=False):
    """A descriptor of the OCI runtime's state root `path`, checked by the
    rule: a `given` one (--root DIR) is walked with links of root's or the
    caller's followed and must be root's or the caller's, closed to others;
    the default (oci_root) must be the caller's, closed to others, in a
    runtime directory that passes the rule (root's: in /run).  `make`: made
    when missing (0700, as runc and crun make theirs); otherwise None where
    it does not exist.  Taken when the rule refuses; OSError as the kernel
    says."""
    if given:
        try:
            return trusted_dir(path, own=False, links=True, make=USER_MODE if make else None)
        except FileNotFoundError:
            if make:
                raise
            return None
    parent, name = os.path.split(path)
    pfd = trusted_dir(parent, own=parent != "/run")
    try:
        if make:
            return ensure_dir(pfd, parent, name, USER_MODE)
        try:
            fd = os.open(name, _DIR, dir_fd=pfd)
        except FileNotFoundError:
            return None
        except OSError:
            raise Taken(path, "not a directory (a link or a file is there)", True) from None
        try:
            _check_step(fd, path, True, os.geteuid())
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        os.close(pfd)


def _pointer_path(environ):
    """Where the fresh /tmp base is recorded: the caller's own state
    directory (XDG_STATE_HOME, else HOME's, else passwd's home), or None."""
    state = environ.get("XDG_STATE_HOME") or ""
    if not state.startswith("/"):
        home = environ.get("HOME") or ""
        homes = [home] if home.startswith("/") else []
        try:
            import pwd
            homes.append(pwd.getpwuid(os.geteuid()).pw_dir)
        except (KeyError, ImportError):
            pass
        for h in homes:
            try:
                if os.stat(h).st_uid == os.geteuid() and h != "/":
                    state = os.path.join(h, ".local", "state")
                    break
            except OSError:
                continue
        else:
            return None
    return os.path.join(state, "gpusandbox", f"rundir.{os.uname().nodename}")


class Base:
    """The caller's base directory: path, descriptor, whether it is root's."""

    def __init__(self, path, fd, root, ephemeral=False):
        self.path, self.fd, self.root, self.ephemeral = path, fd, root, ephemeral

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _open_base(environ, meet):
    uid = host_uid()
    if real_root():
        parent = "/run"
        pfd = trusted_dir(parent, own=False)
        try:
            return Base(ROOT_BASE, ensure_dir(pfd, parent, "gpusandbox", ROOT_BASE_MODE), True)
        finally:
            os.close(pfd)
    home = runtime_home(environ)
    if home:
        pfd = trusted_dir(home)
        try:
            return Base(os.path.join(home, "gpusandbox"),
                        ensure_dir(pfd, home, "gpusandbox", USER_MODE), False)
        finally:
            os.close(pfd)
    pfd = os.open("/tmp", _DIR)
    try:
        try:
            return Base(f"/tmp/gpusandbox-{uid}",
                        ensure_dir(pfd, "/tmp", f"gpusandbox-{uid}", USER_MODE), False)
        except Taken as e:
            if not e.foreign:
                raise
            return _fresh_base(pfd, uid, environ, meet, e)
    finally:
        os.close(pfd)


def _fresh_base(tmpfd, uid, environ, meet, taken):
    """The predictable /tmp name is someone else's: the fresh base recorded
    in the caller's state directory, or a new one, recorded.  Where nothing
    can be recorded, `meet` callers get the error, the others a fresh
    directory of this call's own (Base.ephemeral: theirs to remove)."""
    pointer = _pointer_path(environ)
    if pointer:
        try:
            with open(pointer, "rb") as f:
                name = os.fsdecode(f.read(200).strip())
            if name.startswith(f"gpusandbox-{uid}.") and "/" not in name:
                fd = ensure_dir(tmpfd, "/tmp", name, USER_MODE)
                return Base("/tmp/" + name, fd, False)
        except (OSError, Taken):
            pass
    if not pointer and meet:
        raise _error(taken.path, taken.why + "; no home of yours to record another name in",
                     HINT_XDG)
    for _ in range(8):
        name = f"gpusandbox-{uid}.{os.urandom(8).hex()}"
        try:
            os.mkdir(name, USER_MODE, dir_fd=tmpfd)
        except FileExistsError:
            continue
        fd = ensure_dir(tmpfd, "/tmp", name, USER_MODE)
        recorded = False
        if pointer:
            try:
                from .linux.fsutil import write_atomic
                os.makedirs(os.path.dirname(pointer), 0o700, exist_ok=True)
                recorded = write_atomic(pointer, name.encode() + b"\n", 0o600)
            except OSError:
                pass
        if not recorded and meet:
            os.close(fd)
            os.rmdir(name, dir_fd=tmpfd)
            raise _error(taken.path, taken.why + f"; cannot record another name in {pointer}",
                         HINT_XDG)
        return Base("/tmp/" + name, fd, False, ephemeral=not recorded)
    raise _error("/tmp", "cannot make a private directory there", HINT_XDG)


def open_base(environ=None, meet=True):
    """The caller's base directory, made and checked (Base).  `meet`: the
    caller needs the same directory as other launches (pods, MPS)."""
    environ = os.environ if environ is None else environ
    try:
        return _open_base(environ, meet)
    except Taken as e:
        hint = f"remove {e.path} and run again" if not e.foreign else \
            (f"remove {e.path} (as root) and run again" if real_root() else HINT_XDG)
        raise _error(e.path, e.why, hint) from None


def part(name, environ=None, meet=True):
    """The path of part `name` (PARTS) of the caller's base directory, made
    and checked by the rule; UsageError (exit 125) with a hint otherwise.
    `meet`: the caller needs the same directory on every call (pods, MPS,
    the memo); else, where the /tmp name is taken and no other can be
    recorded, it gets a fresh directory of its own to remove when done."""
    fd, path = open_part(name, environ, meet)
    os.close(fd)
    return path


def locate(name, environ=None):
    """Where part `name` is (or would be made), without making or changing
    anything: for queries (status) and for naming paths ahead of part()."""
    environ = os.environ if environ is None else environ
    if real_root():
        return os.path.join(ROOT_BASE, name)
    home = runtime_home(environ)
    if home:
        return os.path.join(home, "gpusandbox", name)
    uid = host_uid()
    tmp = f"/tmp/gpusandbox-{uid}"
    try:
        st = os.lstat(tmp)
    except OSError:
        return os.path.join(tmp, name)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        return os.path.join(tmp, name)
    pointer = _pointer_path(environ)
    try:
        with open(pointer, "rb") as f:
            recorded = os.fsdecode(f.read(200).strip())
        if recorded.startswith(f"gpusandbox-{uid}.") and "/" not in recorded:
            return os.path.join("/tmp", recorded, name)
    except (OSError, TypeError):
        pass
    return os.path.join(tmp, name)


def subdir(parent, name, mode=USER_MODE):
    """parent/name (parent: a part, already checked) by the same rule;
    returns its path.  UsageError with a hint when it is not the caller's."""
    pfd = os.open(parent, _DIR)
    try:
        os.close(ensure_dir(pfd, parent, name, mode))
    except Taken as e:
        raise _error(e.path, e.why, f"remove {e.path} and run again" if not e.foreign
                     else HINT_XDG) from None
    finally:
        os.close(pfd)
    return os.path.join(parent, name)


def open_part(name, environ=None, meet=True):
    """(descriptor, path) of part `name` of the caller's base directory."""
    base = open_base(environ, meet)
    try:
        if base.ephemeral:
            # This call's own directory: the part itself.
            fd, base.fd = base.fd, None
            return fd, base.path
        mode = PARTS[name][0 if base.root else 1]
        try:
            return ensure_dir(base.fd, base.path, name, mode), os.path.join(base.path, name)
        except Taken as e:
            raise _error(e.path, e.why, f"remove {e.path} and run again") from None
    finally:
        base.close()
