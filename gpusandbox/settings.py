"""Settings: what an administrator or the caller chooses for gpusandbox's
doors, read one way by all of them.  docs/config.md (the keys, the site and
user files) and docs/runtime.md ("Settings", the older oci.conf files) are
the reference; this module is the only reader.

A key's value comes from the first source that names it:
  1. the caller's environment: the key's variable (KEYS);
  2. the file $GPUSANDBOX_OCI_CONF names, alone; without it,
     $HOME/.config/gpusandbox/oci.conf for a caller that is not real root;
  3. the user's configuration file (conffile.user_file, TOML);
  4. /etc/gpusandbox/oci.conf (without $GPUSANDBOX_OCI_CONF);
  5. the site's files: /etc/gpusandbox/gpusandbox.conf and conf.d/*.conf;
  6. the key's default.
(The command line comes before all of them: siterun.py for `run`.)  A key
the site locks (`lock = [...]`) takes only the admin's sources (4, 5) and
the default; a value of another source is ignored with a warning line.
A merge key (mounts, env, ...) adds up its values from every source.

An oci.conf file is read only when it is a regular file of root's or the
caller's that no one else can write: otherwise the lookup fails (the file
decides what driver the container gets and what runtime the wrapper
execs).  A TOML file that fails the same check is skipped with a warning
(conffile.py).  A key with `within` (dev-root) is taken only from the source
that gave that key (driver-root) or an earlier one: GPUSANDBOX_DRIVER_ROOT
alone means that driver root with its own /dev, whatever a file says.

KEYS is the one table (kind, default, variable, option, doors, doc), used
by the readers, `gpusandbox config`, docs/config.md (a test holds the page
to it) and the tests.

bin/gpusandbox-runtime reads `runtime` in sh by the same rules
(tests/integration/test_settings_sh.py holds the two together); `runtime`
is therefore not read from the TOML files.

Light: os and stat only, with linux.host (the OCI fast paths read settings).
"""
import os
import stat

from .linux import host
from .settingswhere import DRIVER_ROOT, SYSTEM_DIR, configured, source_dirs  # noqa: F401

FILE_VAR = "GPUSANDBOX_OCI_CONF"
SYSTEM_FILE = SYSTEM_DIR + "/oci.conf"
USER_FILE = ".config/gpusandbox/oci.conf"      # under $HOME
# Spellings older versions read, still accepted; `gpusandbox doctor` names them.
OLD_FILE_VARS = ("GPUSANDBOX_OCI_CONFIG",)
_WS = " \t"


# The doors that read settings (docs/config.md, "What each door honours"):
# a key's `doors` names those that honour it, from this table.
DOORS = {
    "run": "gpusandbox run",
    "slurm-oci": "gpusandbox slurm-oci run (srun --container): `run` of the step's bundle",
    "spank": "a SPANK step (srun --container-image): `run` as the step's task",
    "gpusandbox-oci": "the OCI runtime (podman, docker, containerd --runtime gpusandbox-oci)",
    "hook": "gpusandbox hook, the OCI hook under runc or crun",
    "wrapper": "gpusandbox-runtime, the runtime wrapper",
    "filter": "gpusandbox oci-filter, podman's precreate hook",
    "pull": "gpusandbox pull", "images": "gpusandbox images, rmi",
    "inspect": "gpusandbox info, list, doctor, mps, cdi generate and check",
}
_RUN = "run, slurm-oci, spank"      # `run`'s own options: the doors that are `run`
_ALL = "run, slurm-oci, spank, gpusandbox-oci, hook, wrapper, filter, inspect"
_STORE = "run, spank, pull, images"
_IMAGES = "run, spank, pull"         # a registry or store image (slurm-oci runs a directory)


