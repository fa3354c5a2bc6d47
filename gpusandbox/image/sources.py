"""ImageRef -> Source, and the names a pulled image is recorded under.

The registry client is imported only for docker:// references, so a pull or
run of a local layout or archive never loads an HTTP library."""
from . import ref as refmod
from .digest import ImageError


def open_source(ref, opts=None):
    """A Source for `ref` (an ImageRef of a transport); opts: authfile,
    tls_verify, platform (for the registry)."""
    opts = opts or {}
    if ref.transport == "docker":
        try:
            from .registry import RegistrySource
        except ImportError as e:
            raise ImageError(f"cannot pull {ref.canonical()}",
                             f"the registry client is not available ({e})",
                             "reinstall gpusandbox with its dependencies") from None
        from . import registries
        conf = registries.load()
        say = opts.get("say")
        for w in conf.warnings:
            if say:
                say(f"warning: {w}")
        cands = registries.resolve(ref, conf)
        if len(cands) == 1 and cands[0].role == "primary" and not cands[0].insecure \
                and cands[0].name == ref.name:
            return RegistrySource(ref, authfile=opts.get("authfile"),
                                  tls_verify=opts.get("tls_verify", True),
                                  platform=opts.get("platform"))
        from ..imagepolicy import check_image
        for c in cands:
            if c.role != "primary" and not c.role.startswith("mirror"):
                check_image(c.canonical())      # a name a search resolved to
        return registries.MirroredSource(cands, lambda c: RegistrySource(
            c, authfile=opts.get("authfile"),
            tls_verify=opts.get("tls_verify", True) and not c.insecure,
            platform=opts.get("platform")))
    if ref.transport in ("oci", "oci-archive", "docker-archive"):
        from .archive import open_local
        return open_local(ref)
    raise ImageError(f"cannot pull {ref.canonical()}", "it names an image already in the store",
                     "pull docker://NAME, oci:DIR, oci-archive:FILE or docker-archive:FILE")


def names_for(ref):
    """The refs a pull of `ref` records, as a function of its source: the
    reference itself, and for a docker-archive without a name the names
    its manifest.json gives (as `docker load` does)."""
    def names(source):
        if ref.transport == "docker-archive" and ref.tag is None:
            out = []
            for t in getattr(source, "names", []) or []:
                try:
                    h, r, tag, _ = refmod.parse_name(t)
                except ImageError:
                    continue
                out.append(f"{h}/{r}:{tag}")
            return out or [ref.canonical()]
        served = getattr(source, "served", None)
        if served is not None and served.role.startswith("unqualified"):
            # a short name a search resolved: under both names (docs/config.md)
            return [ref.canonical(), served.canonical()]
        return [ref.canonical()]
    return names
