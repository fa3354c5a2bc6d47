"""The image store's read path: what `run`, `images`, `inspect` and
`doctor` of a cached image need, and nothing a pull needs (store.py adds
writing, publishing, locks and staging on top of this class).

  ROOT/images/<manifest hex>/rootfs, config.json, image.json, run.rec, used,
                                     sealed (a shared store's: the package's SEAL)
  ROOT/refs/<escaped name>           {"name", "digest"}: a name -> manifest digest
  ROOT/blobs/<alg>/<hex>             verified blobs

Every read is relative to the store's directory fd, with O_NOFOLLOW on the
last component and a bounded length: a store is data (a site store is
another user's), and what comes out of it is checked again by its caller
(load, validate_digest).  Opening a store creates nothing.

The run record's reader and `run`'s lookup (prepare, apply_user) are here
too: with the package, the only image module a cached `run` loads.  It
imports no image module above it: on a miss prepare returns False and the
launcher calls runimage.prepare, the same lookup with the pull."""
import errno
import os
import stat

from ..linux.sys import read_fd
from . import (MAX_SEAL, SEAL, ImageError, check_platform, command,  # noqa: F401
               host_platform, load_seal, looks_like_transport, parse_digest, parse_ref,
               ref_fast, store_name, validate_digest)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_REF_FILE = 200
_LOCK_SH, _LOCK_NB = 1, 4      # <sys/file.h>, as fcntl.LOCK_SH and LOCK_NB


def default_root(environ=None):
    env = os.environ if environ is None else environ
    from ..settings import get
    own = get("store", environ)
    if own:
        return own
    data = env.get("XDG_DATA_HOME")
    if not data or not data.startswith("/"):
        home = env.get("HOME") or os.path.expanduser("~")
        data = os.path.join(home, ".local", "share")
    return os.path.join(data, "gpusandbox", "store")


def escape(name):
    """A ref name as one file name: '%XX' for anything but [A-Za-z0-9_-]
    (so no '/', '.', '..' or NUL can reach the file system), hashed when long."""
    out = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else
                  "".join(f"%{b:02X}" for b in c.encode()) for c in name)
    if len(out) > MAX_REF_FILE:
        import hashlib
        out = "h-" + hashlib.sha256(name.encode()).hexdigest()
    return out