class Key:
    """One setting: its name in the files, its kind (what a value must be),
    its default, its variable (None: files only), the `run` option that
    sets it, where it is honoured, and a line for `gpusandbox config` and
    docs/config.md.  site_only: only a site file may set it (limits and
    policy); merge: the values of every file add up (site first) rather
    than the first one winning; oci_conf: also read from the older oci.conf
    files (key = value)."""
    __slots__ = ("name", "kind", "default", "env", "aliases", "within", "flag", "doors",
                 "doc", "site_only", "merge", "choices", "oci_conf", "toml")

    def __init__(self, name, kind, default, env, aliases=(), within=None, flag=None,
                 doors=_RUN, doc="", site_only=False, merge=False, choices=(),
                 oci_conf=False, toml=True):
        self.name, self.kind, self.default, self.env = name, kind, default, env
        self.aliases, self.within = aliases, within
        self.flag, self.doors, self.doc = flag, doors, doc
        self.site_only, self.merge, self.choices = site_only, merge, choices
        self.oci_conf, self.toml = oci_conf, toml

    def check(self, val, at, text=None):
        """`val` of a TOML file, checked against the kind (ConfError naming
        `at`, the file and line, and the key)."""
        from .conffile import check_value
        return check_value(self, val, at)

    def from_env(self, text):
        """A variable's text as a value of this kind."""
        if self.kind == "bool":
            low = text.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise _error(f"{self.env}={text!r}", "not a boolean", "use true or false")
        if self.kind in ("globs", "names"):
            return [w for w in text.replace(",", " ").split() if w]
        if self.kind == "dir":
            return os.path.abspath(text)    # a variable may name it relative to the cwd
        if self.kind == "path":
            return text                     # checked by Settings._lookup (its own line)
        from .conffile import check_value
        return check_value(self, text, self.env)


