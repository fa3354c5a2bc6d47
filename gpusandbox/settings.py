"""Settings: what an administrator or the caller chooses for gpusandbox's OCI
doors (gpusandbox-oci, the gpusandbox-runtime wrapper, the precreate filter,
the hook), read one way by all of them.  docs/runtime.md ("Settings") is
the reference; this module is the only reader.

A key's value comes from the first source that names it:
  1. the caller's environment: the key's variable (KEYS);
  2. the file $GPUSANDBOX_OCI_CONF names, alone; without it,
     $HOME/.config/gpusandbox/oci.conf for a caller that is not real root,
     then /etc/gpusandbox/oci.conf;
  3. the key's default.
A value is taken from a file only when the file is a regular file of root's
or the caller's that no one else can write: otherwise the lookup fails (the
file decides what driver the container gets and what runtime the wrapper
execs).  A key with `within` (dev-root) is taken only from the source that
gave that key (driver-root) or an earlier one: GPUSANDBOX_DRIVER_ROOT alone
means that driver root with its own /dev, whatever a file says.

KEYS is the table (type, default, variable, older spellings); Settings
asks its sources in order through one method, lookup().  Another source
(the site file of TOML, or a second format) is one more class with raw(),
check() and where(), placed in sources().

bin/gpusandbox-runtime reads `runtime` in sh by the same rules
(tests/integration/test_settings_sh.py holds the two together).

Light: os and stat only, with linux.host (the OCI fast paths read settings).
"""
import os
import stat

from .linux import host

FILE_VAR = "GPUSANDBOX_OCI_CONF"
SYSTEM_FILE = "/etc/gpusandbox/oci.conf"
USER_FILE = ".config/gpusandbox/oci.conf"      # under $HOME
# Spellings older versions read, still accepted; `gpusandbox doctor` names them.
OLD_FILE_VARS = ("GPUSANDBOX_OCI_CONFIG",)
_WS = " \t"


class Key:
    __slots__ = ("name", "kind", "default", "env", "aliases", "within")

    def __init__(self, name, kind, default, env, aliases=(), within=None):
        self.name, self.kind, self.default, self.env = name, kind, default, env
        self.aliases, self.within = aliases, within


KEYS = {k.name: k for k in (
    Key("driver-root", "path", "/", "GPUSANDBOX_DRIVER_ROOT", ("driver_root",)),
    Key("dev-root", "path", None, "GPUSANDBOX_DEV_ROOT", ("dev_root",), within="driver-root"),
    Key("runtime", "path", None, "GPUSANDBOX_OCI_RUNTIME"),
)}
ALIASES = {a: k.name for k in KEYS.values() for a in k.aliases}
# Every variable the settings read: what a door that cleans its environment
# (the hook) keeps.
ENV_VARS = tuple(k.env for k in KEYS.values()) + (FILE_VAR,) + OLD_FILE_VARS


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
        if name not in KEYS:
            notes.append((f"unknown key {key!r}: ignored", "remove it or correct its spelling"))
            continue
        if name != key:
            notes.append((f"{key}: an older spelling, still read", f"write {name}"))
        values[name] = val.strip(_WS)
    return values, notes


class EnvSource:
    """The caller's environment: each key's own variable."""

    def __init__(self, environ):
        self.environ = environ

    def raw(self, key):
        return self.environ.get(key.env) or None

    def check(self):
        pass

    def where(self, key):
        return key.env


class FileSource:
    """A settings file (parse's format), read on first use."""

    def __init__(self, path):
        self.path = path
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


def sources(environ, system_file=SYSTEM_FILE):
    """The sources a lookup asks, in order."""
    out = [EnvSource(environ)]
    named = environ.get(FILE_VAR) or next((environ[v] for v in OLD_FILE_VARS
                                           if environ.get(v)), None)
    if named:
        return out + [FileSource(named)]
    home = environ.get("HOME") or ""
    if home.startswith("/") and not host.real_root():
        out.append(FileSource(os.path.join(home, USER_FILE)))
    return out + [FileSource(system_file)]


class Settings:
    """The settings one call of a door sees (each file read once)."""

    def __init__(self, environ=None, srcs=None):
        self.sources = sources(os.environ if environ is None else environ) if srcs is None \
            else srcs
        self._found = {}

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
        got = (key.default, None, len(self.sources))
        for rank, src in enumerate(self.sources[:last + 1]):
            val = src.raw(key)
            if val is None:
                continue
            src.check()
            if key.kind == "path" and not val.startswith("/"):
                from .errors import printable
                raise _error(f"setting {name} = {printable(val)} ({src.where(key)})",
                             "not an absolute path")
            got = (val, src.where(key), rank)
            break
        self._found[name] = got
        return got

    def get(self, name):
        return self.lookup(name)[0]


def get(name, environ=None):
    """The value of setting `name` (KEYS) for this caller."""
    return Settings(environ).get(name)


def driver_roots(environ=None):
    """(driver root, dev root or None: the driver root's /dev) for GPU
    injection."""
    s = Settings(environ)
    return s.get("driver-root"), s.get("dev-root")