class StoreReader:
    """A store opened for reading.  The own store (readonly=False) must
    belong to the caller, as for writing; a store other users can read
    must be on a nosuid filesystem (its images keep their setuid files)
    and writable by its owner alone (else anyone could replace its images)."""

    def __init__(self, root, readonly=False):
        self.root = os.path.abspath(root)
        self.readonly = readonly
        try:
            self.fd = os.open(self.root, _DIR)
        except OSError as e:
            raise ImageError(f"cannot open the image store {self.root}", e.strerror,
                             "set GPUSANDBOX_STORE or --store to a directory you own") from None
        st = os.fstat(self.fd)
        self.owner = st.st_uid
        if not readonly:
            if st.st_uid != os.geteuid():
                os.close(self.fd)
                raise ImageError(f"the image store {self.root} belongs to uid {st.st_uid}",
                                 "a store is written only by its owner",
                                 "use your own with --store DIR or GPUSANDBOX_STORE")
            # A store its owner opened to others (a site store being
            # filled) publishes readable entries; else everything is private.
            self.shared = bool(stat.S_IMODE(st.st_mode) & 0o055)
            if self.shared:
                self._check_nosuid()
        else:
            self.shared = True
            if st.st_uid != os.geteuid():
                self._check_nosuid()
        if self.shared and st.st_mode & 0o022:
            os.close(self.fd)
            raise ImageError(f"the image store {self.root} is writable by other users", None,
                             f"its owner makes it writable only by them: chmod go-w {self.root}")

    def close(self):
        os.close(self.fd)

    def _check_nosuid(self):
        """A store other users read must be on a nosuid filesystem: its
        images keep their setuid files (as built), which would otherwise be
        executable with their owner's rights by every host user."""
        if not os.fstatvfs(self.fd).f_flag & os.ST_NOSUID:
            os.close(self.fd)
            raise ImageError(f"the image store {self.root} is shared with other users but its "
                             "filesystem is not mounted nosuid",
                             "setuid files in its images would be usable on the host",
                             "mount it nosuid, or keep the store private (chmod 700)")

    def read_file(self, rel, limit=1 << 20):
        """At most `limit` bytes of a file of the store, read on the raw fd
        (no buffered file object: a cached `run` reads two small files).
        Opened non-blocking and read only when it is a regular file: a FIFO
        or device node put in a store's place never blocks or feeds a read
        (EINVAL, as any other unreadable entry)."""
        fd = os.open(rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=self.fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", rel)
            return read_fd(fd, limit, 1 << 16)
        finally:
            os.close(fd)

    # -- blobs ------------------------------------------------------------

    @staticmethod
    def blob_path(dig):
        alg, hexpart = parse_digest(dig)
        return f"blobs/{alg}/{hexpart}"

    def has_blob(self, desc):
        try:
            st = os.stat(self.blob_path(desc["digest"]), dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == desc["size"]

    def open_blob(self, dig):
        return os.fdopen(os.open(self.blob_path(dig), os.O_RDONLY | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, dir_fd=self.fd), "rb")

    def read_blob(self, dig, limit=None):
        if limit is None:
            from .manifest import MAX_DOC
            limit = MAX_DOC
        with self.open_blob(dig) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ImageError(f"blob {dig} is too large to be a manifest or config", None)
        return data

    # -- images -----------------------------------------------------------

    def image_dir(self, dig):
        return "images/" + parse_digest(dig, "manifest digest")[1]

    def has_image(self, dig):
        try:
            os.stat(self.image_dir(dig) + "/image.json", dir_fd=self.fd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False

    def image_record(self, dig):
        import json
        try:
            return json.loads(self.read_file(self.image_dir(dig) + "/image.json"))
        except (OSError, ValueError):
            return None

    def bundle(self, dig):
        """The image as an OCI bundle directory (config.json + rootfs/)."""
        return f"{self.root}/{self.image_dir(dig)}"

    def touch(self, dig):
        """Last used: the mtime of images/<hex>/used (one utime, no lock)."""
        if self.readonly:
            return
        try:
            os.utime(self.image_dir(dig) + "/used", dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            pass

    def hold(self, dig):
        """A shared flock on images/<hex>/used, held (never closed) for the
        life of the launching process and its sandbox: rmi and prune see the
        image in use.  Never waits: a reader does not queue behind a writer."""
        if self.readonly:
            return None
        # flock(2) through the launch's own libc handle (linux/sys.py, loaded
        # by every launch): the fcntl module would be one more import.
        from ..linux.sys import get_errno, libc
        try:
            fd = os.open(self.image_dir(dig) + "/used", os.O_RDONLY | os.O_NOFOLLOW
                         | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        if libc.flock(fd, _LOCK_SH | _LOCK_NB) == -1:
            err = get_errno()
            os.close(fd)
            if err == errno.EWOULDBLOCK:
                raise ImageError(f"image {dig[:19]} is being removed (gpusandbox rmi or prune)",
                                 None, "pull it again")
            raise OSError(err, f"flock of images/{dig[7:]}/used: {os.strerror(err)}")
        return fd

    def image_digests(self):
        ifd = os.open("images", _DIR, dir_fd=self.fd)
        try:
            names = os.listdir(ifd)
        finally:
            os.close(ifd)
        out = []
        for n in sorted(names):
            dig = "sha256:" + n
            try:
                validate_digest(dig)
            except ImageError:
                continue
            if self.has_image(dig):
                out.append(dig)
        return out

    def sealed(self, dig):
        """The directories of a shared store's image that the sandbox shows
        as the image had them (the package's SEAL); () in a private store.
        Without a seal (an older gpusandbox published it with the image's
        owners and modes) other users may have rewritten it: refused."""
        if not self.shared:
            return ()
        dirs = self._seal(dig)
        if dirs is None:
            raise ImageError(f"image {dig[:19]} in the shared store {self.root} has no seal",
                             "an older gpusandbox published it with the image's own owners "
                             "and modes, so other users may have changed its files",
                             f"its owner (uid {self.owner}) publishes it again: gpusandbox "
                             f"pull --store {self.root} REF, which rebuilds it")
        return dirs

    def unsealed(self, dig):
        return self.shared and self._seal(dig) is None

    def _seal(self, dig):
        try:
            fd = os.open(self.image_dir(dig) + "/" + SEAL, _FILE, dir_fd=self.fd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            # Only the store's owner can make a file of theirs in images/<hex>.
            if not stat.S_ISREG(st.st_mode) or st.st_uid != self.owner:
                return None
            return load_seal(read_fd(fd, MAX_SEAL + 1, 1 << 16))
        finally:
            os.close(fd)

    def last_used(self, dig):
        try:
            return int(os.stat(self.image_dir(dig) + "/used", dir_fd=self.fd,
                               follow_symlinks=False).st_mtime)
        except OSError:
            return None

    # -- refs -------------------------------------------------------------

    def get_ref(self, name):
        try:
            data = self.read_file("refs/" + escape(name), 1 << 16)
        except OSError:
            return None
        rec = ref_fast(data, name)
        if rec is None:
            import json
            try:
                rec = json.loads(data)
            except ValueError:
                return None
        if not isinstance(rec, dict) or rec.get("name") != name:
            return None
        try:
            validate_digest(rec.get("digest"))
        except ImageError:
            return None
        return rec["digest"]

    def refs(self):
        """[(name, digest)] of every ref."""
        import json
        out = []
        rfd = os.open("refs", _DIR, dir_fd=self.fd)
        try:
            names = os.listdir(rfd)
        finally:
            os.close(rfd)
        for fname in sorted(names):
            try:
                rec = json.loads(self.read_file("refs/" + fname, 1 << 16))
                name, dig = rec["name"], validate_digest(rec["digest"])
            except (OSError, ValueError, KeyError, TypeError, ImageError):
                continue
            if escape(name) == fname:
                out.append((name, dig))
        return out


# -- the run record (images/<hex>/run.rec; see runrec.py for the format) --

MAGIC = "gsbx-run-1"
NAME = "run.rec"
MAX_FILE = 8 << 20          # a config is at most 4 MiB (manifest.MAX_DOC)
MAX_ITEMS = 4096            # as config.MAX_ITEMS
MAX_STR = 1 << 16           # as config.MAX_STR


class RunConfig:
    """The fields of an ImageConfig that `run` uses (config.command,
    config.check_platform, config.resolve_user accept it)."""
    __slots__ = ("config", "os", "architecture", "variant", "user", "workdir",
                 "entrypoint", "cmd", "env")

    def platform(self):
        return {"os": self.os, "architecture": self.architecture, "variant": self.variant}


def load(data):
    """A RunConfig of record bytes, or None when they are not exactly a
    record this module writes."""
    if not isinstance(data, bytes) or len(data) > MAX_FILE or not data.endswith(b"\0"):
        return None
    try:
        fields = data[:-1].decode("utf-8").split("\0")
    except UnicodeDecodeError:
        return None
    it = iter(fields)
    try:
        if next(it) != MAGIC:
            return None
        r = RunConfig()
        r.config = validate_digest(next(it))
        r.os, r.architecture, r.variant, r.user, r.workdir = (_opt(it) for _ in range(5))
        r.entrypoint, r.cmd, env = _list(it), _list(it), _list(it)
        if next(it, None) is not None or r.os is None or r.architecture is None \
                or env is None:
            return None
    except (StopIteration, ValueError, ImageError):
        return None
    if r.user is not None and (not r.user or len(r.user) > 256):
        return None
    if r.workdir is not None:
        from ..imageroot import container_path
        if not r.workdir.startswith("/") or container_path(r.workdir) != r.workdir:
            return None
    r.env = []
    for item in env:
        key, eq, val = item.partition("=")
        if not eq or not key or not all(ch.isascii() and (ch.isalnum() or ch == "_")
                                        for ch in key):
            return None
        r.env.append((key, val))
    return r


def _opt(it):
    f = next(it)
    if f == "-":
        return None
    if not f.startswith("=") or len(f) > MAX_STR + 1:
        raise ValueError(f)
    return f[1:]


def _list(it):
    f = next(it)
    if f == "-":
        return None
    if not (f.isascii() and f.isdigit() and len(f) <= 5) or int(f) > MAX_ITEMS:
        raise ValueError(f)
    out = [next(it) for _ in range(int(f))]
    if any(len(x) > MAX_STR for x in out):
        raise ValueError("too long")
    return out


# -- `run IMAGE` of an image reference -------------------------------------

class Stores(list):
    """The own store (None until it exists: a lookup creates nothing), then
    the read-only site store; .root is the own store's path.  Opened for
    reading: store.writable() opens the own one for writing."""


def stores(root=None, environ=None):
    env = os.environ if environ is None else environ
    path = os.path.abspath(root or default_root(env))
    out = Stores([StoreReader(path) if os.path.isdir(path) else None])
    out.root = path
    from ..settings import get
    site = get("site-store", environ)
    if site and os.path.isdir(site):
        out.append(StoreReader(site, readonly=True))
    return out


def find(ref, all_stores):
    """(store, manifest digest) of a store or registry reference, or None."""
    name = ref.canonical()
    for st in all_stores:
        if st is None:
            continue
        dig = st.get_ref(name)
        if dig is None and ref.digest and st.has_image(ref.digest):
            dig = ref.digest
        if dig is not None and st.has_image(dig):
            return st, dig
    return None


def prepare(spec, obtain=None):
    """Resolve spec.image (an image reference) into a store image and apply
    its config to `spec`.  On a miss, `obtain(ref, stores, platform)` pulls
    it (runimage.prepare passes it); without one, False: nothing is changed
    and the caller pulls (so a cached `run` loads no pull code).  A store
    image is never written (--rw is refused)."""
    if spec.rootfs_mode == "rw":
        raise ImageError("--rw cannot be used with a store image",
                         "store images are shared and never written",
                         "drop --rw: writes go to a private overlay discarded at exit")
    ref = parse_ref(spec.image) if looks_like_transport(spec.image) else store_name(spec.image)
    platform = None
    if spec.platform:
        from .manifest import parse_platform
        platform = parse_platform(spec.platform)
    all_stores = stores(spec.store)
    hit = find(ref, all_stores) if ref.transport in ("store", "docker") else None
    if hit is None and ref.transport == "store":
        raise ImageError(f"image not found: {ref.canonical()}",
                         "no such directory, and no image of that name in the store "
                         f"{all_stores.root}",
                         f"pull it first: gpusandbox pull docker://{ref.canonical()}")
    if hit is None:
        if obtain is None:
            for st in all_stores:
                if st is not None:
                    st.close()
            return False
        hit = obtain(ref, all_stores, platform)
    st, dig = hit
    # Held, never closed: rmi and prune leave the image alone while the
    # launcher (and the sandbox it waits for) lives.
    st.hold(dig)
    spec.image_dirs = st.sealed(dig)
    conf = run_config(st, dig)
    check_platform(conf, platform or host_platform(), platform is not None)
    # The rootfs opened relative to the store's fd (no path is resolved
    # again): the plan takes this fd as the root, and spec.image only shows.
    spec.image_fd = os.open(st.image_dir(dig) + "/rootfs", os.O_PATH | os.O_DIRECTORY
                            | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=st.fd)
    spec.image = st.bundle(dig) + "/rootfs"
    # The plan takes Env and WorkingDir from here rather than parsing the
    # bundle's config.json again (which says the same: both come from conf).
    if apply_config(spec, conf, ref.canonical(), "IMAGE"):
        apply_user(spec, conf, spec.image_fd)
    st.touch(dig)
    return True


def apply_config(spec, conf, image, usage):
    """Env, WorkingDir and Entrypoint/Cmd of `conf` applied to spec, a run
    with no command refused; True when its (non-root) User is still to be
    applied: neither --user nor --fakeroot was given."""
    spec.image_env = (list(conf.env), conf.workdir or "/")
    spec.argv = command(conf, spec.argv, spec.entrypoint)
    if not spec.argv:
        raise ImageError(f"no command to run in {image}", "the image has no Entrypoint or "
                         "Cmd", f"give one: gpusandbox run {usage} CMD [ARG...]")
    return bool(conf.user) and spec.user is None and not spec.fakeroot and \
        conf.user not in ("0", "root", "0:0", "root:root")


def run_config(st, dig):
    """The image's config for `run`: its run record (read by load: no
    JSON), or the config blob parsed when the record is missing or
    unreadable (an image pulled before records existed)."""
    try:
        conf = load(st.read_file(st.image_dir(dig) + "/" + NAME, MAX_FILE + 1))
    except OSError:
        conf = None
    if conf is not None:
        return conf
    rec = st.image_record(dig)
    if not rec:
        raise ImageError(f"image {dig} in {st.root} has no readable record", None,
                         "remove it with 'gpusandbox rmi' and pull it again")
    from .config import parse
    return parse(st.read_blob(rec["config"]))



def apply_user(spec, conf, rootfd):
    """The image's User where the sandbox can represent it: real root in
    the host user namespace (the --user path); elsewhere a note."""
    if os.geteuid() == 0 and spec.userns in ("auto", "host"):
        spec.user = resolve_user(conf, rootfd)
        spec.user_by_image = True
        spec.userns = "host"
        return
    note_user(conf)


def resolve_user(conf, rootfd):
    """The image's User as uid, gid and groups, looked up in the image's
    /etc/passwd and /etc/group, read inside the root `rootfd`."""
    from ..linux import sys as k
    from . import config as cfgmod
    return cfgmod.resolve_user(conf, rootfd, lambda p, lim: k.read_in_root(rootfd, p, lim))


def note_user(conf):
    import sys
    sys.stderr.write(f"gpusandbox: note: the image's User {conf.user[:60]!r} is not applied "
                     "(rootless or in a user namespace); the command runs as you "
                     "(--root for uid 0)\n")
