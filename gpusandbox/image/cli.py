"""`gpusandbox pull | images | rmi | prune | inspect` (off the launch path:
argparse and json are fine here)."""
import argparse
import json
import sys

from . import manifest as mf
from . import ref as refmod
from .digest import ImageError
from ..errors import RESUME_HINT, UsageError, interrupted, os_error, quiet_signals


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # "gpusandbox: error: pull: ...", not "gpusandbox: error: gpusandbox pull: ..."
        raise UsageError(f"{self.prog.partition(' ')[2]}: {message}", None,
                         f"run '{self.prog} --help'")


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
            # the path as the user knows it, never /proc/self/fd/N
            raise os_error(fn.__name__[5:], e, cls=ImageError) from None
    return wrapped


def pull_parser():
    p = _parser("pull", "Pull an image into the store.  REF: docker://[HOST[:PORT]/]REPO"
                "[:TAG|@DIGEST], oci:DIR[:TAG], oci-archive:FILE[:TAG], "
                "docker-archive:FILE[:NAME:TAG]; short names follow docker's rule "
                "(ubuntu is docker.io/library/ubuntu:latest).")
    p.add_argument("ref", metavar="REF", help="the image to pull")
    p.add_argument("--platform", metavar="OS/ARCH[/VARIANT]",
                   help="the platform to pull from a multi-platform image (default: this "
                        "host's)")
    p.add_argument("--authfile", metavar="FILE", help="registry credentials (default: "
                   "$REGISTRY_AUTH_FILE, the containers auth.json, ~/.docker/config.json)")
    p.add_argument("--tls-verify", default="true", choices=("true", "false"),
                   help="false: allow plain http and unverified TLS (default true)")
    p.add_argument("--progress", default="auto", choices=("auto", "tty", "plain", "json", "none"),
                   help="auto: a status line on a terminal, else plain lines (default auto)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress, only the digest")
    p.add_argument("--keep-blobs", action="store_true",
                   help="keep the image's compressed layers in the store (by default each "
                        "is removed once unpacked; rmi removes them with the image)")
    p.add_argument("-o", "--output", metavar="FILE.sqsh",
                   help="also write the image's root filesystem as one squashfs file "
                        "(for `gpusandbox run FILE.sqsh`; mksquashfs from squashfs-tools)")
    return p


@_oserrors
def main_pull(argv):
    a = pull_parser().parse_args(argv)
    stage = []
    try:
        return _pull(a, stage)
    except KeyboardInterrupt as e:
        # SIGINT/SIGTERM: the pull's clean-ups ran as this unwound (no
        # staging left, no image or name published half-way); the bytes of
        # a blob cut off mid-download stay for the next pull (partial.py).
        quiet_signals()
        if stage:
            raise interrupted(e, f"pull -o {a.output}", "the image is in the store; "
                              f"{a.output} was not written: run the same command "
                              "again to write it") from None
        raise interrupted(e, "pull", RESUME_HINT) from None


def _say(line):
    sys.stderr.write(f"gpusandbox: {line}\n")


def _pull(a, stage):
    if a.output:
        from . import sqshout
        sqshout.check_target(a.output)
    from .progress import Progress
    prog = Progress("none" if a.quiet else a.progress)
    from .pull import pull
    from .sources import names_for, open_source
    from .store import writable
    from .storeread import stores
    ref = refmod.parse(a.ref)
    if ref.transport == "store":
        # `pull ubuntu:22.04` means the registry, as docker pull does.
        ref = refmod.ImageRef("docker", ref.host, ref.repo, ref.tag, ref.digest,
                              short=ref.short)
    platform = mf.parse_platform(a.platform) if a.platform else None
    if ref.transport == "docker":
        from ..imagepolicy import check_image
        check_image(ref.canonical())
    st = writable(stores(a.store))
    src = open_source(ref, {"authfile": a.authfile, "tls_verify": a.tls_verify == "true",
                            "platform": platform, "say": _say})
    try:
        rec = pull(st, src, names_for(ref), platform=platform, asked=platform is not None,
                   progress=prog, keep_blobs=a.keep_blobs)
    finally:
        src.close()
    if getattr(src, "note", None) and src.note():
        _say(src.note())
    prog.finish()
    if a.output:
        stage.append("squashfs")
        sqshout.write(st.fd, st.image_dir(rec["digest"]) + "/rootfs", a.output,
                      config=st.read_blob(rec["config"]), sealed=st.sealed(rec["digest"]),
                      progress=prog if prog.mode != "none" else None)
    sys.stdout.write(rec["digest"] + "\n")
    return 0


