"""The image store: content-addressed blobs, layers unpacked once, images, refs.

  ROOT/blobs/sha256/<hex>            verified blobs (manifests, configs, layers)
  ROOT/layers/<alg>-<diff_id hex>/   one layer unpacked alone (layers.py)
  ROOT/images/<manifest hex>/rootfs  the image: its layers merged by hard links
  ROOT/images/<manifest hex>/image.json, used (mtime = last used)
  ROOT/refs/<escaped name>           {"name", "digest"}: a name -> manifest digest
  ROOT/tmp/                          staging: a blob or an image being built
  ROOT/locks/                        fcntl lock files

Everything is published by rename from tmp/ (same filesystem) after its
content is verified and fsynced, so a reader sees a complete blob or image
or nothing, and never locks.  Writers lock per blob and per image (flock),
so concurrent pulls of one image fetch each blob once and unpack it once.
A staging entry carries its writer's owner token, whose lock file the
writer holds flock'ed for its whole life: an entry whose owner lock can be
taken belongs to a dead writer (SIGKILL, node crash) and is removed by the
next pull or prune, on any node of a shared store.
Every pull holds locks/gc shared; rmi and prune take it exclusively, so
nothing a running pull needs disappears under it.

All paths are relative to the store's directory fd; the store and every
staging directory are 0700, so a setuid file in an image is reachable by
nobody else on the host.  A store its owner opened to others publishes its
entries readable, on a nosuid filesystem only, and its trees sealed (no
owner but root or the publisher, no group/other write: unpack.py).  Reading (run, images, inspect, doctor) is
storeread.py: this module is the write side, imported by a pull (pull.py),
rmi and prune (storegc.py), which call it; it imports none of them."""
import errno
import fcntl
import os
import stat

from . import digest as digestmod
from .digest import ImageError
from .storeread import _DIR, MAX_REF_FILE, StoreReader, default_root, escape  # noqa: F401

# images/<hex>/keep-blobs: the image was pulled with --keep-blobs, so its
# compressed layers stay in blobs/ (pull.py); without it they are removed
# once the image is built.
KEEP = "keep-blobs"

SUBDIRS = ("blobs", "blobs/sha256", "blobs/sha512", "images", "layers", "refs", "tmp",
           "locks")


def bundle_config(conf):
    """The OCI runtime bundle config.json next to rootfs/: the image's Env
    and WorkingDir, which `run` of the bundle reads as row 3 of the
    environment table and the default -w (environ.config_env checks it again)."""
    import json
    proc = {"env": [f"{k}={v}" for k, v in conf.env], "cwd": conf.workdir or "/",
            "args": (conf.entrypoint or []) + (conf.cmd or [])}
    return json.dumps({"ociVersion": "1.0.2", "process": proc,
                       "root": {"path": "rootfs", "readonly": True}}).encode()


class _Writer:
    """A file object that hashes and counts what it is given, so the store
    checks every blob itself whatever source wrote it."""

    def __init__(self, f, desc, progress=None):
        self.f = f
        self.v = digestmod.Verifier(desc["digest"], desc["size"])
        self.progress = progress

    def write(self, data):
        self.v.update(data)
        self.f.write(data)
        if self.progress:
            self.progress("bytes", len(data))
        return len(data)

    # A source may restart a cut-off download from the start (the registry
    # client does when a server cannot resume): seek(0) + truncate().
    def seekable(self):
        return True

    def tell(self):
        return self.f.tell()

    def seek(self, pos, whence=0):
        if (pos, whence) != (0, 0):
            raise OSError(errno.ESPIPE, "a blob is restarted only from its start")
        self.f.seek(0)
        self.v = digestmod.Verifier(self.v.digest, self.v.size)
        return 0

    def truncate(self, size=None):
        return self.f.truncate(size)

    def prefix(self):
        """A verifier that has seen what the file already holds (a resumed
        partial download, partial.py): the source goes on from there."""
        v = digestmod.Verifier(self.v.digest, self.v.size)
        v.seen, v._h = self.v.seen, self.v._h.copy()
        return v

    def flush(self):
        self.f.flush()


def _mkdir_p(path, mode=0o700):
    try:
        os.makedirs(path, mode=mode, exist_ok=True)
    except OSError as e:
        raise ImageError(f"cannot create the image store {path}", e.strerror,
                         "set GPUSANDBOX_STORE or --store to a writable directory") from None


