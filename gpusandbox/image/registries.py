"""registries.conf: where a registry reference is pulled from
(containers-registries.conf(5), version 2, the parts sites use; docs/config.md
"Registries").

Files (containers-registries.conf.d(5)): the user's
$XDG_CONFIG_HOME/containers/registries.conf (else ~/.config/...), when it
exists, replaces the system file and only the user's drop-ins follow; else
/etc/containers/registries.conf, /etc/containers/registries.conf.d/*.conf,
then the user's drop-ins, each directory in lexical order.  A later file's
unqualified-search-registries replaces an earlier one's; a [[registry]]
with the same prefix replaces the earlier one; aliases add up.  A system
file must be root's and closed to others, a user file root's or the
caller's (conffile.read's rule): one that is not is skipped with a warning.

Read: unqualified-search-registries, [aliases], [[registry]] prefix,
location, insecure, blocked, mirror-by-digest-only and [[registry.mirror]]
location, insecure, pull-from-mirror.  Other keys (short-name-mode,
credential-helpers, ...) are podman's and are left to it.

resolve(ref) gives the candidates of a pull in order, mirrors first and the
primary location last; a mirror that fails (lacks the tag, cannot be
reached) falls back to the next (MirroredSource)."""
import os

from .digest import ImageError

SYSTEM_FILE = "/etc/containers/registries.conf"
SYSTEM_DROPINS = "/etc/containers/registries.conf.d"
_PULL_FROM = ("all", "digest-only", "tag-only")


def user_paths(environ):
    xdg = environ.get("XDG_CONFIG_HOME") or ""
    if not xdg.startswith("/"):
        home = environ.get("HOME") or ""
        if not home.startswith("/"):
            return None, None
        xdg = os.path.join(home, ".config")
    top = os.path.join(xdg, "containers")
    return os.path.join(top, "registries.conf"), os.path.join(top, "registries.conf.d")


def _dropins(d):
    try:
        return [os.path.join(d, n) for n in sorted(os.listdir(d))
                if n.endswith(".conf") and not n.startswith(".")]
    except OSError:
        return []


def files(environ=None, system_file=SYSTEM_FILE, system_dropins=SYSTEM_DROPINS):
    """[(path, is_system)] in the order they apply."""
    env = os.environ if environ is None else environ
    ufile, udir = user_paths(env)
    out = []
    if ufile and os.path.exists(ufile):
        out.append((ufile, False))
    else:
        out.append((system_file, True))
        out += [(p, True) for p in _dropins(system_dropins)]
    if udir:
        out += [(p, False) for p in _dropins(udir)]
    return out


class Registry:
    __slots__ = ("prefix", "location", "insecure", "blocked", "digest_only", "mirrors", "path")

    def __init__(self, prefix, location, insecure, blocked, digest_only, mirrors, path):
        self.prefix, self.location, self.insecure = prefix, location, insecure
        self.blocked, self.digest_only, self.mirrors = blocked, digest_only, mirrors
        self.path = path


class Conf:
    def __init__(self):
        self.search = []
        self.search_from = None
        self.aliases = {}
        self.registries = {}        # prefix -> Registry
        self.warnings = []


def _bad(path, key, why):
    return ImageError(f"{path}: {key}", why, "see containers-registries.conf(5)")


def _typed(d, key, kind, path, default=None):
    v = d.get(key, default)
    if v is not default and not isinstance(v, kind):
        raise _bad(path, key, f"expected a {kind.__name__}")
    return v


def _strs(d, key, path):
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise _bad(path, key, "expected a list of strings")
    return v


def _host_part(loc):
    return loc.partition("/")[0]


def _parse_registry(r, path):
    if not isinstance(r, dict):
        raise _bad(path, "[[registry]]", "expected a table")
    loc = _typed(r, "location", str, path, "")
    prefix = _typed(r, "prefix", str, path, "") or loc
    if not prefix:
        raise _bad(path, "[[registry]]", "needs a prefix or a location")
    if prefix.startswith("*.") and loc:
        raise _bad(path, f"[[registry]] {prefix}", "a wildcard prefix takes no location")
    insecure = _typed(r, "insecure", bool, path, False)
    blocked = _typed(r, "blocked", bool, path, False)
    digest_only = _typed(r, "mirror-by-digest-only", bool, path, False)
    mirrors = []
    ms = r.get("mirror", [])
    if not isinstance(ms, list):
        raise _bad(path, f"[[registry]] {prefix}: mirror", "expected [[registry.mirror]] tables")
    for m in ms:
        if not isinstance(m, dict) or not isinstance(m.get("location"), str) \
                or not m["location"]:
            raise _bad(path, f"[[registry]] {prefix}: mirror", "each needs a location")
        pf = _typed(m, "pull-from-mirror", str, path, "all")
        if pf not in _PULL_FROM:
            raise _bad(path, f"[[registry]] {prefix}: pull-from-mirror",
                       "expected all, digest-only or tag-only")
        if digest_only and pf != "all":
            raise _bad(path, f"[[registry]] {prefix}: pull-from-mirror",
                       "not combinable with mirror-by-digest-only")
        mirrors.append((m["location"], _typed(m, "insecure", bool, path, False), pf))
    return Registry(prefix, loc or prefix, insecure, blocked, digest_only, mirrors, path)


