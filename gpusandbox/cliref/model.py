"""The command line as data, read from the parsers themselves: `run`'s
option table (cli._OPTS, _FLAGS, CHOICES) and its --help text, the
argparse parsers of the report commands, and the option tables of the
hand-parsed container-stack commands.  Shell completion and the man pages
are generated from this, so neither can list an option the parsers do not
take, nor miss one they do (tests/unit/test_cliref.py holds them to it).

The modules imported here need only the standard library (and attrs, for
which cliref._parser_imports stands in when it is missing): setup.py runs
this in pip's build environment."""
import importlib
import re

# Metavars whose value is a host path: completed as files, or directories.
_DIR_WORDS = ("DIR",)
_FILE_WORDS = ("FILE", "PATH", "SRC", "HOST", "WRAPPER", "SPEC", "PROFILE", "BUNDLE")


class Opt:
    """One option: its spellings, the metavar of its value (None: a flag),
    what it does, and the words it takes (choices) or suggests."""

    def __init__(self, names, metavar=None, help="", choices=None, repeat=False):
        self.names = list(names)
        self.metavar = metavar
        self.help = help or ""
        self.choices = list(choices) if choices else None
        self.repeat = repeat

    @property
    def takes_value(self):
        return self.metavar is not None

    def words(self):
        """The literal values to offer: the choices, else the lowercase
        alternatives of the metavar (all|none|auto|LIST: all, none, auto)."""
        if self.choices:
            return self.choices
        if not self.metavar or ":" in self.metavar or "=" in self.metavar:
            return []
        return [w for w in self.metavar.split("|") if re.fullmatch(r"[a-z][a-z0-9_-]*", w)]

    def value_kind(self):
        """'dir', 'file' or None: how a shell completes the value."""
        m = self.metavar or ""
        if "=" in m:
            return None          # KEY=VALUE, type=bind,src=...: not a path
        if any(w in m for w in _DIR_WORDS):
            return "dir"
        if any(w in m for w in _FILE_WORDS):
            return "file"
        return None


class Cmd:
    """A command or subcommand: `path` is its words after `gpusandbox`."""

    def __init__(self, path, summary="", description="", usage="", options=(),
                 subcommands=(), positionals=(), text=None, entries=None, rest="files"):
        self.path = path
        self.summary = summary
        self.description = description
        self.usage = usage
        self.options = list(options)
        self.subcommands = list(subcommands)
        # [(metavar, help, choices)] in order
        self.positionals = list(positionals)
        # Hand-written help, shown as it is (commands without a parser object).
        self.text = text
        # run's --help as [(section, [(option column, help lines)])]
        self.entries = entries
        # What follows the options and positionals: "files", or "command" (run).
        self.rest = rest
        # The top level's usage lines: [(usage, description)]
        self.rows = []

    @property
    def name(self):
        return self.path.split()[-1] if self.path else "gpusandbox"

    def option_names(self):
        return sorted({n for o in self.options for n in o.names})

    def find(self, path):
        if self.path == path:
            return self
        for c in self.subcommands:
            hit = c.find(path)
            if hit is not None:
                return hit
        return None

    def walk(self):
        yield self
        for c in self.subcommands:
            yield from c.walk()


# --- run --------------------------------------------------------------------

def parse_run_help(text):
    """run's --help as (intro paragraphs, [(section, [(left, [help lines])])],
    trailing paragraphs).  An option line starts with two spaces and '-';
    its help starts after two or more spaces, or on the lines below, which
    are indented further."""
    lines = text.splitlines()
    i = 0
    while i < len(lines) and not re.fullmatch(r"[A-Z][\w ]*:", lines[i]):
        i += 1
    intro, body, tail = lines[:i], lines[i:], []
    sections = []
    for j, ln in enumerate(body):
        if not ln.strip():
            tail = body[j + 1:]
            break
        if re.fullmatch(r"[A-Za-z][\w ]*:", ln):
            sections.append((ln[:-1], []))
        elif re.match(r"  -", ln):
            parts = re.split(r"\s{2,}", ln.strip())
            left = [p for p in parts if p.startswith("-")]
            helps = parts[len(left):]
            sections[-1][1].append(("  ".join(left), [" ".join(helps)] if helps else []))
        else:
            sections[-1][1][-1][1].append(ln.strip())
    return intro, sections, tail


def _option_column(left):
    """[(names, metavar)] of one option column of run's --help: `-v, --bind
    SRC:DST` is one option spelled two ways, `--memory N  --cpus N` two."""
    out = []
    for group in re.split(r"\s{2,}|(?<!,)\s+(?=-)", left):
        names, metavar = [], None
        for alias in re.split(r",\s*(?=-)", group):
            name, _, meta = alias.strip().partition(" ")
            names.append(name)
            metavar = meta.strip() or metavar
        out.append((names, metavar))
    return out


