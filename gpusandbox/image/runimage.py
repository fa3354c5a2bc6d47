"""`run IMAGE` of an image reference the store lacks: the pull on a miss.

A cached image is found and its config applied by storeread.prepare, the
only image module a cached `run` loads; on a miss it changes nothing and
returns False, and the launcher calls prepare() here, which is the same
lookup with obtain() as the pull.  This module sits above the store's
read path, the writer (store.py, pull.py) and the sources; none of them
imports it.  The read path's names doctor and the image CLI use are
re-exported here."""
import sys

from . import store_name as _store_name  # noqa: F401
from . import storeread
from .storeread import (Stores, apply_user, find, note_user, resolve_user,  # noqa: F401
                        stores)
from .storeread import run_config as _run_config  # noqa: F401


def prepare(spec):
    """storeread.prepare, pulling the image on a miss: with progress on a
    terminal, and as plain lines for a registry (minutes, in a batch log);
    a local import stays quiet."""
    def pull_it(ref, all_stores, platform):
        from .progress import Progress
        mode = "tty" if sys.stderr.isatty() else "plain" if ref.transport == "docker" \
            else "none"
        return obtain(ref, all_stores, platform, progress=Progress(mode))
    return storeread.prepare(spec, pull_it)


def obtain(ref, all_stores, platform=None, opts=None, progress=None):
    """(store, digest) of `ref` (a transport reference storeread.find did not
    find) pulled into the own store."""
    from .pull import pull
    from .sources import names_for, open_source
    from .store import writable
    o = dict(opts or {})
    o["platform"] = platform
    o.setdefault("say", lambda line: sys.stderr.write(f"gpusandbox: {line}\n"))
    src = open_source(ref, o)
    try:
        st = writable(all_stores)
        rec = pull(st, src, names_for(ref), platform=platform,
                   asked=platform is not None, progress=progress)
    finally:
        src.close()
    if getattr(src, "note", None) and src.note():
        o["say"](src.note())
    return st, rec["digest"]
