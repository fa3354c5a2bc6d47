"""The configuration files of TOML: the site's (/etc/gpusandbox/gpusandbox.conf
and /etc/gpusandbox/conf.d/*.conf in lexical order) and the user's
($XDG_CONFIG_HOME/gpusandbox/gpusandbox.conf).  docs/config.md is the
reference; settings.py holds the table of keys and asks these files through
SiteSource and UserSource.

A file is read only when it is a regular file that no one else can write,
owned by root (a site file) or by root or the caller (a user file); a file
that fails is skipped with one warning line naming it and the fix (its
values could steer what the sandbox mounts).  Inside a user namespace the
host's root shows as the overflow uid (linux.host.root_uids).

Every key is checked against the table: an unknown key or a value of the
wrong type is refused with the file, the line and the key.  Site-only keys
(limits, forbidden binds, image policy, locks, hooks) in a user file are
refused the same way: a user file never widens what the site decides.

tomllib is imported only when a file is there: a node without configuration
pays two stat calls per launch."""
import os
import stat

from .errors import UsageError
from .linux import host

SITE_DIR = "/etc/gpusandbox"
SITE_FILE = "gpusandbox.conf"
DROPIN_DIR = "conf.d"
USER_FILE = "gpusandbox/gpusandbox.conf"       # under $XDG_CONFIG_HOME or ~/.config
MAX_FILE = 1 << 20


def site_files(site_dir=SITE_DIR):
    """The site file, then the drop-ins in lexical order (only names ending
    in .conf: an editor's backup is not read)."""
    out = [os.path.join(site_dir, SITE_FILE)]
    try:
        names = sorted(n for n in os.listdir(os.path.join(site_dir, DROPIN_DIR))
                       if n.endswith(".conf") and not n.startswith("."))
    except OSError:
        names = []
    return out + [os.path.join(site_dir, DROPIN_DIR, n) for n in names]


def user_file(environ):
    """$XDG_CONFIG_HOME/gpusandbox/gpusandbox.conf (else ~/.config/...), or
    None without an absolute home."""
    xdg = environ.get("XDG_CONFIG_HOME") or ""
    if xdg.startswith("/"):
        return os.path.join(xdg, USER_FILE)
    home = environ.get("HOME") or ""
    return os.path.join(home, ".config", USER_FILE) if home.startswith("/") else None


class ConfError(UsageError):
    """A key or value of a configuration file refused (exit 125)."""


_MOUNT_FIELDS = {"source": str, "destination": str, "read-only": bool, "optional": bool}


def check_value(key, val, at):
    """`val` checked against `key`'s kind (settings.KEYS); ConfError naming
    `at` (FILE:LINE or a variable) and the key."""
    from .errors import printable
    bad = None
    k = key.kind
    if k in ("path", "dir"):
        if not isinstance(val, str) or not val.startswith("/"):
            bad = "an absolute path (a string starting with /)"
    elif k == "bool":
        if not isinstance(val, bool):
            bad = "true or false"
    elif k == "text":
        if not isinstance(val, str) or not val:
            bad = "a string"
    elif k == "choice":
        if val not in key.choices:
            bad = " or ".join(repr(c) for c in key.choices)
    elif k == "size":
        from .mountopt import size_bytes
        if isinstance(val, int) and not isinstance(val, bool) and val > 0:
            val = str(val)
        if not isinstance(val, str) or not size_bytes(val):
            bad = "a size such as \"8g\" or \"512m\""
    elif k in ("globs", "names"):
        if not isinstance(val, list) or not all(isinstance(v, str) and v for v in val):
            bad = "a list of strings"
        elif k == "globs" and not all(v.startswith("/") or "/" in v or "*" in v for v in val):
            bad = "a list of globs"
    elif k == "env":
        if not isinstance(val, dict) or not all(isinstance(v, str) for v in val.values()) \
                or not all(n and "=" not in n and "\0" not in n for n in val):
            bad = "a table of NAME = \"value\" strings"
    elif k == "mounts":
        if not isinstance(val, list) or not all(isinstance(m, dict) for m in val):
            bad = "[[mounts]] tables"
        else:
            for m in val:
                for f, v in m.items():
                    if f not in _MOUNT_FIELDS:
                        raise ConfError(f"{at}: key {key.name}.{f}", "unknown field",
                                        "fields: " + ", ".join(_MOUNT_FIELDS))
                    if not isinstance(v, _MOUNT_FIELDS[f]):
                        raise ConfError(f"{at}: key {key.name}.{f}",
                                        f"expected a {_MOUNT_FIELDS[f].__name__}")
                if not isinstance(m.get("source"), str) or not m["source"].startswith("/"):
                    raise ConfError(f"{at}: key {key.name}", "each needs source = an absolute "
                                    "path", 'example: source = "/scratch/{user}"')
                if not m.get("destination", m["source"]).startswith("/"):
                    raise ConfError(f"{at}: key {key.name}.destination",
                                    "not an absolute path")
    if bad:
        raise ConfError(f"{at}: key {key.name} = {printable(str(val))[:60]}",
                        f"expected {bad}")
    return val


