"""`run IMAGE` where IMAGE is an image reference: find or pull it in the
store, then hand the launch its bundle directory (config.json + rootfs/) as
IMAGE_DIR.  From there the usual plan holds the root by fd; the image's
Env and WorkingDir come from the bundle's config.json (row 3 of the
environment table, the default -w), its Entrypoint/Cmd and User are applied
to the RunSpec here.  A store image is never written: it always runs under
the private overlay (--rw is refused)."""
import os
import sys

from . import ref as refmod
from . import storeread
from .digest import ImageError
from .storeread import StoreReader, default_root


class Stores(list):
    """The own store (None until it exists: a lookup creates nothing), then
    the read-only site store; .root is the own store's path.  Opened for
    reading (storeread.py): the write side (store.py) is imported only when
    something is written."""

    def writable(self):
        """The own store opened for writing, created (0700) when missing."""
        from .store import Store
        if not isinstance(self[0], Store):
            if self[0] is not None:
                self[0].close()
            self[0] = Store(self.root)
        return self[0]


def stores(root=None, environ=None):
    env = os.environ if environ is None else environ
    path = os.path.abspath(root or default_root(env))
    out = Stores([StoreReader(path) if os.path.isdir(path) else None])
    out.root = path
    site = env.get("GPUSANDBOX_SITE_STORE")
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


def obtain(ref, all_stores, platform=None, opts=None, progress=None):
    """(store, digest) of `ref`, pulling a transport reference on a miss."""
    if ref.transport in ("store", "docker"):
        hit = find(ref, all_stores)
        if hit:
            return hit
        if ref.transport == "store":
            raise ImageError(f"image not found: {ref.canonical()}",
                             "no such directory, and no image of that name in the store "
                             f"{all_stores.root}",
                             f"pull it first: gpusandbox pull docker://{ref.canonical()}")
    from .sources import names_for, open_source
    o = dict(opts or {})
    o["platform"] = platform
    src = open_source(ref, o)
    try:
        st = all_stores.writable()
        rec = st.pull(src, names_for(ref), platform=platform,
                      asked=platform is not None, progress=progress)
    finally:
        src.close()
    return st, rec["digest"]


def prepare(spec):
    """Resolve spec.image (an image reference) into a store bundle and apply
    the image config to `spec`."""
    if spec.rootfs_mode == "rw":
        raise ImageError("--rw cannot be used with a store image",
                         "store images are shared and never written",
                         "drop --rw: writes go to a private overlay discarded at exit")
    if refmod.looks_like_transport(spec.image):
        ref = refmod.parse(spec.image)
    else:
        ref = _store_name(spec.image)
    platform = None
    if spec.platform:
        from .manifest import parse_platform
        platform = parse_platform(spec.platform)
    all_stores = stores(spec.store)
    hit = find(ref, all_stores) if ref.transport in ("store", "docker") else None
    if hit is None:
        from .progress import Progress
        # A pull on a miss shows progress on a terminal, and as plain lines
        # for a registry (minutes, in a batch log); a local import stays quiet.
        mode = "tty" if sys.stderr.isatty() else "plain" if ref.transport == "docker" \
            else "none"
        hit = obtain(ref, all_stores, platform, progress=Progress(mode))
    st, dig = hit
    # Held, never closed: rmi and prune leave the image alone while the
    # launcher (and the sandbox it waits for) lives.
    st.hold(dig)
    conf = _run_config(st, dig)
    storeread.check_platform(conf, platform or storeread.host_platform(), platform is not None)
    # The rootfs opened relative to the store's fd (no path is resolved
    # again): the plan takes this fd as the root, and spec.image only shows.
    spec.image_fd = os.open(st.image_dir(dig) + "/rootfs", os.O_PATH | os.O_DIRECTORY
                            | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=st.fd)
    spec.image = st.bundle(dig) + "/rootfs"
    # The plan takes Env and WorkingDir from here rather than parsing the
    # bundle's config.json again (which says the same: both come from conf).
    spec.image_env = (list(conf.env), conf.workdir or "/")
    spec.argv = storeread.command(conf, spec.argv, spec.entrypoint)
    if not spec.argv:
        raise ImageError(f"no command to run in {ref.canonical()}",
                         "the image has no Entrypoint or Cmd",
                         "give one: gpusandbox run IMAGE CMD [ARG...]")
    if conf.user and spec.user is None and not spec.fakeroot and \
            conf.user not in ("0", "root", "0:0", "root:root"):
        _user(spec, conf, spec.image_fd)
    st.touch(dig)


def _run_config(st, dig):
    """The image's config for `run`: its run record (runrec.py's format,
    read by storeread.load: no JSON), or the config blob parsed when the
    record is missing or unreadable (an image pulled before records existed)."""
    try:
        conf = storeread.load(st.read_file(st.image_dir(dig) + "/" + storeread.NAME,
                                           storeread.MAX_FILE + 1))
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


def _store_name(text):
    """A NAME[:TAG] for the store, or the directory error `run DIR` gives:
    the argument may be a mistyped path as well as a name."""
    from ..errors import UsageError
    if os.path.exists(text):
        raise UsageError(f"image is not a directory: {text}", None,
                         "for an archive say which kind: docker-archive:FILE or "
                         "oci-archive:FILE; a squashfs image must be named FILE.sqsh")
    try:
        return refmod.parse(text)
    except ImageError:
        raise UsageError(f"image directory not found: {text}", None,
                         "pass a root filesystem directory, or an image reference such as "
                         "docker://ubuntu:22.04 or oci:DIR") from None


def _user(spec, conf, rootfd):
    """The image's User where the sandbox can represent it: real root in
    the host user namespace (the --user path); elsewhere a note."""
    from . import config as cfgmod
    if os.geteuid() == 0 and spec.userns in ("auto", "host"):
        from ..linux import sys as k
        spec.user = cfgmod.resolve_user(conf, rootfd,
                                        lambda p, lim: k.read_in_root(rootfd, p, lim))
        spec.userns = "host"
        return
    sys.stderr.write(f"gpusandbox: note: the image's User {conf.user[:60]!r} is not applied "
                     "(rootless or in a user namespace); the command runs as you "
                     "(--root for uid 0)\n")
