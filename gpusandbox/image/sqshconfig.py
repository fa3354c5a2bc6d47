"""The image config carried inside a squashfs image (`pull -o FILE.sqsh`
writes it, sqshout.py): /.gpusandbox/config.json, the OCI/Docker config blob
as pulled.

`run FILE.sqsh` reads it from the mounted file, through the mount's
directory fd (RESOLVE_IN_ROOT, no magic links, a regular file only,
bounded), and parses it with the same checks as a store image's config: it
is data of whoever made the file, worth exactly what a store image's config
is worth.  It then applies as for a store image: Env is row 3 of the
environment table (in place of /etc/environment), Entrypoint + Cmd the
command (a CMD given replaces Cmd, --entrypoint replaces the entrypoint),
WorkingDir the default -w, User where the sandbox can represent it (real
root in the host user namespace), else a note.  A file without it (made by
hand with mksquashfs) runs as before: /etc/environment, and a CMD needed."""
from ..linux import sys as k
from . import config as cfgmod
from . import manifest as mf
from .digest import ImageError
from .storeread import apply_config, note_user, resolve_user

CONFIG_DIR = "/.gpusandbox"
CONFIG_PATH = CONFIG_DIR + "/config.json"


def load(rootfd, image):
    """The ImageConfig carried by the mounted squashfs root `rootfd`, or
    None when it carries none."""
    try:
        raw = k.read_in_root(rootfd, CONFIG_PATH, mf.MAX_DOC + 1)
    except OSError as e:
        raise ImageError(f"cannot read {CONFIG_PATH} of {image}", e.strerror) from None
    if raw is None:
        return None
    if len(raw) > mf.MAX_DOC:
        raise ImageError(f"{image}: {CONFIG_PATH} is too large",
                         f"more than {mf.MAX_DOC} bytes")
    return cfgmod.parse(raw)


def apply(plan, image):
    """Apply the carried config (if any) to plan.spec; refuse a run with no
    command.  Called once the file is mounted (the mount method depends on
    the identity, so that is chosen first).  Returns True when the image's
    User changed spec.user: the caller then chooses the identity again."""
    spec = plan.spec
    conf = load(plan.rootfd, image)
    if conf is None:
        if spec.entrypoint:
            spec.argv = [spec.entrypoint] + list(spec.argv)
        if not spec.argv:
            raise ImageError(f"no command to run in {image}",
                             f"it carries no image config ({CONFIG_PATH})",
                             "give one: gpusandbox run FILE.sqsh CMD [ARG...]")
        return False
    platform = mf.parse_platform(spec.platform) if spec.platform else None
    cfgmod.check_platform(conf, platform or mf.host_platform(), platform is not None)
    if not apply_config(spec, conf, image, "FILE.sqsh"):
        return False
    if plan.userns == "host" and plan.real_root:
        spec.user = resolve_user(conf, plan.rootfd)
        spec.user_by_image = True
        return True
    note_user(conf)
    return False

