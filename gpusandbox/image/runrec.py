"""Cheap reads for `run` of a cached image.

images/<hex>/run.rec: what `run` of a store image needs from its config
(config digest, platform, Entrypoint, Cmd, User, Env, WorkingDir), written
by the pull from the checked ImageConfig and read back without the json
module (which, with the `re` it imports, cost a cached `run` more than the
rest of the launch's image handling).  The platform check and the
Entrypoint/Cmd rule live here too (config.py and manifest.py re-export
them): a cached `run` imports neither of those modules.

The format is NUL-separated text fields (a config string never holds NUL:
config.parse refuses one), ending in NUL:

  gsbx-run-1 CONFIG-DIGEST OPT(os) OPT(arch) OPT(variant) OPT(user)
  OPT(workdir) LIST(entrypoint) LIST(cmd) LIST(env KEY=VALUE)

OPT is '-' for none or '=' + the string; LIST is '-' for none or a decimal
count followed by that many fields.  The file is still data read back from
disk (a site store is another user's): the read is bounded, the layout
exact and every field checked again as config.parse checks it; anything
else returns None, and the caller falls back to parsing the config blob."""
from . import digest as digestmod
from .digest import ImageError
# The read side lives in storeread.py, which a cached `run` loads anyway
# (one module fewer on that path); the names stay importable from here.
from .storeread import (MAGIC, MAX_FILE, MAX_ITEMS, MAX_STR, NAME,  # noqa: F401
                        RunConfig, check_platform, command, host_platform, load,
                        ref_fast)


def dump(config_digest, conf):
    """The record bytes of a parsed ImageConfig."""
    def opt(v):
        return ["-"] if v is None else ["=" + v]

    def lst(v):
        return ["-"] if v is None else [str(len(v))] + list(v)
    fields = [MAGIC, digestmod.validate(config_digest)] + opt(conf.os) + \
        opt(conf.architecture) + opt(conf.variant) + opt(conf.user) + opt(conf.workdir) + \
        lst(conf.entrypoint) + lst(conf.cmd) + lst([f"{k}={v}" for k, v in conf.env])
    if any("\0" in f for f in fields):
        raise ImageError("invalid image config", "a field holds a NUL character")
    return ("\0".join(fields) + "\0").encode()
