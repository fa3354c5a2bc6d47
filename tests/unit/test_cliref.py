"""Shell completion and man pages: generated from the parsers' own tables,
so they list exactly the options the parsers take; they load in bash and
zsh and complete commands, options and values; man renders the pages
without a warning; and generating them needs nothing beyond the standard
library (pip builds the package with setuptools alone)."""
import argparse
import os
import re
import shutil
import subprocess
import sys

import pytest

from gpusandbox import cli
from gpusandbox import __main__ as entry
from gpusandbox.cliref import man, model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN_OPTIONS = set(cli._OPTS) | set(cli._FLAGS) | {"-h", "--help"}


def gsbx(*args):
    r = subprocess.run([sys.executable, "-m", "gpusandbox", *args], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    d = tmp_path_factory.mktemp("completion")
    for shell in ("bash", "zsh"):
        (d / shell).write_text(gsbx("completion", shell))
    return d


def _parsers():
    """{command path: the argparse parser the command itself parses with}."""
    out = {}
    for path, (mod, fn, args) in model.ARGPARSE.items():
        p = model._call(mod, fn, *args)
        sub = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if sub:
            out.update({f"{path} {n}": sp for n, sp in sub[0].choices.items()})
        else:
            out[path] = p
    return out


def _argparse_options(p):
    return sorted(n for a in p._actions for n in a.option_strings)


# --- the lists cannot drift from the parsers --------------------------------

def bash_call(script, *words):
    r = subprocess.run(["bash", "-c", f'source "$0"; {" ".join(words)}', str(script)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(not shutil.which("bash"), reason="no bash")
def test_bash_lists_exactly_the_parsers_options(scripts):
    script = scripts / "bash"
    assert set(bash_call(script, "_gpusandbox_opts run").split()) == RUN_OPTIONS
    # slurm-oci run passes run's options on
    assert set(bash_call(script, "_gpusandbox_opts 'slurm-oci run'").split()) == RUN_OPTIONS
    for path, p in _parsers().items():
        got = bash_call(script, f"_gpusandbox_opts '{path}'").split()
        assert sorted(got) == _argparse_options(p), path
    commands = set(bash_call(script, "_gpusandbox_subs ''").split())
    assert commands == {*entry._COMMANDS, "run", "oci", "version", "help"}


def test_every_command_has_a_model():
    """A command the entry point dispatches is described by its parser, its
    option table or its help text (model.py), not by its name alone."""
    bare = [c.path for c in model.commands().subcommands
            if not (c.options or c.subcommands or c.positionals or c.text)]
    assert bare == ["help", "version"]


def _zsh_function_options(text, func):
    body = text.split(f"\n{func}() {{\n", 1)[1].split("\n}\n", 1)[0]
    return {m.group(1) for m in re.finditer(r"'\*?(?:\([^)]*\))?(-[-\w]+)[=+\[]", body)}


def test_zsh_lists_exactly_the_parsers_options(scripts):
    text = (scripts / "zsh").read_text()
    assert _zsh_function_options(text, "_gpusandbox__run") == RUN_OPTIONS
    for path, p in _parsers().items():
        func = "_gpusandbox" + "".join("__" + w for w in path.split())
        assert sorted(_zsh_function_options(text, func)) == _argparse_options(p), path


def _man_names(roff):
    text = roff.replace("\\-", "-")
    return {m.group(1) for m in re.finditer(r"\\fB(-[-\w]+)\\fR", text)}


def _man_section(roff, path):
    path = path.replace("-", "\\-")          # roff escapes a hyphen
    return roff.split(f'.SS "gpusandbox {path}"\n', 1)[1].split("\n.S", 1)[0]


def test_man_pages_document_exactly_the_parsers_options():
    top = model.commands()
    # run's page is its --help: every option of the parser's table and no other.
    assert _man_names(man.page(top, "run")) == RUN_OPTIONS
    main = man.page(top, "gpusandbox")
    for path, p in _parsers().items():
        want = set(_argparse_options(p)) - {"-h", "--help"}
        assert _man_names(_man_section(main, path)) == want, path
    for usage, _ in top.rows:
        assert f"\\fB{man.esc(usage)}\\fR" in main


def test_run_value_words_are_the_values_the_parser_takes():
    run = model.commands().find("run")
    for o in run.options:
        for n in o.names:
            if n in cli.CHOICES:
                # --help's metavar (auto|single|...) says what the parser takes
                assert o.metavar.split("|") == list(cli.CHOICES[n]), n
                assert o.words() == list(cli.CHOICES[n])


def test_generation_needs_only_the_standard_library(tmp_path):
    """What setup.py runs in pip's build environment (setuptools alone):
    the same pages and scripts as the installed CLI prints."""
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from gpusandbox.cliref import generate_share\n"
            "generate_share(sys.argv[2])\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in "
            "('attrs', 'yaml', 'requests', 'prctl', 'zstandard')]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code, REPO, str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "man/man1/gpusandbox.1").read_text() == gsbx("man")
    assert (tmp_path / "man/man1/gpusandbox-run.1").read_text() == gsbx("man", "run")
    assert (tmp_path / "bash-completion/completions/gpusandbox").read_text() == \
        gsbx("completion", "bash")
    assert (tmp_path / "zsh/site-functions/_gpusandbox").read_text() == \
        gsbx("completion", "zsh")


def test_run_imports_no_completion_or_man_code():
    code = ("import sys\n"
            "from gpusandbox.cli import parse_run_args\n"
            "parse_run_args(['--gpus', '0', '--net', 'none', '/img', 'true'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('gpusandbox.cliref') "
            "or m == 'argparse'))\n")
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert (r.returncode, r.stdout) == (0, "[]\n"), r.stderr


# --- the scripts work in the shells -----------------------------------------

def bash_complete(script, line):
    """COMPREPLY for `line` (the cursor at its end), as bash's completion
    would compute it: split into words at blanks, and at '=' (bash's
    COMP_WORDBREAKS makes `--net=h` the words --net, = and h)."""
    words = re.sub(r"=", " = ", line).replace("  ", " ").split(" ")
    if line.endswith("="):
        words = words[:-1]
    arr = " ".join("'" + w + "'" for w in words)
    prog = (f'source "$0"; COMP_WORDS=({arr}); COMP_CWORD={len(words) - 1}; '
            f'COMP_LINE="$1"; COMP_POINT=${{#COMP_LINE}}; _gpusandbox; '
            'printf "%s\\n" "${COMPREPLY[@]}"')
    r = subprocess.run(["bash", "-c", prog, str(script), line], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


@pytest.mark.skipif(not shutil.which("bash"), reason="no bash")
def test_bash_completion_loads_and_completes(scripts, tmp_path):
    r = subprocess.run(["bash", "-c", f"source <({sys.executable} -m gpusandbox completion "
                        "bash); complete -p gpusandbox"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("-F _gpusandbox gpusandbox")
    script = scripts / "bash"
    assert bash_complete(script, "gpusandbox pu") == ["pull"]
    assert bash_complete(script, "gpusandbox run --gpu-m") == ["--gpu-memory"]
    assert bash_complete(script, "gpusandbox run -it --userns s") == ["single", "subids"]
    assert bash_complete(script, "gpusandbox run --net=") == ["host", "none"]
    assert bash_complete(script, "gpusandbox run --net=h") == ["host"]
    assert bash_complete(script, "gpusandbox run --net=host --user") == ["--user", "--userns"]
    assert bash_complete(script, "gpusandbox sim cr") == ["create"]
    assert bash_complete(script, "gpusandbox sim create --brand g") == ["geforce"]
    assert bash_complete(script, "gpusandbox mps ") == ["up", "down", "status"]
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    assert bash_complete(script, f"gpusandbox run --driver-root {tmp_path}/a") == \
        [f"{tmp_path}/adir"]
    # After the image, the sandbox's command: a command name, not an option of run.
    assert "bash" in bash_complete(script, "gpusandbox run -v /a:/b /img bas")
    assert bash_complete(script, "gpusandbox run /img ls --gp") == []


ZDRIVE = r"""
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "unsetopt auto_list list_beep beep; PS1='<%#P>'; autoload -U compinit; compinit -u -D"
zpty -w z "source ${(q)1}"
zpty -w z 'compadd() { if (( ${@[(I)-[OAD]]} )); then builtin compadd "$@"; return; fi; local -a __h; builtin compadd -O __h "$@"; (( $#__h )) && print -r -- "<M>${(j: :)__h}</M>"; builtin compadd "$@"; }'
zpty -w z 'print -r -- ${(U):-ready}'
zpty -r z out '*READY*'
zpty -r z out '*[#%]P>*'
shift
for input in "$@"; do
  zpty -w -n z "$input"$'\t'
  zpty -w -n z $'\C-e\C-u'
  zpty -w z 'print -r -- ${(U):-done}'
  zpty -r z out '*DONE*'
  print -r -- "== $input"
  print -r -- "$out"
  # the next prompt: zle reads the next line's TAB as a key only once it runs
  zpty -r z out '*[#%]P>*'

done
zpty -d z
"""


@pytest.mark.skipif(not shutil.which("zsh"), reason="no zsh (apt install zsh)")
def test_zsh_completion_loads_and_completes(scripts, tmp_path):
    """In an interactive zsh (on a pty) after compinit: TAB after each line,
    typed once the prompt is up; compadd is wrapped to print what it is
    given."""
    (tmp_path / "drive.zsh").write_text(ZDRIVE)
    lines = ["gpusandbox pu", "gpusandbox run --gpu-m", "gpusandbox run -it --net ",
             "gpusandbox sim cr", "gpusandbox mps ", "gpusandbox inspect --j"]
    r = subprocess.run(["zsh", "-f", str(tmp_path / "drive.zsh"), str(scripts / "zsh"),
                        *lines], capture_output=True, text=True, timeout=120,
                       env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
                            "TERM": "dumb"})
    assert r.returncode == 0, r.stderr
    got = {}
    for block in r.stdout.split("== ")[1:]:
        line, _, out = block.partition("\n")
        got[line] = sorted({w for m in re.findall(r"<M>(.*?)</M>", out) for w in m.split()})
    assert got == {"gpusandbox pu": ["pull"], "gpusandbox run --gpu-m": ["--gpu-memory"],
                   "gpusandbox run -it --net ": ["host", "none"],
                   "gpusandbox sim cr": ["create"], "gpusandbox mps ": ["down", "status", "up"],
                   "gpusandbox inspect --j": ["--json"]}, r.stdout[-2000:]


# --- the man pages ----------------------------------------------------------

@pytest.mark.skipif(not shutil.which("man"), reason="no man (apt install man-db)")
@pytest.mark.parametrize("page", ["gpusandbox", "run"])
def test_man_renders_the_pages_without_warnings(tmp_path, page):
    path = tmp_path / f"{page}.1"
    path.write_text(gsbx("man", page))
    r = subprocess.run(["man", "--warnings", "-l", str(path)], capture_output=True,
                       text=True, timeout=60,
                       env={"PATH": os.environ["PATH"], "MANWIDTH": "80", "LC_ALL": "C.UTF-8",
                            "MAN_DISABLE_SECCOMP": "1"})
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    if page == "run":
        assert "--gpu-memory SIZE" in r.stdout and "EXIT STATUS" in r.stdout
    else:
        assert "gpusandbox pull" in r.stdout and "--tls-verify" in r.stdout


def test_man_output_writes_both_pages(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gpusandbox", "man", "-o", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(tmp_path)) == ["gpusandbox-run.1", "gpusandbox.1"]
    assert (tmp_path / "gpusandbox-run.1").read_text() == gsbx("man", "run")


def test_completion_without_a_shell_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "gpusandbox", "completion", "fish"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 125
    assert r.stderr == ("gpusandbox: error: completion: which shell?\n"
                        "hint: gpusandbox completion bash|zsh\n")
