"""`gpusandbox pull | images | rmi | prune | inspect` (off the launch path:
argparse and json are fine here)."""
import argparse
import json
import sys
import time

from . import config as cfgmod
from . import manifest as mf
from . import ref as refmod
from .digest import ImageError
from ..errors import UsageError, printable


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(f"{self.prog}: {message}", None, f"run '{self.prog} --help'")


def _parser(cmd, desc):
    p = _Parser(prog=f"gpusandbox {cmd}", description=desc)
    p.add_argument("--store", metavar="DIR", help="the image store (default "
                   "$GPUSANDBOX_STORE, else $XDG_DATA_HOME/gpusandbox/store)")
    return p


def _oserrors(fn):
    """A file-system failure in the store is one line too, never a traceback."""
    import functools

    @functools.wraps(fn)
    def wrapped(argv):
        try:
            return fn(argv)
        except OSError as e:
            raise ImageError(f"gpusandbox {fn.__name__[5:]}", f"{e.strerror or e}"
                             + (f": {e.filename}" if e.filename else "")) from None
    return wrapped


@_oserrors
def main_pull(argv):
    p = _parser("pull", "Pull an image into the store.  REF: docker://[HOST[:PORT]/]REPO"
                "[:TAG|@DIGEST], oci:DIR[:TAG], oci-archive:FILE[:TAG], "
                "docker-archive:FILE[:NAME:TAG]; short names follow docker's rule "
                "(ubuntu is docker.io/library/ubuntu:latest).")
    p.add_argument("ref", metavar="REF")
    p.add_argument("--platform", metavar="OS/ARCH[/VARIANT]")
    p.add_argument("--authfile", metavar="FILE")
    p.add_argument("--tls-verify", default="true", choices=("true", "false"))
    p.add_argument("--progress", default="auto", choices=("auto", "tty", "plain", "json", "none"))
    p.add_argument("-q", "--quiet", action="store_true", help="no progress, only the digest")
    p.add_argument("-o", "--output", metavar="FILE.sqsh",
                   help="also write the image's root filesystem as one squashfs file "
                        "(for `gpusandbox run FILE.sqsh`; mksquashfs from squashfs-tools)")
    a = p.parse_args(argv)
    if a.output:
        from . import sqshout
        sqshout.check_target(a.output)
    from .progress import Progress
    prog = Progress("none" if a.quiet else a.progress)
    from .runimage import stores
    from .sources import names_for, open_source
    ref = refmod.parse(a.ref)
    if ref.transport == "store":
        # `pull ubuntu:22.04` means the registry, as docker pull does.
        ref = refmod.ImageRef("docker", ref.host, ref.repo, ref.tag, ref.digest)
    platform = mf.parse_platform(a.platform) if a.platform else None
    st = stores(a.store).writable()
    src = open_source(ref, {"authfile": a.authfile, "tls_verify": a.tls_verify == "true",
                            "platform": platform})
    try:
        rec = st.pull(src, names_for(ref), platform=platform, asked=platform is not None,
                      progress=prog)
    finally:
        src.close()
    prog.finish()
    if a.output:
        sqshout.write(st.fd, st.image_dir(rec["digest"]) + "/rootfs", a.output,
                      config=st.read_blob(rec["config"]), sealed=st.sealed(rec["digest"]))
    sys.stdout.write(rec["digest"] + "\n")
    return 0


def _rows(st):
    names = {}
    for n, d in st.refs():
        names.setdefault(d, []).append(n)
    for d in st.image_digests():
        rec = st.image_record(d) or {}
        for n in names.get(d) or ["<none>"]:
            yield {"reference": n, "digest": d, "size": rec.get("size"),
                   "created": rec.get("created"), "last_used": st.last_used(d),
                   "platform": rec.get("platform"), "store": st.root}


@_oserrors
def main_images(argv):
    p = _parser("images", "List the images in the store (then the site store).")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from .runimage import stores
    rows = [r for st in stores(a.store) if st is not None for r in _rows(st)]
    if a.json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return 0
    sys.stdout.write(f"{'REFERENCE':<50} {'DIGEST':<19} {'SIZE':>10} {'CREATED':<16} "
                     f"{'LAST USED':<16}\n")
    for r in rows:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["last_used"])) \
            if r["last_used"] else "-"
        created = (r["created"] or "-")[:16].replace("T", " ")
        sys.stdout.write(f"{printable(r['reference']):<50} {r['digest'][:19]:<19} "
                         f"{r['size'] or 0:>10} {printable(created):<16} {used:<16}\n")
    return 0


@_oserrors
def main_rmi(argv):
    p = _parser("rmi", "Remove images by reference or manifest digest.")
    p.add_argument("refs", nargs="+", metavar="REF|DIGEST")
    a = p.parse_args(argv)
    from .runimage import stores
    st = stores(a.store).writable()
    items = []
    for r in a.refs:
        if r.startswith("sha256:") or (len(r) >= 12 and all(c in "0123456789abcdef"
                                                           for c in r)):
            items.append(r)
        else:
            items.append(refmod.parse(r).canonical())
    for what, d in st.rmi(items):
        sys.stdout.write(f"untagged {what}\n" if what != d else f"deleted {d}\n")
    return 0


@_oserrors
def main_prune(argv):
    p = _parser("prune", "Remove images no reference names, blobs no image needs, "
                "and what killed pulls left.")
    a = p.parse_args(argv)
    from .runimage import stores
    n_img, n_blob, freed = stores(a.store).writable().prune()
    sys.stdout.write(f"removed {n_img} images, {n_blob} blobs, {freed} bytes\n")
    return 0


@_oserrors
def main_inspect(argv):
    p = _parser("inspect", "Show an image's platform, config and layers.")
    p.add_argument("ref", metavar="REF")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    from .runimage import find, stores
    ref = refmod.parse(a.ref)
    all_stores = stores(a.store)
    hit = find(ref, all_stores)
    if hit is None:
        raise ImageError(f"image not found: {ref.canonical()}", "not in the store",
                         "'gpusandbox images' lists them")
    st, d = hit
    rec = st.image_record(d) or {}
    conf = cfgmod.parse(st.read_blob(rec["config"]))
    out = {"reference": ref.canonical(), "digest": d, "config": rec.get("config"),
           "platform": mf.format_platform(conf.platform()), "created": conf.created,
           "Env": [f"{k}={v}" for k, v in conf.env], "Entrypoint": conf.entrypoint,
           "Cmd": conf.cmd, "WorkingDir": conf.workdir, "User": conf.user,
           "Labels": conf.labels, "layers": rec.get("layers"), "size": rec.get("size"),
           "store": st.root}
    if a.json:
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
    else:
        for key, val in out.items():
            # Image strings may hold terminal escapes: JSON-escaped or printable() only.
            shown = json.dumps(val) if isinstance(val, (list, dict)) else printable(val)
            sys.stdout.write(f"{key + ':':<12} {shown}\n")
    return 0
