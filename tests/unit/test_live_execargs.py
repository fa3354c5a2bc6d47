"""`gpusandbox exec` reads its options from one table (live/execcli.py
EXEC_OPTIONS) without argparse; what it reads is what the argparse parser
built from the same table (--help, the reference) reads, and anything else
is left to that parser, whose message the user then gets."""
import pytest

from gpusandbox.errors import UsageError
from gpusandbox.live import execcli

SAME = [
    ["box", "sh", "-c", "echo hi"],
    ["-it", "box", "bash"],
    ["-t", "-e", "A=1", "--env", "B=2", "-eC=3", "--env=D=4", "box", "env"],
    ["-w", "/work", "--workdir=/x", "-u", "1000:100", "box", "id", "-u"],
    ["--job", "12", "--step", "0", "--rank", "3", "py-spy", "dump", "--pid", "1"],
    ["--", "box", "true"],
    ["box", "--", "ls", "-l"],
    ["-ti", "-w/tmp", "box", "-e", "not-an-option-of-exec"],
    [],
]


@pytest.mark.parametrize("argv", SAME, ids=lambda a: " ".join(a) or "empty")
def test_the_table_reader_reads_what_argparse_reads(argv):
    fast = execcli._exec_args(argv)
    ref = execcli.exec_parser().parse_args(argv)
    assert fast is not None
    for _, dest, _, _ in execcli.EXEC_OPTIONS:
        assert getattr(fast, dest) == getattr(ref, dest), dest
    assert fast.command == ref.command


@pytest.mark.parametrize("argv", [["--help"], ["-x", "box"], ["--wor", "/x", "box"],
                                  ["-e"], ["-w", "-t", "box"], ["--tty=1", "box"]])
def test_anything_else_is_left_to_argparse(argv):
    assert execcli._exec_args(argv) is None


def test_a_mistake_is_argparses_one_line():
    with pytest.raises(UsageError) as e:
        execcli.main_exec(["-x", "box", "true"])
    assert "unrecognized arguments" in e.value.line() or "-x" in e.value.line()


def test_exec_loads_no_argparse_and_no_json():
    import subprocess
    import sys
    code = ("import sys; import gpusandbox.live.execcli as e; "
            "e._exec_args(['-it', 'box', 'sh']); "
            "print(sorted(m for m in ('argparse', 'json') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