def line_of(text, table, key):
    """The 1-based line of `key = ...` under [table] / [[table]] (table None:
    the top level), or None: tomllib reports no positions of keys."""
    cur = None
    for n, raw in enumerate(text.split("\n"), 1):
        s = raw.strip()
        if s.startswith("["):
            cur = s.strip("[]").strip().strip('"')
            continue
        k = s.partition("=")[0].strip().strip('"').strip("'")
        if "=" in s and k == key and cur == table:
            return n
    return None


def owner_problem(st, allow_caller):
    """Why a file of stat `st` must not be read, or None."""
    uid = os.geteuid()
    roots = host.root_uids()
    if st.st_uid not in roots and not (allow_caller and st.st_uid == uid):
        who = "root or you" if allow_caller else "root"
        return f"owned by uid {st.st_uid}, not by {who}"
    if st.st_mode & 0o022:
        return f"mode {st.st_mode & 0o7777:04o} lets others write to it"
    return None


def read(path, allow_caller):
    """(text, None) of a file fit to read; (None, warning) of one that is
    skipped; (None, None) when it is not there."""
    try:
        # A symlink is followed (dotfiles, configuration management): the
        # checks below are of the file it names, which only its owner can
        # replace when no one else may write to it or its directory.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    except PermissionError:
        if allow_caller:
            return None, None   # under a home that is not the caller's (sudo without -H)
        return None, f"configuration file {path} skipped: permission denied"
    except OSError as e:
        return None, f"configuration file {path} skipped: {e.strerror}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"configuration file {path} skipped: not a regular file"
        why = owner_problem(st, allow_caller)
        if why is None:
            # The directory too: someone who may write there may swap the file.
            try:
                dst = os.stat(os.path.dirname(os.path.realpath(path)) or ".")
                if owner_problem(dst, allow_caller) and dst.st_mode & 0o022 and \
                        not dst.st_mode & stat.S_ISVTX:
                    why = f"its directory {os.path.dirname(path)} is writable by others"
            except OSError:
                pass
        if why is not None:
            fix = "chown root:root" if not allow_caller else "chown $USER"
            return None, (f"configuration file {path} skipped: {why} "
                          f"({fix} {path}; chmod go-w {path})")
        data = os.read(fd, MAX_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE:
        return None, f"configuration file {path} skipped: larger than {MAX_FILE} bytes"
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError:
        raise ConfError(f"configuration file {path}", "not UTF-8 text") from None


def parse(text, path):
    """The TOML document of `text`, or ConfError with the line tomllib names."""
    import tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfError(f"configuration file {path}", f"not valid TOML: {e}",
                        "see docs/config.md for the format") from None


class Conf:
    """One file's checked values: {key: value}, the line each was given on,
    and the keys it locks (a site file)."""

    def __init__(self, path, values, lines, locks=()):
        self.path = path
        self.values = values
        self.lines = lines
        self.locks = set(locks)

    def where(self, key):
        n = self.lines.get(key)
        return f"{self.path}:{n}" if n else self.path


def load(path, keys, site, warn):
    """A Conf of the file at `path` (None when it is not there or skipped,
    with `warn(line)` called for a skipped one).  `keys`: settings.KEYS;
    `site`: a site file (site-only keys and `lock` allowed, root's only)."""
    text, problem = read(path, allow_caller=not site)
    if problem:
        warn(problem)
    if text is None:
        return None
    doc = parse(text, path)
    values, lines, locks = {}, {}, ()
    for name, val in doc.items():
        n = line_of(text, None, name)
        at = f"{path}:{n}" if n else path
        if name == "lock":
            if not site:
                raise ConfError(f"{at}: key 'lock'", "only a site file may lock keys",
                                "remove it from your file")
            if not isinstance(val, list) or not all(isinstance(v, str) for v in val):
                raise ConfError(f"{at}: key 'lock'", "expected a list of key names")
            bad = [v for v in val if v not in keys]
            if bad:
                raise ConfError(f"{at}: key 'lock'", f"unknown key {bad[0]!r}",
                                "name keys of docs/config.md")
            locks = val
            continue
        key = keys.get(name)
        if key is None:
            from .suggest import close
            guess = close(name, list(keys))
            raise ConfError(f"{at}: unknown key {name!r}", None,
                            f"did you mean {guess}?" if guess else
                            "see docs/config.md for the keys")
        if key.site_only and not site:
            raise ConfError(f"{at}: key {name!r}", "only the site configuration may set it",
                            "remove it from your file (ask your administrator)")
        values[name] = key.check(val, at, text)
        lines[name] = n
    return Conf(path, values, lines, locks)
