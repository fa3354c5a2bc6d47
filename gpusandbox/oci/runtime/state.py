"""The runtime's state directory: ROOT/ID/{state.json, state.fast, exec.fifo}.

ROOT is --root's DIR, else rundir.oci_root(): /run/gpusandbox-oci for real
root, else $XDG_RUNTIME_DIR/gpusandbox-oci or
/run/user/<host uid>/gpusandbox-oci, the first whose runtime directory
passes rundir's rule (<host uid> is the caller's uid outside every user
namespace: rootless podman runs the runtime as uid 0 of its own).

Every command checks the whole chain before it trusts a byte of it, by
descriptor, without following a link (docs/oci.md, "The state root"): ROOT
by rundir's rule (open_root; a place another user can rename in is
refused, whether it is the default or --root's), ROOT/ID the caller's with
no access for others, state.json a regular file of the caller's that no
one else can write.  A state that passes can have been written by no one
but the caller (or root) since `create` wrote it: the hooks `delete` runs
from it, the pid `kill` signals and the namespaces `exec` joins are the
caller's own.  bin/gpusandbox-oci makes the same checks or hands over.

The container's init is named by its pid and its start time (field 22 of
/proc/PID/stat): a recycled pid never passes for the container.
"""
import os

from ...errors import SandboxError
from ...linux import procstat
from .. import fastjson as json

# Removed first on delete: the shell entry answers from it, else falls back.
FILES = ("state.fast", "exec.fifo", "state.json")
# A container id: a letter or digit, then these, at most ID_MAX of them
# (check_id; bin/gpusandbox-oci repeats the rule, tests/unit/test_sh_tables.py
# holds the two together, as it does FILES and FAST_MAGIC).
ID_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
ID_CHARS = ID_FIRST | frozenset("_.+-")
ID_MAX = 1024
# state.fast's first line (_fast): another layout gets another number.
FAST_MAGIC = "gsbx-state-fast 1"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_STATE = 16 << 20        # a config is at most 4 MiB; its state, hooks included, less
HINT_OWN = ("use a state root of your own: --root DIR, or XDG_RUNTIME_DIR set to a directory "
            "of yours (mode 0700)")


class NotFound(SandboxError):
    pass


class Root(str):
    """The state root's path, and whether --root gave it (rundir's rule
    for a given root is not the default's)."""

    def __new__(cls, path, given=True):
        self = super().__new__(cls, path)
        self.given = given
        return self


def _refused(root, e):
    """The SandboxError for rundir.Taken `e`, met on the way to `root`."""
    where = root if e.path == root else f"{root} ({e.path})"
    # One of the caller's that others could write to may hold what they put
    # there: removed, not repaired (rundir's rule).
    hint = HINT_OWN if e.foreign else f"remove {e.path} and run again"
    return SandboxError(f"state root {where}", e.why, hint)


def _open_root(path, given, make=False):
    from ... import rundir
    try:
        return rundir.open_oci_root(path, given, make)
    except rundir.Taken as e:
        raise _refused(path, e) from None
    except OSError as e:
        raise SandboxError(f"state root {path}", e.strerror or str(e)) from None


def open_root(given=None, make=False, environ=None):
    """(Root, descriptor) of the state root, checked by rundir's rule; the
    descriptor is None when the root does not exist and `make` is false.
    SandboxError (one line and a hint) when the rule refuses it."""
    if given is not None:
        path = given if given.startswith("/") else os.path.join(os.getcwd(), given)
    else:
        from ... import rundir
        environ = os.environ if environ is None else environ
        path = rundir.oci_root(environ)
        if path is None:
            raise _no_home(environ)
    return Root(path, given is not None), _open_root(path, given is not None, make)


def _no_home(environ):
    """Why an unprivileged caller has no default state root."""
    from ... import rundir
    from ...linux.host import host_uid
    uid = host_uid()
    why = []
    for name, cand in (("$XDG_RUNTIME_DIR ", environ.get("XDG_RUNTIME_DIR") or ""),
                       ("", f"/run/user/{uid}")):
        if not cand:
            continue
        try:
            os.close(rundir.trusted_dir(cand))
        except rundir.Taken as e:
            why.append(f"{name}{e.path}: {e.why}")
        except OSError as e:
            why.append(f"{name}{cand}: {e.strerror}")
    return SandboxError(f"no state directory for uid {uid}", "; ".join(why) or None,
                        "pass --root DIR, or set XDG_RUNTIME_DIR to a directory of yours "
                        "(mode 0700)")


def check_id(cid):
    if not cid or len(cid) > ID_MAX or cid[0] not in ID_FIRST or not set(cid) <= ID_CHARS:
        raise SandboxError(f"invalid container id {cid!r}", None,
                           "ids are letters, digits and _ . + - (not starting with one of those)")
    return cid


def container_dir(root, cid):
    return os.path.join(root, check_id(cid))


