"""The site's and the user's configuration applied to a `run` request
(docs/config.md): after the command line is parsed and before the image is
looked up.

- a key the command line left unset takes the configured value (settings:
  environment > user file > site files > default);
- a key the site locks refuses a command-line value that differs from it,
  in one line naming the file (a variable or a user file is ignored with a
  warning, settings.Settings.warnings);
- the site's and user's mounts come first (expanded; an optional one whose
  source is missing is skipped), then the home when mount-home, then -v;
- every bind source (configured or -v) is checked against forbid-binds;
- --shm-size, --memory, --gpu-memory against the site's upper bounds;
- a registry or store image against allowed-images / denied-images
  (imagepolicy.py, which the pull asks again for the name a search resolved).

Everything here reads the caller's own identity from the kernel and
passwd, never from a variable: {home} and {user} of a site mount name the
real caller."""
import os

from .errors import UsageError
from . import settings as settingsmod
from .spec import Bind

# key -> RunSpec attribute of its option, and the value the parser leaves
# when the option is not given.
_SPEC = {
    "gpu-caps": ("gpu_caps", None), "network": ("net", None), "seccomp": ("seccomp", "default"),
    "share": ("share", None), "gpu-visibility": ("gpu_visibility", None),
    "shm-size": ("shm_size", None), "store": ("store", None),
    "driver-root": ("driver_root", None), "dev-root": ("dev_root", None),
    "mount-home": ("mount_home", None),
    "fabric": ("fabric", None), "fabric-libs": ("fabric_libs", None), "mpi": ("mpi", None),
}
# upper bound -> (RunSpec attribute, option)
_BOUNDS = {"max-shm-size": ("shm_size", "--shm-size"), "max-memory": ("memory", "--memory"),
           "max-gpu-memory": ("gpu_memory", "--gpu-memory")}


def identity():
    """{user, uid, home} of the real caller (passwd), job: $SLURM_JOB_ID."""
    import pwd
    uid = os.getuid()
    try:
        pw = pwd.getpwuid(uid)
        user, home = pw.pw_name, pw.pw_dir
    except KeyError:
        user, home = str(uid), None
    job = os.environ.get("SLURM_JOB_ID") or ""
    # The caller's variable: only a job id's form (digits) names a path part.
    return {"user": user, "uid": str(uid), "home": home,
            "job": job if job.isascii() and job.isdigit() else None}


def expand(text, ids, where):
    """`text` with {home} {user} {uid} {job} replaced; None when it names
    one this launch lacks (a job outside Slurm, a user without a home)."""
    out, i = [], 0
    while i < len(text):
        j = text.find("{", i)
        if j < 0:
            out.append(text[i:])
            break
        k = text.find("}", j)
        name = text[j + 1:k] if k > j else None
        if name not in ("home", "user", "uid", "job"):
            raise UsageError(f"{where}: {text!r}", f"unknown expansion {text[j:k + 1] or '{'}",
                             "use {home}, {user}, {uid} or {job}")
        if ids[name] is None:
            return None
        out += [text[i:j], ids[name]]
        i = k + 1
    return "".join(out)


def _literal_prefix(pattern):
    cut = min((pattern.find(c) for c in "*?[" if c in pattern), default=len(pattern))
    return pattern[:cut]


def forbidden(src, patterns):
    """The pattern that forbids binding `src` (the path, a path above it or
    a directory holding it matches), or None."""
    from fnmatch import fnmatchcase
    paths = {src, os.path.realpath(src)}
    for pat in patterns:
        for p in paths:
            up = p
            while True:
                if fnmatchcase(up, pat):
                    return pat
                if up == "/":
                    break
                up = os.path.dirname(up)
            pre = _literal_prefix(pat)
            if p == "/" or pre.startswith(p.rstrip("/") + "/"):
                return pat
    return None