def images_parser():
    p = _parser("images", "List the images in the store (then the site store): SIZE is "
                "the unpacked image's files, SHARED the disk its layers use that other images "
                "share, UNIQUE the disk only it uses (what rmi of it frees).")
    p.add_argument("--json", action="store_true", help="raw numbers for tools: size (the "
                   "compressed layers' bytes), unpacked_size, shared_size, unique_size, "
                   "last_used (epoch seconds)")
    p.add_argument("--df", action="store_true", help="the store's disk use per kind (images, "
                   "unused layers and blobs, staging) and what prune reclaims, as docker "
                   "system df")
    return p


@_oserrors
def main_images(argv):
    a = images_parser().parse_args(argv)
    from .storeread import stores
    from .show import df_doc, df_text, image_rows, images_text
    if a.df:
        docs = [df_doc(st) for st in stores(a.store) if st is not None]
        sys.stdout.write(json.dumps(docs, indent=1) + "\n" if a.json else df_text(docs))
        return 0
    rows = [r for st in stores(a.store) if st is not None for r in image_rows(st)]
    if a.json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
    else:
        sys.stdout.write(images_text(rows))
    return 0


def rmi_parser():
    p = _parser("rmi", "Remove images by reference or manifest digest; an image no name "
                "holds then is deleted with the layers and blobs no other image lists.")
    p.add_argument("refs", nargs="+", metavar="REF|DIGEST",
                   help="image names, or manifest digests (a prefix of 12 or more hex digits)")
    return p


@_oserrors
def main_rmi(argv):
    a = rmi_parser().parse_args(argv)
    from .store import writable
    from .storegc import rmi
    from .storeread import stores
    st = writable(stores(a.store))
    items = []
    for r in a.refs:
        if r.startswith("sha256:") or (len(r) >= 12 and all(c in "0123456789abcdef"
                                                           for c in r)):
            items.append(r)
        else:
            items.append(refmod.parse(r).canonical())
    for what, d in rmi(st, items):
        sys.stdout.write(f"untagged {what}\n" if what != d else f"deleted {d}\n")
    return 0


def prune_parser():
    return _parser("prune", "Remove images no reference names, blobs no image needs, "
                   "and what killed pulls left.")


@_oserrors
def main_prune(argv):
    a = prune_parser().parse_args(argv)
    from .sizes import human
    from .store import writable
    from .storegc import prune
    from .storeread import stores
    n_img, n_blob, freed = prune(writable(stores(a.store)))
    sys.stdout.write(f"removed {n_img} images, {n_blob} blobs, {human(freed)} freed\n")
    return 0


def inspect_parser():
    p = _parser("inspect", "Show images' names, platform, size, config (Entrypoint, Cmd, "
                "Env, WorkingDir, User, Labels) and layers.")
    p.add_argument("refs", nargs="+", metavar="REF", help="images in the store")
    p.add_argument("--json", action="store_true",
                   help="docker's image inspect JSON: a list of objects (Id, RepoTags, "
                        "RepoDigests, Created, Architecture, Os, Config, RootFS, Size)")
    return p


@_oserrors
def main_inspect(argv):
    a = inspect_parser().parse_args(argv)
    from .storeread import find, stores
    from .show import inspect_doc, inspect_text
    all_stores = stores(a.store)
    docs = []
    for text in a.refs:
        ref = refmod.parse(text)
        hit = find(ref, all_stores)
        if hit is None:
            raise ImageError(f"image not found: {ref.canonical()}", "not in the store",
                             "'gpusandbox images' lists them")
        docs.append((ref.canonical(), inspect_doc(*hit)))
    if a.json:
        sys.stdout.write(json.dumps([doc for _, doc in docs], indent=4) + "\n")
    else:
        sys.stdout.write("\n".join(inspect_text(doc, asked) for asked, doc in docs))
    return 0
