"""`run IMAGE` where IMAGE is an image reference, beyond a store hit: the
pull on a miss (obtain) and the image's User (apply_user).  The lookup of a
cached image and the application of its config (prepare) are in
storeread.py, the only image module a cached `run` loads; they are
re-exported here under their names (doctor, the image CLI)."""
import os
import sys

from . import ImageError, store_name as _store_name  # noqa: F401
from .storeread import Stores, find, prepare, stores  # noqa: F401
from .storeread import run_config as _run_config  # noqa: F401


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
    sys.stderr.write(f"gpusandbox: note: the image's User {conf.user[:60]!r} is not applied "
                     "(rootless or in a user namespace); the command runs as you "
                     "(--root for uid 0)\n")
