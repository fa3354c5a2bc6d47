"""The site's image policy: allowed-images and denied-images (docs/config.md),
asked by `run` for the name given and by the registry pull for the name it
resolved to (image/sources.py)."""
from . import settings as settingsmod
from .errors import UsageError


def check_image(name, s=None):
    """Refuse a registry or store image (its canonical HOST/REPO[:TAG][@DIGEST])
    that allowed-images does not match or denied-images does."""
    s = s or settingsmod.current()
    deny, allow = s.get("denied-images"), s.get("allowed-images")
    if not deny and not allow:
        return
    from fnmatch import fnmatchcase
    for pat in deny:
        if fnmatchcase(name, pat):
            raise UsageError(f"image {name}: denied by the site",
                             f"matches {pat!r} of denied-images ({s.lookup('denied-images')[1]})",
                             "use another image")
    if allow and not any(fnmatchcase(name, p) for p in allow):
        raise UsageError(f"image {name}: not among the images the site allows",
                         f"allowed-images ({s.lookup('allowed-images')[1]})",
                         "allowed: " + ", ".join(allow[:4]) + (" ..." if len(allow) > 4 else ""))