def run_cmd():
    """run's options: the names and values of the parser's tables (cli._OPTS,
    _FLAGS, CHOICES), grouped, described and given metavars by its --help."""
    from .. import cli
    intro, sections, tail = parse_run_help(cli.RUN_HELP)
    table = set(cli._OPTS) | set(cli._FLAGS)
    opts, assigned = [], set()
    for _, entries in sections:
        for left, help_lines in entries:
            for names, metavar in _option_column(left):
                names = [n for n in names if n in table and n not in assigned]
                if not names:
                    continue      # -h (handled before the table), or a second entry (-v PATH)
                assigned.update(names)
                takes = names[0] in cli._OPTS
                choices = next((cli.CHOICES[n] for n in names if n in cli.CHOICES), None)
                opts.append(Opt(names, (metavar or "VALUE") if takes else None,
                                " ".join(help_lines), choices, repeat=True))
    # An option the help does not show still completes (the tests refuse it).
    for n in sorted(table - assigned):
        opts.append(Opt([n], "VALUE" if n in cli._OPTS else None, "", cli.CHOICES.get(n),
                        repeat=True))
    opts.append(Opt(["-h", "--help"], help="show this help"))
    return Cmd("run", description="\n".join(intro[2:]).strip(), usage=cli.RUN_USAGE,
               options=opts, positionals=[("IMAGE", "the image", None)],
               entries=sections, text="\n".join(tail).strip(), rest="command")


# --- argparse commands ------------------------------------------------------

def from_argparse(path, parser, summary=""):
    import argparse
    opts, positionals, subs = [], [], []
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in act._choices_actions}
            for name, sub in act.choices.items():
                subs.append(from_argparse(f"{path} {name}", sub, helps.get(name, "")))
            continue
        help_ = act.help if act.help is not argparse.SUPPRESS else None
        if help_ and "%" in help_:
            help_ = help_ % dict(vars(act), prog=parser.prog)
        if act.option_strings:
            takes = act.nargs != 0
            metavar = None
            if takes:
                metavar = act.metavar or (
                    "|".join(act.choices) if act.choices else act.dest.upper())
            opts.append(Opt(act.option_strings, metavar, help_,
                            list(act.choices) if act.choices else None,
                            repeat=isinstance(act, argparse._AppendAction)))
        else:
            positionals.append((act.metavar or act.dest, help_ or "",
                                list(act.choices) if act.choices else None))
    return Cmd(path, summary, parser.description or "", "", opts, subs, positionals)


def _call(modname, func, *args):
    return getattr(importlib.import_module(modname), func)(*args)


# The argparse commands: path -> (module, function returning the parser, args).
ARGPARSE = {
    "pull": ("gpusandbox.image.cli", "pull_parser", ()),
    "images": ("gpusandbox.image.cli", "images_parser", ()),
    "rmi": ("gpusandbox.image.cli", "rmi_parser", ()),
    "prune": ("gpusandbox.image.cli", "prune_parser", ()),
    "inspect": ("gpusandbox.image.cli", "inspect_parser", ()),
    "info": ("gpusandbox.gpu.report", "_parser", ("info", False)),
    "config": ("gpusandbox.configcli", "parser", ()),
    "list": ("gpusandbox.gpu.report", "_parser", ("list", True)),
    "doctor": ("gpusandbox.doctor", "_parser", ()),
    "sim": ("gpusandbox.sim.cli", "parser", ()),
    "mps": ("gpusandbox.gpu.mpscli", "parser", ()),
    "ps": ("gpusandbox.live.cli", "ps_parser", ()),
    "exec": ("gpusandbox.live.execcli", "exec_parser", ()),
    "stop": ("gpusandbox.live.cli", "stop_parser", ()),
    "kill": ("gpusandbox.live.cli", "kill_parser", ()),
    "logs": ("gpusandbox.live.cli", "logs_parser", ()),
    "wait": ("gpusandbox.live.cli", "wait_parser", ()),
    "rm": ("gpusandbox.live.cli", "rm_parser", ()),
    "slurm": ("gpusandbox.hpc.spank", "_parser", ()),
    "cdi generate": ("gpusandbox.oci.cdi.cli", "generate_parser", ()),
    "cdi list": ("gpusandbox.oci.cdi.cli", "list_parser", ()),
    "cdi check": ("gpusandbox.oci.cdi.cli", "check_parser", ()),
}


# --- the hand-parsed commands -----------------------------------------------

def _table_opts(table, metavars, helps=None, choices=None):
    return [Opt([n], metavars.get(n, "VALUE"), (helps or {}).get(n, ""),
                (choices or {}).get(n)) for n in table]


