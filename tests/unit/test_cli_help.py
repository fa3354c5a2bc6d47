"""Every command's --help says what the command does: after the usage lines,
a paragraph of prose (not only an option list)."""
import os
import subprocess
import sys

import pytest

from gpusandbox import __main__ as entry

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NESTED = [["sim", "create"], ["sim", "destroy"], ["cdi", "generate"], ["cdi", "list"],
          ["cdi", "check"], ["runtime", "configure"], ["hook", "install"]]
COMMANDS = [[c] for c in [*entry._COMMANDS, "run", "oci", "version"]] + NESTED


def help_text(words):
    r = subprocess.run([sys.executable, "-m", "gpusandbox", *words, "--help"], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_help_has_a_description(words):
    paras = [p for p in help_text(words).split("\n\n") if p.strip()]
    assert paras[0].startswith("usage:"), paras[0]
    assert len(paras) > 1, f"gpusandbox {' '.join(words)} --help: usage only"
    first = paras[1].splitlines()[0]
    # A sentence, not an argparse section ("options:") nor an indented list.
    assert first not in ("options:", "positional arguments:", "commands:"), paras[1]
    assert not first.startswith(" ") and len(paras[1].split()) >= 4, paras[1]
