"""`gpusandbox runtime configure --runtime podman|docker|containerd`.

Registers the wrapper (bin/gpusandbox-runtime) with an engine, keeping the
rest of the file as it is: containers.conf and containerd's config.toml are
edited as text (only the lines of our own table are written; the result is
parsed back with tomllib before it replaces the file), daemon.json as JSON
(key order kept).  Every write is atomic and keeps the file's mode.
"""
import os
import re
import shutil
import sys

from gpusandbox.errors import UsageError
from gpusandbox.oci.options import parse_options

DEFAULTS = {"podman": "/etc/containers/containers.conf",
            "docker": "/etc/docker/daemon.json",
            "containerd": "/etc/containerd/config.toml"}
USAGE = """usage: gpusandbox runtime configure --runtime podman|docker|containerd [--config FILE]
                                   [--name NAME] [--path WRAPPER]
"""
# configure's options and their defaults (--path's: wrapper_path()).
OPTIONS = {"--runtime": None, "--config": None, "--name": "gpusandbox", "--path": None}
HELP = USAGE + """
Register the gpusandbox-runtime wrapper as a runtime of a container engine, editing only
that entry of the engine's configuration file (the rest, comments included, is kept; the
file is replaced atomically).  Then: podman --runtime NAME, docker run --runtime NAME.
See docs/hook.md.

  --runtime ENGINE  podman (containers.conf [engine.runtimes]), docker (daemon.json
                    "runtimes") or containerd (config.toml, a runc-shim runtime)
  --config FILE     the file to edit (default: /etc/containers/containers.conf,
                    /etc/docker/daemon.json, /etc/containerd/config.toml)
  --name NAME       the runtime's name (default gpusandbox)
  --path WRAPPER    the wrapper registered (default: gpusandbox-runtime beside this command)
"""


def _q(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _set_table(text, header, lines):
    """`text` with the table `[header]` holding exactly `lines` (the whole
    table replaced when present, appended otherwise)."""
    pat = re.compile(r"^[ \t]*\[" + re.escape(header) + r"\][ \t]*(#.*)?$", re.M)
    body = "".join(ln + "\n" for ln in lines)
    m = pat.search(text)
    if not m:
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return f"{text}{sep}[{header}]\n{body}"
    nxt = re.compile(r"^[ \t]*\[", re.M).search(text, m.end())
    rest = "\n" + text[nxt.start():] if nxt else ""
    return text[:m.end()] + "\n" + body + rest


def _set_key(text, header, key, value):
    """Set `key = value` inside table [header] (created when missing), other
    keys of the table kept."""
    pat = re.compile(r"^[ \t]*\[" + re.escape(header) + r"\][ \t]*(#.*)?$", re.M)
    m = pat.search(text)
    line = f"{key} = {value}\n"
    if not m:
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return f"{text}{sep}[{header}]\n{line}"
    nxt = re.compile(r"^[ \t]*\[", re.M).search(text, m.end())
    end = nxt.start() if nxt else len(text)
    section = text[m.end():end]
    kpat = re.compile(r"^[ \t]*" + re.escape(key) + r"[ \t]*=.*$\n?", re.M)
    if kpat.search(section):
        section = kpat.sub(line, section, count=1)
    else:
        section = "\n" + line + section.lstrip("\n") if section.strip() else "\n" + line + \
            ("\n" if nxt else "")
    return text[:m.end()] + section + text[end:]


def podman(text, name, path):
    return _set_key(text, "engine.runtimes", name, f"[{_q(path)}]")


def containerd(text, name, path):
    import tomllib
    try:
        version = tomllib.loads(text).get("version", 1) if text.strip() else 2
    except tomllib.TOMLDecodeError as e:
        raise UsageError("containerd config", f"not valid TOML: {e}") from None
    if version >= 3:
        plugin, top = "plugins.'io.containerd.cri.v1.runtime'", "io.containerd.cri.v1.runtime"
    elif version == 2:
        plugin, top = 'plugins."io.containerd.grpc.v1.cri"', "io.containerd.grpc.v1.cri"
    else:
        plugin, top = "plugins.cri", "cri"
    base = f"{plugin}.containerd.runtimes.{name}"
    text = _set_table(text, base, ['runtime_type = "io.containerd.runc.v2"'])
    text = _set_table(text, base + ".options", [f"BinaryName = {_q(path)}"])
    # containerd reads a `runtimes` table from the file in place of its
    # built-in one, so a file that names only ours loses the default `runc`
    # entry and the CRI plugin refuses to load ("no corresponding runtime
    # configured ... for default_runtime_name"): the default runtime gets
    # its built-in entry when the file has none.
    ctd = tomllib.loads(text).get("plugins", {}).get(top, {}).get("containerd", {})
    default = ctd.get("default_runtime_name", "runc")
    if isinstance(default, str) and default not in ctd.get("runtimes", {}):
        key = default if re.fullmatch(r"[A-Za-z0-9_-]+", default) else _q(default)
        text = _set_table(text, f"{plugin}.containerd.runtimes.{key}",
                          ['runtime_type = "io.containerd.runc.v2"'])
    if not re.search(r"^version\s*=", text, re.M):
        text = "version = 2\n\n" + text
    return text


def docker(text, name, path):
    import json
    try:
        doc = json.loads(text) if text.strip() else {}
    except ValueError as e:
        raise UsageError("daemon.json", f"not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.setdefault("runtimes", {}), dict):
        raise UsageError("daemon.json", "not a JSON object with a `runtimes` object")
    doc["runtimes"][name] = {"path": path}
    return json.dumps(doc, indent=4) + "\n"


def _check(kind, text):
    if kind == "docker":
        return
    import tomllib
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{kind} config after the edit", f"not valid TOML ({e}); "
                         "the file was left as it was") from None


def wrapper_path():
    here = os.path.dirname(os.path.abspath(sys.argv[0] or ""))
    cand = os.path.join(here, "gpusandbox-runtime")
    return cand if os.access(cand, os.X_OK) else shutil.which("gpusandbox-runtime") or cand


def configure(argv):
    opts = dict(OPTIONS)
    if parse_options(argv, opts, "runtime configure", USAGE.strip(), usage=HELP) is None:
        return 0
    kind = opts["--runtime"]
    if kind not in DEFAULTS:
        raise UsageError(f"runtime configure --runtime {kind}", "unknown engine",
                         hint="use podman, docker or containerd")
    if not re.fullmatch(r"[A-Za-z0-9_-]+", opts["--name"]):
        raise UsageError(f"--name {opts['--name']}", "use letters, digits, - and _")
    path = os.path.abspath(opts["--path"] or wrapper_path())
    conf = opts["--config"] or DEFAULTS[kind]
    try:
        with open(conf, encoding="utf-8") as f:
            text = f.read()
        mode = os.stat(conf).st_mode & 0o777
    except FileNotFoundError:
        text, mode = "", 0o644
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"reading {conf}", str(e)) from None
    new = {"podman": podman, "docker": docker, "containerd": containerd}[kind](
        text, opts["--name"], path)
    _check(kind, new)
    d = os.path.dirname(os.path.abspath(conf))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(conf)}.gpusandbox-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(new)
    os.chmod(tmp, mode)
    os.rename(tmp, conf)
    sys.stderr.write(f"gpusandbox: registered runtime {opts['--name']} ({path}) in {conf}\n")
    return 0


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(HELP)
        return 0 if argv else 125
    if argv[0] != "configure":
        raise UsageError(f"runtime {argv[0]}", "unknown subcommand", hint=USAGE.strip())
    return configure(argv[1:])