def load(environ=None, **kw):
    """The merged Conf of the files that exist."""
    from .. import conffile
    conf = Conf()
    for path, system in files(environ, **kw):
        text, problem = conffile.read(path, allow_caller=not system)
        if problem:
            conf.warnings.append(problem)
        if text is None:
            continue
        try:
            doc = conffile.parse(text, path)
        except conffile.ConfError as e:
            raise ImageError(e.what, e.why, e.hint) from None
        search = _strs(doc, "unqualified-search-registries", path)
        if search is not None:
            conf.search, conf.search_from = search, path
        aliases = doc.get("aliases", {})
        if not isinstance(aliases, dict) or not all(isinstance(v, str)
                                                     for v in aliases.values()):
            raise _bad(path, "[aliases]", "expected NAME = \"HOST/REPO\" strings")
        conf.aliases.update(aliases)
        regs = doc.get("registry", [])
        if not isinstance(regs, list):
            raise _bad(path, "registry", "expected [[registry]] tables")
        for r in regs:
            reg = _parse_registry(r, path)
            conf.registries[reg.prefix] = reg
    return conf


def _matches(prefix, name):
    """Length of `prefix`'s match of the reference `name` (HOST/REPO[:TAG]
    [@DIGEST]), or -1."""
    if prefix.startswith("*."):
        host = _host_part(name)
        return len(prefix) if host.endswith(prefix[1:]) else -1
    if name == prefix or name.startswith(prefix) and name[len(prefix)] in "/:@":
        return len(prefix)
    return -1


def find(conf, name):
    """The [[registry]] whose prefix matches `name` longest, or None."""
    best, n = None, -1
    for reg in conf.registries.values():
        k = _matches(reg.prefix, name)
        if k > n:
            best, n = reg, k
    return best


class Candidate:
    """One place to pull from: host, repo, tag, digest (a ref for
    RegistrySource), insecure, and what it is (for the line a pull prints)."""
    __slots__ = ("host", "repo", "tag", "digest", "insecure", "role", "path")

    def __init__(self, name, tag, digest, insecure, role, path):
        self.host, _, self.repo = name.partition("/")
        self.tag, self.digest = tag, digest
        self.insecure, self.role, self.path = insecure, role, path

    @property
    def name(self):
        return f"{self.host}/{self.repo}"

    def canonical(self):
        return self.name + (f":{self.tag}" if self.tag else "") + \
            (f"@{self.digest}" if self.digest else "")


def _qualified(conf, name, tag, digest):
    """The candidates of a qualified HOST/REPO: mirrors, then the primary."""
    full = name + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
    reg = find(conf, full)
    if reg is None:
        return [Candidate(name, tag, digest, False, "primary", None)]
    if reg.blocked:
        raise ImageError(f"cannot pull {full}: the registry is blocked",
                         f"[[registry]] prefix {reg.prefix!r} in {reg.path}",
                         "ask your administrator, or pull from another registry")
    tail = name[len(reg.prefix):] if not reg.prefix.startswith("*.") else None

    def at(loc):
        return name if tail is None else loc + tail

    out = []
    if not (reg.digest_only and not digest):
        for loc, insecure, pf in reg.mirrors:
            if pf == "digest-only" and not digest or pf == "tag-only" and digest:
                continue
            out.append(Candidate(at(loc), tag, digest, insecure, f"mirror {loc}", reg.path))
    out.append(Candidate(at(reg.location), tag, digest, reg.insecure, "primary", reg.path))
    return out


def resolve(ref, conf):
    """[Candidate] for an ImageRef of a registry, in the order to try.  A
    short name goes through [aliases], then unqualified-search-registries
    (docker.io's library/ rule for a one-component name there); without
    any search registry, docker's rule (docker.io) applies and [aliases]
    are not read (Debian's shortnames.conf would otherwise move
    `docker://centos` to another registry on a node that chose nothing)."""
    from . import parse_name
    if ref.short and conf.search and ref.short in conf.aliases:
        h, r, _, _ = parse_name(conf.aliases[ref.short], default_tag=False)
        return _qualified(conf, f"{h}/{r}", ref.tag, ref.digest)
    if ref.short and conf.search:
        out = []
        for reg in conf.search:
            if reg in ("docker.io", "index.docker.io") and "/" not in ref.short:
                name = f"docker.io/library/{ref.short}"
            else:
                name = f"{reg}/{ref.short}"
            for c in _qualified(conf, name, ref.tag, ref.digest):
                if c.role == "primary":
                    c.role = f"unqualified-search-registries ({conf.search_from})"
                out.append(c)
        return out
    return _qualified(conf, f"{ref.host}/{ref.repo}", ref.tag, ref.digest)


class MirroredSource:
    """A Source over the candidates in order: manifest() asks each until one
    answers (a mirror that lacks the tag or cannot be reached falls back to
    the next); blobs come from the one that served the manifest.  `served`:
    that candidate; `errors`: [(candidate, ImageError)] of those that
    failed before it."""

    resumable = True

    def __init__(self, candidates, opener):
        self.candidates = candidates
        self._open = opener
        self.served = None
        self.errors = []
        self._src = None

    def manifest(self, platform=None):
        for c in self.candidates:
            src = self._open(c)
            try:
                got = src.manifest(platform)
            except ImageError as e:
                src.close()
                self.errors.append((c, e))
                continue
            self._src, self.served = src, c
            return got
        c, e = self.errors[-1]
        if len(self.errors) > 1:
            tried = ", ".join(x.name for x, _ in self.errors)
            e.hint = (e.hint + "; " if e.hint else "") + f"tried {tried}"
        raise e

    def note(self):
        """The line saying where the image came from, when it was not the
        plain primary of the reference."""
        c = self.served
        if c is None or c.role == "primary" and not self.errors and len(self.candidates) == 1:
            return None
        return f"pulled {c.canonical()} from {c.role}" + (f" ({c.path})" if c.path and
                                                           c.role.startswith("mirror") else "")

    def blob(self, desc, out):
        return self._src.blob(desc, out)

    def __getattr__(self, name):
        src = self.__dict__.get("_src")
        if src is None:
            raise AttributeError(name)
        return getattr(src, name)

    def close(self):
        if self._src is not None:
            self._src.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
