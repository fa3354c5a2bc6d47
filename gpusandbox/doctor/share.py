"""Doctor section "sharing": the GPU sharing tiers this host offers and the
image's forward-compatibility libraries (docs/sharing.md)."""
from gpusandbox.spec import names_squashfs

from .common import PASS, WARN, Check


def check_share(opts, host, sel):
    if host is None:
        return []
    from gpusandbox.errors import SandboxError
    from gpusandbox.gpu.share import info_lines
    out = [Check("sharing", label, PASS, value) for label, value in info_lines(host)]
    if opts.image and sel is not None and not sel.none:
        from gpusandbox.gpu import compat
        try:
            d = _compat(compat, opts, host, sel)
        except SandboxError as e:
            out.append(Check("sharing", "image forward compatibility", WARN, e.line()))
        else:
            if d is not None:
                out.append(Check("sharing", "image forward compatibility", PASS,
                                 ("used: " if d.use else "not used: ") + d.reason))
    return out


def _compat(compat, opts, host, sel):
    """The forward-compat decision for the image: a squashfs file is read
    through its read-only mount, as run reads it (doctor/sqsh.py), a store
    image in its store."""
    import os
    if names_squashfs(opts.image) and not os.path.isdir(opts.image):
        from .sqsh import mounted
        with mounted(opts.image, opts.userns) as (root, _env):
            return compat.for_launch("auto", root, host, sel, [])
    if not opts.image.startswith("/"):      # a store image (doctor/storeimage.py)
        from .storeimage import resolve
        return compat.for_launch("auto", resolve(opts.image)[0], host, sel, [])
    return compat.for_launch("auto", opts.image, host, sel, [])