KEYS = {k.name: k for k in (
    Key("driver-root", "path", DRIVER_ROOT, "GPUSANDBOX_DRIVER_ROOT", ("driver_root",),
        flag="--driver-root", doors=_ALL, oci_conf=True,
        doc="where the driver's files are (a simulated host: `gpusandbox sim create`'s DIR)"),
    Key("dev-root", "path", None, "GPUSANDBOX_DEV_ROOT", ("dev_root",), within="driver-root",
        flag="--dev-root", doors=_ALL, oci_conf=True,
        doc="where its device nodes are (default: the driver root's /dev)"),
    Key("runtime", "path", None, "GPUSANDBOX_OCI_RUNTIME", doors="wrapper", oci_conf=True,
        toml=False,
        doc="the OCI runtime the gpusandbox-runtime wrapper execs (default runc, else crun)"),
    Key("store", "dir", None, "GPUSANDBOX_STORE", flag="--store", doors=_STORE,
        doc="the user's image store (default $XDG_DATA_HOME/gpusandbox/store)"),
    Key("site-store", "dir", None, "GPUSANDBOX_SITE_STORE", doors=_STORE,
        doc="a read-only store of images the site provides, searched after the user's"),
    Key("mounts", "mounts", [], None, merge=True,
        doc="binds every sandbox gets ([[mounts]] tables: source, destination, "
            "read-only, optional; {home} {user} {uid} {job} expand)"),
    Key("mount-home", "bool", False, "GPUSANDBOX_MOUNT_HOME", flag="--mount-home",
        doc="bind the caller's home (from passwd) at the same path"),
    Key("env", "env", {}, None, merge=True,
        doc="variables to set in every sandbox ([env] table; -e wins; expansions apply)"),
    Key("pass-env", "names", [], None, merge=True,
        doc="host variables passed through when set (names or globs, e.g. SLURM_*)"),
    Key("gpu-caps", "text", None, "GPUSANDBOX_GPU_CAPS", flag="--gpu-caps",
        doc="default driver capabilities (the built-in default: utility,compute)"),
    Key("network", "choice", None, "GPUSANDBOX_NETWORK", flag="--net",
        choices=("host", "none"), doc="default network (built-in: none for uid 0, else host)"),
    Key("seccomp", "text", "default", "GPUSANDBOX_SECCOMP", flag="--seccomp",
        doc="default seccomp profile: default, unconfined or a profile file"),
    Key("share", "choice", None, "GPUSANDBOX_SHARE", flag="--share", choices=("node", "none"),
        doc="pod mode default (built-in: node in a multi-task Slurm step)"),
    Key("gpu-visibility", "choice", None, "GPUSANDBOX_GPU_VISIBILITY", flag="--gpu-visibility",
        choices=("task", "step"), doc="pod mode: which GPUs a rank sees"),
    Key("shm-size", "size", None, "GPUSANDBOX_SHM_SIZE", flag="--shm-size",
        doc="the pod's /dev/shm size (built-in 1g)"),
    Key("fabric", "text", None, "GPUSANDBOX_FABRIC", flag="--fabric",
        doc="default --fabric: auto, all, none or adapter names (built-in: auto, the "
            "adapters nearest the task's GPUs; docs/fabric.md)"),
    Key("fabric-libs", "choice", None, "GPUSANDBOX_FABRIC_LIBS", flag="--fabric-libs",
        choices=("host", "image"),
        doc="default --fabric-libs: host injects the host's rdma-core (built-in: image)"),
    Key("mpi", "choice", None, "GPUSANDBOX_MPI", flag="--mpi", choices=("host", "image"),
        doc="default --mpi: host puts the host's MPI in place of the image's (built-in: image)"),
    Key("mpi-libs", "text", None, "GPUSANDBOX_MPI_LIBS",
        doc="the host MPI libraries --mpi host injects (colon-separated paths; built-in: "
            "the loader cache's MPICH-ABI libraries)"),
    Key("mpi-compat", "choice", "major", "GPUSANDBOX_MPI_COMPAT",
        choices=("major", "full", "strict"),
        doc="how closely the host MPI must match the image's (Sarus's levels)"),
    Key("max-shm-size", "size", None, None, site_only=True,
        doc="the largest --shm-size a user may ask for"),
    Key("max-memory", "size", None, None, site_only=True,
        doc="the largest --memory a user may ask for"),
    Key("max-gpu-memory", "size", None, None, site_only=True,
        doc="the largest --gpu-memory a user may ask for"),
    Key("forbid-binds", "globs", [], None, site_only=True, merge=True,
        doc="host paths no bind may expose (globs; a bind of a directory above one is "
            "refused too)"),
    Key("allowed-images", "globs", [], None, site_only=True, merge=True, doors=_IMAGES,
        doc="if set, only registry and store images matching one of these globs run "
            "(HOST/REPO:TAG or HOST/REPO@DIGEST)"),
    Key("denied-images", "globs", [], None, site_only=True, merge=True, doors=_IMAGES,
        doc="registry and store images that never run (globs as allowed-images)"),
    Key("hooks-dir", "path", "/etc/gpusandbox/hooks.d", None, site_only=True,
        doors="run, slurm-oci, spank, gpusandbox-oci",
        doc="the site hooks' directory: root's executables run at the rootfs and exit "
            "points of every launch"),
)}
ALIASES = {a: k.name for k in KEYS.values() for a in k.aliases}
# Every variable the settings read: what a door that cleans its environment
# (the hook) keeps.
ENV_VARS = tuple(k.env for k in KEYS.values() if k.env) + (FILE_VAR,) + OLD_FILE_VARS
def _error(what, why, hint=None):
    from .errors import UsageError
    return UsageError(what, why, hint)


def parse(text):
    """({key: value}, [notes]) of `key = value` lines: blank lines and lines
    whose first character other than space or tab is `#` are skipped; a `#`
    at the start of a value or after a space or tab starts a comment; keys
    and values lose surrounding spaces and tabs; the last line naming a key
    (in either spelling) wins, and an empty value names nothing.  Notes:
    (what, fix) of older spellings and unknown keys, for `gpusandbox doctor`."""
    values, notes = {}, []
    for line in text.split("\n"):
        line = line.strip(_WS)
        if not line or line[0] == "#" or "=" not in line:
            continue
        key, _, val = line.partition("=")
        key = key.strip(_WS)
        val = " " + val
        cut = [i for i in (val.find(" #"), val.find("\t#")) if i >= 0]
        val = val[:min(cut)] if cut else val
        name = ALIASES.get(key, key)
        if name not in KEYS or not KEYS[name].oci_conf:
            notes.append((f"unknown key {key!r}: ignored", "remove it or correct its spelling"))
            continue
        if name != key:
            notes.append((f"{key}: an older spelling, still read", f"write {name}"))
        values[name] = val.strip(_WS)
    return values, notes


