"""What the store holds on disk, for `images` (SHARED and UNIQUE per image)
and `images --df` (a summary per kind, as `docker system df`).

Every number is disk use (st_blocks), each inode once:
  - a layer (layers/<id>/): its diff as layers.py recorded it when it
    unpacked it (layers/<id>/usage; walked here for a layer an older
    gpusandbox unpacked), plus its small files;
  - an image's own part (images/<hex>/): its rootfs's directories (its
    files are the layers' inodes, made by hard links) as the pull recorded
    it (image.json "disk"; walked for an older image), plus its small files;
  - a blob (blobs/): a manifest, a config, a compressed layer kept with
    `pull --keep-blobs`, or one no image needs (prune removes it);
  - staging (tmp/): partial downloads and what killed pulls left.

An image's UNIQUE bytes are what `rmi` of it alone frees: its own part,
the layers and blobs no other image of the store lists.  SHARED are the
layers and blobs it lists that another image lists too.  Read-only: the
store may be another user's (a site store); what it says about sizes is
only shown, never trusted for anything else."""
import fcntl
import os
import stat

from . import ImageError
from .layers import USAGE, layer_dir
from .sizes import tree_usage
from .store import KEEP, keeps_blobs
from .storegc import needed_blobs

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# images/<hex>/ and layers/<id>/ files besides the trees.
_IMAGE_FILES = ("image.json", "config.json", "run.rec", "used", "sealed", KEEP)
_LAYER_FILES = ("implied", "sealed", USAGE)


def _blocks(st, rel):
    try:
        return os.stat(rel, dir_fd=st.fd, follow_symlinks=False).st_blocks * 512
    except OSError:
        return 0


def _files(st, rel, names):
    return _blocks(st, rel) + sum(_blocks(st, f"{rel}/{n}") for n in names)


def layer_bytes(st, name):
    """Disk bytes of layers/<name>."""
    rel = "layers/" + name
    try:
        data = st.read_file(rel + "/" + USAGE, 64).split()
        diff = int(data[1]) if len(data) == 2 and data[1].isdigit() else None
    except OSError:
        diff = None
    if diff is None:
        diff = tree_usage(st.fd, rel + "/diff")[1]
    return diff + _files(st, rel, _LAYER_FILES)


def image_own_bytes(st, dig, rec):
    """Disk bytes of images/<hex> that are the image's alone (not its layers')."""
    rel = st.image_dir(dig)
    own = rec.get("disk")
    if not isinstance(own, int) or own < 0:
        own = tree_usage(st.fd, rel + "/rootfs")[2]
    return own + _files(st, rel, _IMAGE_FILES)


def _listdir(st, rel):
    try:
        fd = os.open(rel, _DIR, dir_fd=st.fd)
    except OSError:
        return []
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def _blobs(st):
    """{digest: disk bytes} of every blob."""
    out = {}
    for alg in ("sha256", "sha512"):
        for h in _listdir(st, f"blobs/{alg}"):
            out[f"{alg}:{h}"] = _blocks(st, f"blobs/{alg}/{h}")
    return out


class Usage:
    """The disk use of one store: .images {digest: (shared, unique)} and
    .df [(kind, total, size, reclaimable)]."""

    def __init__(self, st):
        self.store = st.root
        recs = {d: st.image_record(d) or {} for d in st.image_digests()}
        named = {d for _, d in st.refs()}
        layers = {n: layer_bytes(st, n) for n in _listdir(st, "layers")}
        blobs = _blobs(st)
        own, users = {}, {}
        for d, rec in recs.items():
            own[d] = image_own_bytes(st, d, rec)
            mine = set()
            for diff_id in rec.get("diff_ids") or ():
                try:
                    mine.add(("layer", layer_dir(diff_id).rpartition("/")[2]))
                except ImageError:       # a damaged record: shown without it
                    continue
            mine.update(("blob", b) for b in (d, rec.get("config")) if b in blobs)
            if keeps_blobs(st, d):
                mine.update(("blob", b) for b in rec.get("layers") or () if b in blobs)
            for item in mine:
                users.setdefault(item, set()).add(d)

        def size(item):
            return (layers if item[0] == "layer" else blobs).get(item[1], 0)
        self.images = {}
        for d in recs:
            mine = [item for item, who in users.items() if d in who]
            shared = sum(size(i) for i in mine if len(users[i]) > 1)
            self.images[d] = (shared, own[d] + sum(size(i) for i in mine if len(users[i]) == 1))
        # What prune removes: the images no name holds (those a sandbox
        # runs excepted, which this cannot see), then what no image lists.
        unnamed = {d for d in recs if d not in named}
        freed_by_unnamed = sum(own[d] for d in unnamed) + sum(
            size(i) for i, who in users.items() if who <= unnamed)
        used_layers = {i[1] for i in users if i[0] == "layer"}
        needed = needed_blobs(st)
        img_size = sum(own.values()) + sum(layers[n] for n in used_layers if n in layers) + \
            sum(size(i) for i in users if i[0] == "blob")
        orphans = [n for n in layers if n not in used_layers]
        spare = [b for b in blobs if b not in needed]
        staging = {n: tree_usage(st.fd, "tmp/" + n)[1] if _isdir(st, "tmp/" + n)
                   else _blocks(st, "tmp/" + n) for n in _listdir(st, "tmp")}
        stage_size = sum(staging.values())
        stage_free = sum(b for n, b in staging.items() if _stale(st, n))
        self.df = [
            ("Images", len(recs), img_size, freed_by_unnamed),
            ("Unused layers", len(orphans), sum(layers[n] for n in orphans),
             sum(layers[n] for n in orphans)),
            ("Unused blobs", len(spare), sum(blobs[b] for b in spare),
             sum(blobs[b] for b in spare)),
            ("Staging", len(staging), stage_size, stage_free),
        ]


def _isdir(st, rel):
    try:
        return stat.S_ISDIR(os.stat(rel, dir_fd=st.fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _stale(st, name):
    """Whether prune removes staging entry tmp/<name>: a partial download,
    or an entry whose writer is gone (its owner lock is free: taken and
    let go at once, as store.clean_staging tests it)."""
    if name.startswith("partial-"):
        return True
    token = name.partition("_")[2].rpartition("_")[0]
    if not token:
        return True
    try:
        fd = os.open(f"locks/owner-{token}", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC,
                     dir_fd=st.fd)
    except FileNotFoundError:
        return True
    except OSError:
        return False            # another user's store: not ours to say
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
