"""What `images` and `inspect` print: a table and key: value lines for
people, docker's shapes in JSON for tools.

Image strings (names, config values) are untrusted: the text forms pass
them through printable(), the JSON forms through json.dumps (which escapes
every control character)."""
import json
import shlex
import time

from . import config as cfgmod
from . import manifest as mf
from .sizes import human
from ..errors import printable


def _when(epoch):
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch)) if epoch else "-"


def _names(st):
    """{manifest digest: [names]} of the store's refs."""
    out = {}
    for n, d in st.refs():
        out.setdefault(d, []).append(n)
    return out


def image_rows(st):
    """One row per name (an image without one: <none>), raw numbers:
    `size` is the compressed layers' bytes, `unpacked_size` the tree's
    (None for an image an older gpusandbox pulled), `shared_size` and
    `unique_size` its disk use (usage.py)."""
    from .usage import Usage
    names = _names(st)
    disk = Usage(st).images
    for d in st.image_digests():
        rec = st.image_record(d) or {}
        shared, unique = disk.get(d, (None, None))
        for n in names.get(d) or ["<none>"]:
            yield {"reference": n, "digest": d, "size": rec.get("size"),
                   "unpacked_size": rec.get("unpacked"),
                   "shared_size": shared, "unique_size": unique,
                   "created": rec.get("created"), "last_used": st.last_used(d),
                   "platform": rec.get("platform"), "store": st.root}


def table(header, rows):
    """Left-aligned columns two spaces apart, as docker's tabwriter."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    out = []
    for r in [header, *rows]:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")
    return "".join(out)


def images_text(rows):
    header = ("REFERENCE", "DIGEST", "CREATED", "SIZE", "SHARED", "UNIQUE", "LAST USED")
    cells = [(printable(r["reference"]), r["digest"][:19],
              printable((r["created"] or "-")[:16].replace("T", " ")),
              human(r["unpacked_size"]), human(r["shared_size"]), human(r["unique_size"]),
              _when(r["last_used"]))
             for r in rows]
    return table(header, cells)


def df_doc(st):
    """`images --df --json`: the store's disk use per kind, raw bytes."""
    from .usage import Usage
    u = Usage(st)
    return {"store": st.root, "rows": [
        {"type": kind, "total": n, "size": size, "reclaimable": free}
        for kind, n, size, free in u.df]}


def df_text(docs):
    """`images --df`: docker's `system df` table, one per store."""
    out = []
    for doc in docs:
        rows = doc["rows"]
        cells = [(r["type"], str(r["total"]), human(r["size"]), _share(r["reclaimable"],
                                                                       r["size"]))
                 for r in rows]
        size = sum(r["size"] for r in rows)
        cells.append(("Total", "", human(size), _share(sum(r["reclaimable"] for r in rows),
                                                        size)))
        out.append(f"Store {printable(doc['store'])}\n" +
                   table(("TYPE", "TOTAL", "SIZE", "RECLAIMABLE"), cells))
    return "\n".join(out)


def _share(part, whole):
    return f"{human(part)} ({100 * part // whole if whole else 0}%)"


def _extra_config(raw):
    """The config fields docker shows that run does not use, when they have
    docker's types (anything else is left out, never trusted)."""
    try:
        doc = json.loads(raw)
        cfg = doc.get("config") or {}
    except (ValueError, AttributeError):
        return {}, None
    if not isinstance(cfg, dict):
        return {}, None
    out = {}
    for key, kind in (("ExposedPorts", dict), ("Volumes", dict), ("StopSignal", str)):
        if isinstance(cfg.get(key), kind):
            out[key] = cfg[key]
    author = doc.get("author") if isinstance(doc, dict) else None
    return out, author if isinstance(author, str) else None


def _repo(name):
    """docker.io/library/ubuntu of docker.io/library/ubuntu:22.04 (a tag's
    colon comes after the last slash; a registry port's does not)."""
    head, _, last = name.rpartition("/")
    return (head + "/" if head else "") + last.partition(":")[0].partition("@")[0]


def inspect_doc(st, d):
    """docker's `image inspect` object for image `d` of store `st`, plus
    podman's Digest and what only this store knows under GpuSandbox."""
    rec = st.image_record(d) or {}
    raw = st.read_blob(rec["config"])
    conf = cfgmod.parse(raw)
    extra, author = _extra_config(raw)
    names = sorted(_names(st).get(d, []))
    unpacked = rec.get("unpacked")
    if unpacked is None:
        # An image an older gpusandbox pulled has no recorded size: walked once here.
        from .sizes import tree_bytes
        unpacked = tree_bytes(st.fd, st.image_dir(d) + "/rootfs")
    doc = {
        "Id": rec["config"],
        "Digest": d,
        "RepoTags": names,
        "RepoDigests": sorted({f"{_repo(n)}@{d}" for n in names}),
        "Created": conf.created,
        "Author": author or "",
        "Architecture": conf.architecture,
        "Os": conf.os,
        "Config": {"User": conf.user or "", "Env": [f"{k}={v}" for k, v in conf.env],
                   "Entrypoint": conf.entrypoint, "Cmd": conf.cmd,
                   "WorkingDir": conf.workdir or "", "Labels": conf.labels or None, **extra},
        "RootFS": {"Type": "layers", "Layers": list(conf.diff_ids)},
        "Size": unpacked,
        "GpuSandbox": {"Store": st.root, "CompressedSize": rec.get("size"),
                       "LayerBlobs": rec.get("layers") or [],
                       "LastUsed": st.last_used(d)},
    }
    if conf.variant:
        doc["Variant"] = conf.variant
    return doc


def _field(label, values):
    """`Label:` and its values, one a line under each other; '-' for none."""
    values = [printable(v) for v in values] or ["-"]
    pad = " " * 13
    return f"{label + ':':<13}" + values[0] + "\n" + "".join(pad + v + "\n" for v in values[1:])


def _argv(words):
    return [shlex.join(words)] if words else []


def inspect_text(doc, asked=None):
    c = doc["Config"]
    plat = mf.format_platform({"os": doc["Os"], "architecture": doc["Architecture"],
                               "variant": doc.get("Variant")})
    g = doc["GpuSandbox"]
    size = human(doc["Size"])
    if g["CompressedSize"] is not None:
        size += f" ({human(g['CompressedSize'])} compressed)"
    return "".join([
        _field("Reference", [asked]) if asked and asked not in doc["RepoTags"] else "",
        _field("Names", doc["RepoTags"]),
        _field("Digest", [doc["Digest"]]),
        _field("Id", [doc["Id"]]),
        _field("Created", [doc["Created"]] if doc["Created"] else []),
        _field("Platform", [plat]),
        _field("Size", [size]),
        _field("Entrypoint", _argv(c["Entrypoint"])),
        _field("Cmd", _argv(c["Cmd"])),
        _field("WorkingDir", [c["WorkingDir"]] if c["WorkingDir"] else []),
        _field("User", [c["User"]] if c["User"] else []),
        _field("Env", c["Env"]),
        _field("Labels", [f"{k}={v}" for k, v in sorted((c["Labels"] or {}).items())]),
        _field("Layers", g["LayerBlobs"]),
        _field("Store", [g["Store"]]),
        _field("Last used", [_when(g["LastUsed"])] if g["LastUsed"] else []),
    ])
