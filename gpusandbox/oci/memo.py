"""The wrapper's and the filter's memo of GPU edits (docs/hook.md, "The edit memo").

A create through the runtime wrapper or the precreate filter computes the
edits with run's one code path (discover -> select -> inject.build_edits,
configedit.gpu_edits).  That takes most of a create's time, and its result
depends only on its inputs, so it is kept: one file per input set, keyed by

  - the code that computes it (path and identity of each module involved),
  - the driver and dev roots, the container's selection variables,
  - what gpu_edits reads from the image: whether /etc/debian_version is a
    file, what /etc/ld.so.cache is, and the cache's bytes (BLAKE2b),

holding the ContainerEdits and a watch list: every host observation the
result could differ by, with the value seen when it was computed -- the
contents of the driver's /proc files and directories (version, devices,
GPUs, MIG capabilities), the identity (inode, size, times, device numbers)
of every device node, of the driver root's ld.so.cache and the directories
searched for libraries, binaries, firmware, config files and sockets, and of
every host file the edits mount.  A later create uses the entry only when
all of them are unchanged; anything else (a driver upgrade, a GPU or MIG
device added or gone, a new library) is a miss, and the edits are computed
again and stored.  So the memo never changes what a create injects, only
whether discovery runs.

Safety: entries live in a directory of the caller's own, closed to others
(the part "oci-memo" of gpusandbox/rundir.py: real root
/run/gpusandbox/oci-memo; otherwise, rootless podman included, under the
user's runtime directory), checked by owner and mode on every use, as is
each entry; nothing another user could write is read.  The image
is read without following any symlink (a link on the way, or anything
unexpected, means no memo for this create: the full path reads it through
openat2 RESOLVE_IN_ROOT as always).

This module is on the fast path: it imports only what the interpreter has
already loaded (os, marshal) and _blake2 (hashlib's SHA-256 loads OpenSSL:
more than this whole path; _sha256 hashes at a third of blake2b's speed).
"""
import marshal
import os
import stat
import sys
from _blake2 import blake2b

FORMAT = 1
GC_AGE = 24 * 3600
MAX_IMAGE_CACHE = 16 << 20      # gpu.ldcache.MAX_FILE: what read_in_root reads of it
MAX_ENTRY = 64 << 20
MISS = object()
# The modules whose code decides the edits (relative to the package).
_CODE = ("edits.py", "__init__.py", "linux/sys.py", "gpu/discover.py", "gpu/libs.py",
         "gpu/ldcache.py", "gpu/request.py", "gpu/select.py", "gpu/ceiling.py", "gpu/inject.py",
         "oci/configedit.py", "oci/memo.py")
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Unsure(Exception):
    """The image cannot be read here without following a link: no memo."""


# --- the caller's directory (gpusandbox/rundir.py) -------------------------------


# --- observations -----------------------------------------------------------
def _ident(st):
    return (st.st_mode, st.st_ino, st.st_dev, st.st_rdev, st.st_size, st.st_mtime_ns,
            st.st_ctime_ns)


def observe(kind, path):
    """What `path` looks like now, for the watch list: "read" its bytes (a
    small /proc file), "list" its sorted names, "isfile" whether it is a
    regular file, "stat" the identity of the file it leads to (through
    symlinks: a link retargeted at another file shows another inode), "node"
    only its type and inode (a directory whose entries come and go), "owner"
    the name's own type, mode, inode and owner (not following a link).  An
    error (ENOENT) is a value too."""
    try:
        if kind == "stat":
            return _ident(os.stat(path))
        if kind == "node":
            st = os.stat(path)
            return stat.S_IFMT(st.st_mode), st.st_ino, st.st_dev
        if kind == "owner":
            st = os.lstat(path)
            return st.st_mode, st.st_ino, st.st_dev, st.st_uid
        if kind == "isfile":
            return os.path.isfile(path)
        if kind == "list":
            return sorted(os.listdir(path))
        if kind == "read":
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            try:
                data = os.read(fd, 1 << 20)
            finally:
                os.close(fd)
            # Large files (none watched today) are kept as a digest.
            return data if len(data) <= 4096 else blake2b(data, digest_size=32).digest()
    except OSError as e:
        return ("error", e.errno)
    raise ValueError(kind)


