"""`gpusandbox completion bash|zsh` and `gpusandbox man`: shell completion
and man pages generated from the parsers (model.py).  The package build
writes the same files (setup.py), so an install has them in share/."""
import sys

from ..errors import UsageError

COMPLETION_USAGE = """usage: gpusandbox completion bash|zsh

Print the shell completion script for bash or zsh, generated from the
command line's own option tables.  bash: source <(gpusandbox completion bash),
or save it as ~/.local/share/bash-completion/completions/gpusandbox.  zsh:
source <(gpusandbox completion zsh) after compinit, or save it as _gpusandbox
in a directory of $fpath.
"""
MAN_USAGE = """usage: gpusandbox man [gpusandbox|run] [-o DIR]

Print the man page gpusandbox(1), or gpusandbox-run(1) with `run`, in roff
(man -l <(gpusandbox man) shows it); with -o DIR, write both into DIR as
gpusandbox.1 and gpusandbox-run.1.
"""


def main_completion(argv):
    if argv[:1] in (["-h"], ["--help"]):
        sys.stdout.write(COMPLETION_USAGE)
        return 0
    if len(argv) != 1 or argv[0] not in ("bash", "zsh"):
        raise UsageError("completion: which shell?", None, "gpusandbox completion bash|zsh")
    from . import complete, model
    with _parser_imports():
        top = model.commands()
    sys.stdout.write((complete.bash if argv[0] == "bash" else complete.zsh)(top))
    return 0


def main_man(argv):
    if argv[:1] in (["-h"], ["--help"]):
        sys.stdout.write(MAN_USAGE)
        return 0
    out, pages = None, []
    it = iter(argv)
    for a in it:
        if a in ("-o", "--output"):
            out = next(it, None)
            if out is None:
                raise UsageError(f"man {a}", "needs a directory", "gpusandbox man -o DIR")
        elif a.startswith("--output="):
            out = a.partition("=")[2]
        elif a in ("gpusandbox", "run") and not pages:
            pages.append(a)
        else:
            raise UsageError(f"man {a}", "unknown argument", MAN_USAGE.splitlines()[0][7:])
    from . import man, model
    with _parser_imports():
        top = model.commands()
    if out is not None:
        for name in man.write(top, out):
            sys.stderr.write(f"gpusandbox: wrote {name}\n")
        return 0
    sys.stdout.write(man.page(top, pages[0] if pages else "gpusandbox"))
    return 0


# Where each generated file goes under an installation prefix.
SHARE = {"man/man1/gpusandbox.1": ("man", "gpusandbox"),
         "man/man1/gpusandbox-run.1": ("man", "run"),
         "bash-completion/completions/gpusandbox": ("bash", None),
         "zsh/site-functions/_gpusandbox": ("zsh", None)}


def generate_share(root):
    """Write the man pages and completion scripts under `root` as they go
    under a prefix's share/ (setup.py installs them from there); the paths
    written, relative to root."""
    import os
    from . import complete, man, model
    with _parser_imports():
        top = model.commands()
    for rel, (kind, arg) in SHARE.items():
        text = man.page(top, arg) if kind == "man" else getattr(complete, kind)(top)
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return list(SHARE)


class _parser_imports:
    """Reading the parsers needs only the standard library (pip builds the
    package with setuptools alone installed), except that importing the
    doctor package defines its result classes with attrs: without attrs, a
    stand-in that returns the classes as they are is enough for that
    (nothing is instantiated), and it is removed afterwards.  With attrs
    installed, the real one is used."""

    def __enter__(self):
        import importlib.util
        import types
        self.stub = None
        if importlib.util.find_spec("attrs") is None:
            stub = types.ModuleType("attrs")
            stub.define = lambda cls=None, **kw: cls if cls is not None else (lambda c: c)
            stub.Factory = stub.field = lambda *a, **kw: None
            stub.asdict = lambda *a, **kw: {}
            sys.modules["attrs"] = self.stub = stub
        return self

    def __exit__(self, *exc):
        if self.stub is not None and sys.modules.get("attrs") is self.stub:
            del sys.modules["attrs"]
            # The doctor modules built on the stand-in must not be used later.
            for name in [m for m in sys.modules if m.startswith("gpusandbox.doctor")]:
                del sys.modules[name]
        return False