def _hook():
    from ..oci import hook
    install = Cmd("hook install", "write podman's hooks.d entry for the hook",
                  options=_table_opts(hook.INSTALL_OPTIONS,
                                      {"--dir": "DIR", "--stage": "STAGE",
                                       "--driver-root": "DIR", "--dev-root": "DIR"},
                                      choices={"--stage": [*hook.STAGES, "precreate"]}))
    stages = [Cmd(f"hook {s}", f"the hook at the {s} stage (OCI state on stdin)")
              for s in hook.STAGES]
    return Cmd("hook", text=hook.HELP, subcommands=[install, *stages])


def _runtime():
    from ..oci import runtimeconf as rc
    conf = Cmd("runtime configure", "register gpusandbox-runtime with an engine",
               options=_table_opts(rc.OPTIONS, {"--runtime": "ENGINE", "--config": "FILE",
                                                "--name": "NAME", "--path": "WRAPPER"},
                                   choices={"--runtime": list(rc.DEFAULTS)}))
    return Cmd("runtime", text=rc.HELP, subcommands=[conf])


def _slurm_oci(run):
    from ..hpc import slurmoci
    subs = [Cmd("slurm-oci run", "start the step's task in BUNDLE", options=run.options,
                positionals=[("BUNDLE", "", None)])]
    subs += [Cmd(f"slurm-oci {op}", f"answer slurmstepd's {op}",
                 positionals=[("BUNDLE", "", None)]) for op in ("state", "kill", "delete")]
    return Cmd("slurm-oci", text=slurmoci.HELP, subcommands=subs)


def _oci():
    from ..oci.runtime import cli as rt
    # runc's commands: those that read the state root, and the three that do not.
    cmds = sorted(rt.STATE_COMMANDS | {"spec", "features", "version"})
    flags = sorted(rt.GLOBAL_FLAG - {"-h", "--help"})
    opts = [Opt([n], "VALUE") for n in sorted(rt.GLOBAL_VALUE)] + [Opt([n]) for n in flags]
    opts.append(Opt(["-h", "--help"]))
    return Cmd("oci", text=rt.USAGE, options=opts,
               subcommands=[Cmd(f"oci {c}") for c in cmds])


def _filter():
    from ..oci import filter as flt
    return Cmd("oci-filter", text=flt.HELP)


def _cdi(subs):
    from ..oci.cdi import cli as cdicli
    return Cmd("cdi", text=cdicli.USAGE, subcommands=subs)


def summaries():
    """{command: one-line summary} and [(usage, description)] from the top
    usage (`gpusandbox --help`)."""
    from .. import __main__ as entry
    rows = []
    for ln in entry.USAGE.split("commands:", 1)[1].splitlines():
        if not ln.strip():
            continue
        if ln.startswith("  ") and ln[2] != " ":
            parts = re.split(r"\s{2,}", ln.strip(), maxsplit=1)
            rows.append([parts[0], parts[1] if len(parts) > 1 else ""])
        elif rows:
            rows[-1][1] = (rows[-1][1] + " " + ln.strip()).strip()
    first = {}
    for usage, desc in rows:
        first.setdefault(usage.split()[0], desc)
    return first, [tuple(r) for r in rows]


def commands():
    """The whole command line: a Cmd for `gpusandbox` whose subcommands are
    every command, each with its options and subcommands."""
    from .. import __main__ as entry
    first, rows = summaries()
    run = run_cmd()
    parsed = {}
    for path, (mod, fn, args) in ARGPARSE.items():
        parsed[path] = from_argparse(path, _call(mod, fn, *args))
    subs = {"run": run, "hook": _hook(), "runtime": _runtime(), "slurm-oci": _slurm_oci(run),
            "oci": _oci(), "oci-filter": _filter(),
            "cdi": _cdi([parsed.pop(p) for p in ("cdi generate", "cdi list", "cdi check")]),
            "version": Cmd("version"), "help": Cmd("help"),
            "completion": Cmd("completion", positionals=[("SHELL", "", ["bash", "zsh"])]),
            "man": Cmd("man", options=[Opt(["-o", "--output"], "DIR",
                                           "write the pages into DIR (as gpusandbox.1 and "
                                           "gpusandbox-run.1) instead of printing one")],
                       positionals=[("PAGE", "", ["gpusandbox", "run"])])}
    subs.update(parsed)
    # A command added to the entry point without a model here still
    # completes by name (tests/unit/test_cliref.py asks for its model).
    names = sorted({*entry._COMMANDS, "run", "oci", "version", "help"})
    top = Cmd("", options=[Opt(["-h", "--help"]), Opt(["--version"])],
              subcommands=[subs.get(n) or Cmd(n) for n in names])
    for c in top.subcommands:
        c.summary = c.summary or first.get(c.name, "")
        if c.name == "sim":
            for s in c.subcommands:
                s.summary = s.summary or s.description
    top.rows = rows
    return top