def watch_list(host, edits):
    """[(kind, path)] of everything discovery's result (and these edits)
    rest on: discover.discover's inputs, from its own tables."""
    from gpusandbox.gpu import discover as D, libs as L
    root = host.driver_root.rstrip("/")
    out = [("isfile", root + "/proc/devices")]     # discover.proc_root's test
    for p in ("/proc/driver/nvidia/version", "/proc/devices"):
        out.append(("read", host.proc(p)))
    # Not nvidia-caps/mig-minors: discovery reads it only to cross-check the
    # capability files below, which decide the nodes (a mismatch is a
    # reported problem, not a different edit).
    gdir = host.proc("/proc/driver/nvidia/gpus")
    out.append(("list", gdir))
    for name in _names(gdir):
        out.append(("read", os.path.join(gdir, name, "information")))
    # The MIG capability tree, as deep as discovery goes (gpuN/mig/giN/ciN/access).
    stack = [host.proc("/proc/driver/nvidia/capabilities")]
    while stack:
        d = stack.pop()
        out.append(("list", d))
        for n in _names(d):
            p = os.path.join(d, n)
            if n in ("access", "config", "monitor"):
                out.append(("read", p))
            elif os.path.isdir(p) and not os.path.islink(p):
                stack.append(p)
    nodes = [g.node for g in host.gpus] + list(host.control.values())
    for m in host.migs:
        nodes += [m.gi_node, m.ci_node]
    names = ["nvidiactl", "nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools"]
    out += [("stat", n.host_path) for n in nodes]
    out += [("stat", os.path.join(host.dev_root, n)) for n in names]
    out.append(("stat", root + "/etc/ld.so.cache"))
    dirs = L._dirs(host, [lib for lib in host.libs if lib.cached])
    std64, std32 = L._STD_DIRS.get(os.uname().machine, L._STD_DIRS["x86_64"])
    for d in list(dict.fromkeys(dirs + list(std64 + std32))):
        out.append(("stat", f"{root}/{d}"))
        for sub in sorted(set(L.SUBDIRS.values())):
            out.append(("stat", f"{root}/{d}/{sub}"))
    # A name added to or removed from a directory changes the directory's
    # identity; each name there now is watched through its links.
    out += [("stat", f"{root}/{d}") for d in D._BIN_DIRS]
    for name in sorted({b for bins in D.CAP_BINS.values() for b in bins}):
        out += [("stat", f"{root}/{d}/{name}") for d in D._BIN_DIRS
                if os.path.lexists(f"{root}/{d}/{name}")]
    out.append(("stat", f"{root}/lib/firmware/nvidia/{host.version}"))
    for _cap, cpath in D._CONFIGS:
        out += [("stat", root + cpath), ("stat", root + os.path.dirname(cpath))]
    for cpath in ("/var/run/nvidia-persistenced/socket", "/var/run/nvidia-fabricmanager/socket"):
        out.append(("stat", root + cpath))
    # The MPS pipe directory changes with every client: its inode is what
    # counts, and whether it passes discovery's owner and mode check (the
    # name itself, never what a link there leads to).
    out.append(("owner", root + "/tmp/nvidia-mps"))
    if edits is not None:
        out += [("stat", n.host_path) for n in edits.device_nodes]
        # Not what goes under /proc (configedit.apply leaves it out): procfs
        # inode times change when the kernel evicts and remakes them.
        out += [("node" if os.path.isdir(m.host_path) else "stat", m.host_path)
                for m in edits.mounts if not m.path.startswith("/proc/")]
    return list(dict.fromkeys(out))


def _names(d):
    try:
        return sorted(os.listdir(d))
    except OSError:
        return []


def cacheable(select_env):
    """Whether this selection's result rests only on files: a MIG-<uuid>
    item is resolved through NVML (gpu/select.py), and a MIG device made
    again under the same GPU instance ids gets a new UUID that no file here
    shows, so such a selection is never memoised."""
    vis = select_env.get("NVIDIA_VISIBLE_DEVICES") or ""
    return not any(i.strip().upper().startswith("MIG-") and
                   not i.strip().upper().startswith("MIG-GPU-") for i in vis.split(","))