class EnvSource:
    """The caller's environment: each key's own variable."""
    admin = False

    def __init__(self, environ):
        self.environ = environ

    def raw(self, key):
        text = self.environ.get(key.env) if key.env else None
        return key.from_env(text) if text else None

    def check(self):
        pass

    def where(self, key):
        return key.env


class FileSource:
    """A settings file (parse's format), read on first use.  admin: the
    system file (/etc/gpusandbox/oci.conf), which a site lock does not
    override."""

    def __init__(self, path, admin=False):
        self.path = path
        self.admin = admin
        self.notes = []
        self._st = self._values = None

    def values(self):
        """{key: value} of the file ({} when it is not there); UsageError
        when it cannot be read or is not a regular file."""
        if self._values is not None:
            return self._values
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            self._values = {}
            return self._values
        except OSError as e:
            raise _error(f"settings file {self.path}", e.strerror,
                         "make it readable (settings are not secrets) or remove it") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _error(f"settings file {self.path}", "not a regular file",
                             "remove it, or put the settings in a file there")
            chunks = []
            while True:
                b = os.read(fd, 1 << 16)
                if not b:
                    break
                chunks.append(b)
        finally:
            os.close(fd)
        self._st = st
        self._values, self.notes = parse(os.fsdecode(b"".join(chunks)))
        return self._values

    def raw(self, key):
        if not key.oci_conf:
            return None         # not opened for a key it cannot hold
        return self.values().get(key.name) or None

    def check(self):
        """The file is root's or the caller's, and no one else can write it
        (inside a user namespace the host's root shows as the overflow uid)."""
        st, uid = self._st, os.geteuid()
        if st.st_uid != uid and st.st_uid not in host.root_uids():
            why = f"owned by uid {st.st_uid}, not by root or you (uid {uid})"
        elif st.st_mode & 0o022:
            why = f"mode {st.st_mode & 0o7777:04o} lets others write to it"
        else:
            return
        raise _error(f"settings file {self.path}", why,
                     f"make it root's or yours and closed to others (chmod go-w {self.path}), "
                     "or remove it")

    def where(self, key):
        return self.path


class TomlSource:
    """The site's files (conffile.site_files, merged: a later drop-in's
    key wins) or the user's file: checked on first use (conffile.load),
    a file unfit to read skipped with a warning."""

    def __init__(self, paths, admin):
        self.paths = paths
        self.admin = admin
        self.warnings = []
        self._confs = None

    def confs(self):
        if self._confs is None:
            from . import conffile
            self._confs = [c for c in (conffile.load(p, KEYS, self.admin, self.warnings.append)
                                       for p in self.paths) if c is not None]
        return self._confs

    def _conf(self, key):
        for c in reversed(self.confs()):
            if key.name in c.values:
                return c
        return None

    def raw(self, key):
        if not key.toml:
            return None
        if key.merge:
            vals = [c.values[key.name] for c in self.confs() if key.name in c.values]
            return _merged(vals) if vals else None
        c = self._conf(key)
        return None if c is None else c.values[key.name]

    def locks(self):
        """{key name: where it is locked}."""
        return {k: c.path for c in self.confs() for k in c.locks}

    def check(self):
        pass

    def where(self, key):
        c = self._conf(key)
        return c.where(key.name) if c else (self.paths[0] if self.paths else "?")


def _merged(vals):
    """The values of a merge key, earliest (lowest precedence) first."""
    if isinstance(vals[0], dict):
        out = {}
        for v in vals:
            out.update(v)
        return out
    out = []
    for v in vals:
        out += [x for x in v if x not in out]
    return out