def open_container(root, cid):
    """A descriptor of ROOT/ID, the chain from / checked again (rundir's
    rule for ROOT, then ROOT/ID the caller's, no access for others, not a
    link).  NotFound when either is missing; SandboxError when refused."""
    d = container_dir(root, cid)
    rfd = _open_root(root, getattr(root, "given", True))
    if rfd is None:
        raise NotFound(f"container \"{cid}\" does not exist")
    try:
        fd = os.open(cid, _DIR, dir_fd=rfd)
    except FileNotFoundError:
        raise NotFound(f"container \"{cid}\" does not exist") from None
    except OSError:
        raise SandboxError(f"state directory {d}", "a symbolic link or not a directory",
                           f"remove {d}") from None
    finally:
        os.close(rfd)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise SandboxError(f"state directory {d}",
                               f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()})",
                               HINT_OWN)
        if st.st_mode & 0o077:
            raise SandboxError(f"state directory {d}",
                               f"mode {st.st_mode & 0o7777:04o} lets others in",
                               f"remove {d} (create makes it 0700)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_state(dfd, d):
    """state.json of ROOT/ID (descriptor `dfd`), or None when missing: a
    regular file of the caller's that no one else can write, opened without
    following a link and without blocking (a fifo there is refused, not
    waited on)."""
    from ... import rundir
    path = os.path.join(d, "state.json")
    try:
        return rundir.read_owned(dfd, "state.json", MAX_STATE, closed=True)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SandboxError(f"state file {path}", e.strerror, f"remove {d}") from None
    except rundir.Taken as e:
        raise SandboxError(f"state file {path}", e.why,
                           HINT_OWN if e.foreign else f"remove {d}") from None


def start_time(pid):
    """(start time, state) of `pid` (field 22 of /proc/PID/stat), or None
    when the pid is gone."""
    return procstat.start_time(pid)


def load(root, cid):
    d = container_dir(root, cid)
    dfd = open_container(root, cid)
    try:
        data = _read_state(dfd, d)
    finally:
        os.close(dfd)
    try:
        st = json.loads(data.decode()) if data is not None else None
    except ValueError:
        st = None
    if not isinstance(st, dict):
        raise NotFound(f"container \"{cid}\" does not exist")
    st["_dir"] = d
    return st


def make_container_dir(root, cid):
    """ROOT/ID made (0700) in the state root `root` (a Root), which is made
    by rundir's rule when missing; SandboxError when the root is refused or
    the id is taken."""
    d = container_dir(root, cid)
    rfd = _open_root(root, getattr(root, "given", True), make=True)
    try:
        os.mkdir(cid, 0o700, dir_fd=rfd)
    except FileExistsError:
        raise SandboxError(f"container \"{cid}\" already exists") from None
    except OSError as e:
        raise SandboxError(f"state directory {d}", e.strerror) from None
    finally:
        os.close(rfd)
    return d


def _write(d, name, data):
    # Renamed into place, so a reader sees the old or the new file whole;
    # 0600 and never through a link.  No fsync: the state names live
    # processes, which a crash of the machine (the only thing that loses
    # unsynced data) ends too.
    tmp = os.path.join(d, f".{name}.{os.getpid()}")
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "w") as f:
        f.write(data)
    os.rename(tmp, os.path.join(d, name))


def save(st):
    d = st["_dir"]
    _write(d, "state.json", json.dumps({k: v for k, v in st.items() if not k.startswith("_")}))
    fast = _fast(st)
    if fast is not None:
        _write(d, "state.fast", fast)


_S, _P, _MID = "\x00status\x00", "\x00pid\x00", ', "pid": '


def _fast(st):
    """state.fast, which bin/gpusandbox-oci answers `state` from without
    Python: a magic line, pid, start time and cgroup leaf, then the public
    object as one ASCII JSON line split around its status and pid (the only
    values that change), then `plain` where `start` and `delete` of a
    stopped container are no more than the entry does (no poststart or
    poststop hook, no cgroup or a cgroup2 leaf without v1 leaves), `start`
    where only `start` is (no hook, but a cgroup the entry's one rmdir
    cannot remove: cgroup v1 leaves; or site exit hooks, which `delete`
    runs), else `python`.  None (no file: the
    entry falls back to Python) where a line would not survive the shell's
    `read`."""
    pid, start, leaf = st.get("pid") or 0, st.get("start_time"), st.get("cgroup") or ""
    if not isinstance(pid, int) or pid <= 0 or not isinstance(start, int) \
            or not isinstance(leaf, str) or not leaf.isascii() or "\n" in leaf:
        return None
    obj = public(st)
    obj["status"], obj["pid"] = _S, _P
    text = json.dumps(obj)    # ensure_ascii: no newline, no NUL in the line
    s, p = json.dumps(_S), json.dumps(_P)
    # ociVersion and the checked id precede status: its first match is it.
    i = text.index(s)
    j = i + len(s)
    if text[j:j + len(_MID) + len(p)] != _MID + p:
        return None
    head, tail = text[:i] + '"', text[j + len(_MID) + len(p):]
    hooks = st.get("hooks") or {}
    how = "python"
    if not hooks.get("poststart") and not hooks.get("poststop"):
        how = "plain" if (not leaf or st.get("cgroup_version") == 2) \
            and not st.get("cgroup_v1") and not st.get("site_exit") else "start"
    return f"{FAST_MAGIC}\n{pid}\n{start}\n{leaf}\n{head}\n{tail}\n{how}\n"


def alive(st):
    """Whether the recorded init still runs (and is not a zombie)."""
    pid = st.get("pid") or 0
    got = start_time(pid) if pid > 0 else None
    return got is not None and got[0] == st.get("start_time") and got[1] not in ("Z", "X")


def status(st):
    if not alive(st):
        return "stopped"
    if os.path.exists(os.path.join(st["_dir"], "exec.fifo")):
        return "created"
    if st.get("cgroup") and _frozen(st["cgroup"]):
        return "paused"
    return "running"


def _frozen(leaf):
    try:
        with open(os.path.join(leaf, "cgroup.freeze")) as f:
            return f.read().strip() == "1"
    except OSError:
        return False


def public(st):
    """The OCI state object (runtime-spec runtime.md)."""
    s = status(st)
    return {"ociVersion": "1.0.2", "id": st["id"], "status": s,
            "pid": st["pid"] if s != "stopped" else 0, "bundle": st["bundle"],
            "rootfs": st.get("rootfs", ""), "created": st.get("created", ""),
            "owner": "", "annotations": st.get("annotations") or {}}