def rmtree_at(dirfd, name):
    """Remove `name` under `dirfd` and everything below it, never following
    a symlink; directories an image made read-only are chmod'ed first."""
    stack = []
    try:
        os.unlink(name, dir_fd=dirfd)
        return
    except FileNotFoundError:
        return
    except (IsADirectoryError, PermissionError):
        pass
    except OSError as e:
        if e.errno != errno.EISDIR:
            raise
    fd = os.open(name, _DIR, dir_fd=dirfd)
    stack.append((dirfd, name, fd))
    while stack:
        pfd, pname, fd = stack[-1]
        try:
            os.fchmod(fd, 0o700)
        except OSError:
            pass
        descended = False
        for entry in os.listdir(fd):
            try:
                os.unlink(entry, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno not in (errno.EISDIR, errno.EPERM):
                    raise
                stack.append((fd, entry, os.open(entry, _DIR, dir_fd=fd)))
                descended = True
                break
        if descended:
            continue
        stack.pop()
        os.close(fd)
        os.rmdir(pname, dir_fd=pfd)


def keeps_blobs(st, dig):
    """Whether image `dig` of store `st` (a reader too) keeps its compressed layers."""
    try:
        return stat.S_ISREG(os.stat(st.image_dir(dig) + "/" + KEEP, dir_fd=st.fd,
                                    follow_symlinks=False).st_mode)
    except OSError:
        return False


def writable(all_stores):
    """The own store of `all_stores` (storeread.stores) opened for writing,
    created (0700) when missing; kept in all_stores[0] for later calls."""
    if not isinstance(all_stores[0], Store):
        if all_stores[0] is not None:
            all_stores[0].close()
        all_stores[0] = Store(all_stores.root)
    return all_stores[0]


class Store(StoreReader):
    """The store opened for writing (created 0700 when missing): the read
    path (storeread.py) plus blobs, images and refs published from tmp/."""

    def __init__(self, root, readonly=False):
        if not readonly:
            _mkdir_p(os.path.abspath(root))
        super().__init__(root, readonly)
        if not readonly:
            for d in SUBDIRS:
                try:
                    os.mkdir(d, 0o755 if self.shared and d not in ("tmp", "locks") else 0o700,
                             dir_fd=self.fd)
                except FileExistsError:
                    pass
        self.host = "".join(c if c.isalnum() or c in ".-" else "-"
                            for c in os.uname().nodename[:64])
        self._own = None
        self._n = 0
        self._fetched = []
        self._unpacked = []

    def _publish_mode(self, fd, is_dir):
        if self.shared:
            os.fchmod(fd, 0o755 if is_dir else 0o644)

    def _write_new(self, dirfd, name, data):
        """A new file `name` (O_EXCL) in dirfd holding `data`, in the mode
        of published files, synced to disk."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600,
                     dir_fd=dirfd)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            self._publish_mode(fd, False)
            f.flush()
            os.fsync(fd)

    # -- locks and staging ------------------------------------------------

    def lock(self, name, shared=False):
        fd = os.open(f"locks/{name}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600, dir_fd=self.fd)
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        return fd

    def _owner(self):
        """This process's owner token, with locks/owner-<token> held locked
        for its life: a staging entry is named with the token of its writer,
        and its writer is alive exactly while that lock is held (process
        death releases it, on any node of a shared store)."""
        if self._own is None or self._own[0] != os.getpid():
            token = f"{os.getpid()}-{os.urandom(4).hex()}-{self.host}"
            fd = os.open(f"locks/owner-{token}", os.O_RDWR | os.O_CREAT | os.O_EXCL
                         | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600, dir_fd=self.fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._own = (os.getpid(), token, fd)
        return self._own[1]

    def release_owner(self):
        """Drop this process's owner file once none of its staging entries
        remains (each was renamed into place or removed)."""
        if self._own is not None and self._own[0] == os.getpid():
            try:
                os.unlink(f"locks/owner-{self._own[1]}", dir_fd=self.fd)
            except OSError:
                pass
            os.close(self._own[2])
            self._own = None

    def _staging_name(self, kind):
        self._n += 1
        return f"tmp/{kind}_{self._owner()}_{self._n}"

    def _owner_alive(self, token, dead):
        if token in dead:
            return False
        try:
            fd = os.open(f"locks/owner-{token}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=self.fd)
        except FileNotFoundError:
            dead[token] = None
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return True
        dead[token] = fd                 # held until its entries are gone
        return False

    def clean_staging(self, partials=False):
        """Remove staging entries whose writer is gone, and its owner file;
        partial downloads (partial.py) only when `partials` (prune)."""
        tfd = os.open("tmp", _DIR, dir_fd=self.fd)
        dead = {}
        try:
            for name in os.listdir(tfd):
                if name.startswith("partial-") and not partials:
                    continue
                kind, _, rest = name.partition("_")
                token = rest.rpartition("_")[0]
                if not token or not self._owner_alive(token, dead):
                    rmtree_at(tfd, name)
        finally:
            os.close(tfd)
            for token, fd in dead.items():
                if fd is not None:
                    try:
                        os.unlink(f"locks/owner-{token}", dir_fd=self.fd)
                    except OSError:
                        pass
                    os.close(fd)

    # -- blobs ------------------------------------------------------------

    def ensure_blob(self, source, desc, progress=None, unneeded=None):
        """The blob in the store, fetched from `source` at most once across
        concurrent pulls; returns True when this call fetched it.
        `unneeded()`, checked under the blob's lock, says the blob is no
        longer wanted (its layer was unpacked, and the blob removed, by a
        concurrent pull meanwhile: pull.drop_layer_blobs)."""
        path = self.blob_path(desc["digest"])
        if self.has_blob(desc):
            return False
        lk = self.lock("blob-" + path.rpartition("/")[2])
        try:
            if self.has_blob(desc) or unneeded is not None and unneeded():
                return False
            if getattr(source, "resumable", False):
                from . import partial
                partial.fetch(self, source, desc, _Writer, progress)
                self._fetched.append(desc["digest"])
                if progress:
                    progress("blob", desc)
                return True
            tmp = self._staging_name("blob")
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600,
                         dir_fd=self.fd)
            try:
                with os.fdopen(os.dup(fd), "wb") as f:
                    w = _Writer(f, desc, progress)
                    source.blob(desc, w)
                    w.v.check()
                    self._publish_mode(f.fileno(), False)
                    f.flush()
                    os.fsync(f.fileno())
                os.rename(tmp, path, src_dir_fd=self.fd, dst_dir_fd=self.fd)
                self._fetched.append(desc["digest"])
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=self.fd)
                except OSError:
                    pass
                raise
            finally:
                os.close(fd)
            if progress:
                progress("blob", desc)
            return True
        finally:
            os.close(lk)

    def put_bytes(self, dig, raw):
        class _Bytes:
            def blob(self, desc, out):
                out.write(raw)
        self.ensure_blob(_Bytes(), {"digest": dig, "size": len(raw)})

    # -- images -----------------------------------------------------------

    def keeps_blobs(self, dig):
        return keeps_blobs(self, dig)

    def try_exclusive(self, dig):
        """The image's `used` file locked exclusively, or None when a sandbox
        holds it (in use); -1 when there is no such file."""
        try:
            fd = os.open(self.image_dir(dig) + "/used", os.O_RDONLY | os.O_NOFOLLOW
                         | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return -1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    # -- refs -------------------------------------------------------------

    def set_ref(self, name, dig):
        digestmod.validate(dig)
        if not isinstance(name, str) or not name or "\0" in name or len(name) > 4096:
            raise ImageError(f"invalid image name {str(name)[:60]!r}", None)
        import json
        data = json.dumps({"name": name, "digest": dig}).encode()
        tmp = self._staging_name("ref")
        self._write_new(self.fd, tmp, data)
        os.rename(tmp, "refs/" + escape(name), src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def remove_ref(self, name):
        try:
            os.unlink("refs/" + escape(name), dir_fd=self.fd)
            return True
        except FileNotFoundError:
            return False

    # -- removal (storegc.py decides what goes) ----------------------------

    def unpublish(self, rel):
        """Rename a published directory (images/<hex>, layers/<id>) into
        tmp/, where no reader looks, then delete it; False when there was none."""
        tmp = self._staging_name("rm")
        try:
            os.rename(rel, tmp, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except FileNotFoundError:
            return False
        rmtree_at(self.fd, tmp)
        return True