def _locked_flag(s, name, given):
    locked = s.locks().get(name)
    if locked is None:
        return
    want = s.get(name)
    if given != want:
        key = settingsmod.KEYS[name]
        raise UsageError(f"{key.flag} {given}: the site locks {name} = {want} ({locked})",
                         None, f"drop {key.flag}; ask your administrator to change it")


def has_image_policy(s=None):
    s = s or settingsmod.current()
    return bool(s.get("allowed-images") or s.get("denied-images"))


def check_image(name, s=None):
    """imagepolicy.check_image, loaded only when the site has a policy."""
    if has_image_policy(s):
        from .imagepolicy import check_image as check
        check(name, s or settingsmod.current())


class _Ids(dict):
    """identity(), asked only when a mount or variable expands (passwd)."""

    def __missing__(self, key):
        self.update(identity())
        return self[key]


def apply(spec, s=None, ids=None):
    """Fill `spec` from the configuration; UsageError on a locked or
    forbidden request.  Returns the warning lines to print."""
    s = s or settingsmod.current()
    ids = ids or _Ids()
    for name, (attr, unset) in _SPEC.items():
        given = getattr(spec, attr)
        if given != unset:
            if not (name == "dev-root" and spec.driver_root is not None):
                _locked_flag(s, name, given)
            continue
        if name in ("driver-root", "dev-root"):
            continue        # the plan asks them when it injects GPUs (plandev.py)
        value, where = s.lookup(name)
        if where is not None:
            setattr(spec, attr, value)
    binds = []
    for i, m in enumerate(s.get("mounts")):
        where = f"setting mounts[{i}] ({s.lookup('mounts')[1]})"
        src = expand(m["source"], ids, where)
        dst = expand(m.get("destination", m["source"]), ids, where)
        if src is None or dst is None:
            continue
        if not os.path.exists(src):
            if m.get("optional"):
                continue
            raise UsageError(f"{where}: source {src} does not exist", None,
                             "create it, or mark the mount optional = true")
        binds.append(Bind(src, dst, not m.get("read-only", False)))
    if spec.mount_home is None:
        spec.mount_home = s.get("mount-home")
    if spec.mount_home and ids["home"] and os.path.isdir(ids["home"]) and \
            not any(b.dst == ids["home"] for b in binds + spec.binds):
        binds.append(Bind(ids["home"], ids["home"], True))
    spec.binds[:0] = binds
    deny = s.get("forbid-binds")
    if deny:
        for b in spec.binds:
            if b.src is None:
                continue
            pat = forbidden(b.src, deny)
            if pat:
                raise UsageError(f"bind of {b.src}: forbidden by the site",
                                 f"matches {pat!r} of forbid-binds ({s.lookup('forbid-binds')[1]})",
                                 "bind another path")
    env = s.get("env")
    if env:
        items = []
        for k, v in env.items():
            v = expand(v, ids, f"setting env.{k}")
            if v is not None:
                items.append(f"{k}={v}")
        spec.env_set[:0] = items
    names = s.get("pass-env")
    if names:
        from fnmatch import fnmatchcase
        spec.env_set[:0] = sorted(k for k in os.environ
                                  if any(fnmatchcase(k, n) for n in names))
    _bounds(spec, s)
    return s.warnings()


def _bounds(spec, s):
    for name, (attr, opt) in _BOUNDS.items():
        limit = s.get(name)
        asked = getattr(spec, attr)
        if limit is None or asked is None:
            continue
        from .mountopt import size_bytes
        cap = size_bytes(limit)
        if attr == "gpu_memory":
            from .gpu.share import parse_memory
            got = parse_memory(asked) << 20
        else:
            from .linux.cgfs import _size
            got = _size(opt, asked)
            got = float("inf") if got == "max" else int(got)
        if got > cap:
            raise UsageError(f"{opt} {asked}: more than the site allows",
                             f"at most {limit} ({s.lookup(name)[1]})", f"ask for {limit} or less")