def sources(environ, system_file=SYSTEM_FILE, site_dir=None):
    """The sources a lookup asks, in order: the environment, the oci.conf
    files (docs/runtime.md), the user's configuration file, the site's.
    Only the environment when nothing is configured (configured())."""
    if system_file == SYSTEM_FILE and site_dir is None and not configured(environ):
        return [EnvSource(environ)]
    from . import conffile
    out = [EnvSource(environ)]
    user = conffile.user_file(environ)
    site = TomlSource(conffile.site_files(site_dir or conffile.SITE_DIR), admin=True)
    named = environ.get(FILE_VAR) or next((environ[v] for v in OLD_FILE_VARS
                                           if environ.get(v)), None)
    if named:
        out.append(FileSource(named))
    else:
        home = environ.get("HOME") or ""
        if home.startswith("/") and not host.real_root():
            out.append(FileSource(os.path.join(home, USER_FILE)))
    if user:
        out.append(TomlSource([user], admin=False))
    if not named:
        out.append(FileSource(system_file, admin=True))
    return out + [site]


class Settings:
    """The settings one call of a door sees (each file read once).
    warnings(): the lines to show the caller (files skipped, values a
    site lock overrode)."""

    def __init__(self, environ=None, srcs=None):
        self.sources = sources(os.environ if environ is None else environ) if srcs is None \
            else srcs
        self._found = {}
        self._notes = []
        self._locks = None

    def locks(self):
        """{key: the site file that locks it}."""
        if self._locks is None:
            self._locks = {}
            for src in self.sources:
                if isinstance(src, TomlSource) and src.admin:
                    self._locks.update(src.locks())
        return self._locks

    def warnings(self):
        out = []
        for src in self.sources:
            out += getattr(src, "warnings", [])
        return out + self._notes

    def lookup(self, name):
        """(value, where it came from: a variable or a file; None for the
        default).  UsageError when the file that names it fails the check
        or the value is not of the key's kind."""
        return self._lookup(name)[:2]

    def _lookup(self, name):
        if name in self._found:
            return self._found[name]
        key = KEYS[name]
        last = self._lookup(key.within)[2] if key.within else len(self.sources)
        locked = self.locks().get(name)
        got = (key.default, None, len(self.sources))
        merged = []
        for rank, src in enumerate(self.sources[:last + 1]):
            val = src.raw(key)
            if val is None:
                continue
            src.check()
            if locked and not src.admin:
                self._notes.append(f"setting {name} is locked by the site ({locked}): "
                                   f"the value from {src.where(key)} is ignored")
                continue
            if key.kind == "path" and not val.startswith("/"):
                from .errors import printable
                raise _error(f"setting {name} = {printable(val)} ({src.where(key)})",
                             "not an absolute path")
            if key.merge:
                merged.append((val, src.where(key), rank))
                continue
            got = (val, src.where(key), rank)
            break
        if merged:
            got = (_merged([m[0] for m in reversed(merged)]),
                   ", ".join(m[1] for m in reversed(merged)), merged[0][2])
        self._found[name] = got
        return got

    def get(self, name):
        return self.lookup(name)[0]


_CURRENT = []


def current():
    """The Settings of this process's environment, built once (the run
    path asks several keys)."""
    if not _CURRENT:
        _CURRENT.append(Settings())
    return _CURRENT[0]


def get(name, environ=None):
    """The value of setting `name` (KEYS) for this caller (environ None or
    os.environ: this process's, through current())."""
    return (current() if environ is None or environ is os.environ
            else Settings(environ)).get(name)


def driver_roots(environ=None, root=None, dev=None):
    """(driver root, dev root or None: its /dev); root, dev: --driver-root
    and --dev-root, which win (a dev root of the settings goes with theirs).
    This process's own environment is read through current(), once."""
    if root:
        return root, dev
    s = current() if environ is None or environ is os.environ else Settings(environ)
    return s.get("driver-root"), dev or s.get("dev-root")