# --- the image's side of the key --------------------------------------------
def _in_root(rootfd, rel, limit):
    """(kind, bytes or None) of rel in the image, never following a link:
    kind "file", "dir", "other" or None (absent).  _Unsure when a component
    is a symlink or the read fails (read_in_root decides then)."""
    fds = []
    try:
        fd = rootfd
        parts = rel.split("/")
        for i, name in enumerate(parts):
            try:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                return None, None
            fds.append(fd)
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                raise _Unsure(rel)
            if i < len(parts) - 1 and not stat.S_ISDIR(mode):
                return None, None
        if stat.S_ISDIR(mode):
            return "dir", None
        if not stat.S_ISREG(mode):
            return "other", None
        rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
                      | os.O_CLOEXEC)
        try:
            chunks, left = [], limit
            while left > 0:
                b = os.read(rfd, min(left, 1 << 20))
                if not b:
                    break
                chunks.append(b)
                left -= len(b)
            return "file", b"".join(chunks)
        finally:
            os.close(rfd)
    except OSError as e:
        raise _Unsure(f"{rel}: {e}") from None
    finally:
        for f in fds:
            os.close(f)


def _code_id():
    out = [_PKG]
    for rel in _CODE:
        st = os.stat(os.path.join(_PKG, rel))
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return out


def key(roots, select_env, rootfd):
    """The hex key of this input set, or None when the image cannot be read
    without following a link."""
    if rootfd is None:
        image = ("no root",)
        data = b""
    else:
        try:
            debian, _ = _in_root(rootfd, "etc/debian_version", 0)
            kind, data = _in_root(rootfd, "etc/ld.so.cache", MAX_IMAGE_CACHE)
        except _Unsure:
            return None
        image = (debian == "file", kind)
    roots = tuple(os.path.abspath(r) if r else r for r in roots)
    h = blake2b(repr((FORMAT, sys.hexversion, os.uname().machine, _code_id(), roots,
                     sorted(select_env.items()), image)).encode(), digest_size=32)
    h.update(data or b"")
    return h.hexdigest()


# --- entries ----------------------------------------------------------------
def directory():
    """The memo directory (made, checked), or None where there is none: a
    memo is only a cache, so a base directory in the way costs a miss."""
    try:
        from gpusandbox import rundir
        return rundir.part("oci-memo")
    except Exception:
        return None


def _ser(edits):
    if edits is None:
        return None
    return ([(n.path, n.host_path, n.major, n.minor, n.permissions) for n in edits.device_nodes],
            [(m.host_path, m.path, tuple(m.options), m.kind,
              tuple(m.ident) if m.ident else None) for m in edits.mounts],
            [(s.path, s.target) for s in edits.symlinks],
            [(f.path, bytes(f.content), f.mode) for f in edits.files],
            [(t.path, t.ro) for t in edits.tmpfs],
            dict(edits.env))


def _deser(data):
    if data is None:
        return None
    from gpusandbox.edits import ContainerEdits, DeviceNode, File, Mount, Symlink, Tmpfs
    nodes, mounts, links, files, tmpfs, env = data
    e = ContainerEdits()
    e.device_nodes = [DeviceNode(*n) for n in nodes]
    e.mounts = [Mount(*m) for m in mounts]
    e.symlinks = [Symlink(*s) for s in links]
    e.files = [File(*f) for f in files]
    e.tmpfs = [Tmpfs(*t) for t in tmpfs]
    e.env = dict(env)
    return e


def lookup(d, k):
    """The ContainerEdits (or None: no GPU) of entry k when every watched
    observation still holds; MISS otherwise."""
    try:
        fd = os.open(os.path.join(d, k), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return MISS
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            return MISS
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        entry = marshal.loads(b"".join(chunks))
        watch, edits = entry["watch"], entry["edits"]
        for kind, path, value in watch:
            if observe(kind, path) != value:
                return MISS
        return _deser(edits)
    except (OSError, ValueError, EOFError, TypeError, KeyError):
        return MISS
    finally:
        os.close(fd)


def store(d, k, host, edits):
    """Write entry k (atomically, mode 0600) and drop entries older than
    GC_AGE."""
    watch = [(kind, path, observe(kind, path)) for kind, path in watch_list(host, edits)]
    data = marshal.dumps({"watch": watch, "edits": _ser(edits)})
    if len(data) > MAX_ENTRY:
        return
    tmp = os.path.join(d, f".tmp-{os.getpid()}-{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(d, k))
    import time
    now = time.time()
    for name in os.listdir(d):
        try:
            if now - os.lstat(os.path.join(d, name)).st_mtime > GC_AGE:
                os.unlink(os.path.join(d, name))
        except OSError:
            pass
