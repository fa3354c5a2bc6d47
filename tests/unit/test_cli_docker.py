"""docker/podman spellings on the run command line, and the suggestions for
what is mistyped: parsing only (tests/integration/test_cli_docker.py runs
them for real)."""
import pytest

from gpusandbox.cli import RUN_HELP, RUN_USAGE, parse_run_args
from gpusandbox.errors import UsageError
from gpusandbox.gpu.request import normalise
from gpusandbox.mountopt import parse_mount, size_bytes
from gpusandbox.spec import Bind, Tmpfs
from gpusandbox.suggest import unknown_command


def parse(*opts):
    return parse_run_args([*opts, "/img", "cmd"])


def refused(*opts):
    with pytest.raises(UsageError) as ei:
        parse_run_args([*opts, "/img", "cmd"] if opts else [])
    assert ei.value.code == 125
    return ei.value


@pytest.mark.parametrize("opts", [["-it"], ["-ti"], ["-i", "-t"], ["--interactive", "--tty"],
                                  ["-t", "--rm", "-i"]])
def test_interactive_tty_spellings(opts):
    spec = parse(*opts)
    assert spec.tty is True and spec.image == "/img" and spec.argv == ["cmd"]


def test_i_and_rm_alone_change_nothing():
    # --rm only matters with -d (a detached sandbox's record removed at its end).
    plain = parse()
    for opts in (["-i"], ["--rm"], ["--interactive"]):
        spec = parse(*opts)
        assert spec.tty is False
        assert {s: getattr(spec, s) for s in spec.__slots__ if s not in ("binds", "auto_remove")} \
            == {s: getattr(plain, s) for s in plain.__slots__ if s not in ("binds", "auto_remove")}


def test_name_and_detach_are_parsed_and_a_bad_name_refused():
    spec = parse("-d", "--name", "train.1_a-b", "--rm")
    assert spec.detach and spec.name == "train.1_a-b" and spec.auto_remove
    assert parse("-dit").detach
    for bad in ("", "-x", ".hidden", "a/b", "a b", "x" * 65, "caf\u00e9"):
        e = refused("--name", bad)
        assert e.line().startswith("invalid sandbox name"), bad
        assert "letters, digits" in e.hint


def test_short_clusters_take_a_value_last():
    spec = parse("-itv", "/a:/b:ro", "-w/tmp", "-eK=V", "-u", "7:8")
    assert spec.tty and spec.workdir == "/tmp" and spec.env_set == ["K=V"]
    assert spec.user == (7, 8)
    assert [(b.src, b.dst, b.rw) for b in spec.binds] == [("/a", "/b", False)]
    assert parse("-w=/w").workdir == "/w"


def test_v_with_one_path_binds_it_at_the_same_path():
    (b,) = parse("-v", "/scratch/data/").binds
    assert (b.src, b.dst, b.rw) == ("/scratch/data", "/scratch/data", True)


@pytest.mark.parametrize("value,want", [
    ("type=bind,src=/a,dst=/b", ("/a", "/b", True)),
    ("type=bind,source=/a,target=/b,ro", ("/a", "/b", False)),
    ("type=bind,src=/a,destination=/b,readonly", ("/a", "/b", False)),
    ("type=bind,src=/a,dst=/b,readonly=false", ("/a", "/b", True)),
    ("type=bind,src=/a,dst=/b,readonly=1,bind-propagation=rslave", ("/a", "/b", False)),
    ('type=bind,"src=/a,b",dst=/c/./d/', ("/a,b", "/c/d", True)),
    ("Type=bind,SRC=/a,Dst=/b,consistency=cached", ("/a", "/b", True)),
])
def test_mount_bind(value, want):
    (b,) = parse("--mount", value).binds
    assert isinstance(b, Bind) and (b.src, b.dst, b.rw) == want


def test_mount_tmpfs_and_order_with_v():
    spec = parse("--mount", "type=tmpfs,dst=/scratch", "-v", "/a:/scratch/a",
                 "--mount=type=tmpfs,target=/t,tmpfs-size=64m,tmpfs-mode=700,ro")
    t1, b, t2 = spec.binds
    assert isinstance(t1, Tmpfs) and (t1.dst, t1.size, t1.mode, t1.rw) == \
        ("/scratch", None, 0o1777, True)
    assert t1.options() == ("source=tmpfs", "mode=1777")
    assert b.dst == "/scratch/a"
    assert (t2.dst, t2.size, t2.mode, t2.rw) == ("/t", 64 << 20, 0o700, False)
    assert t2.options() == ("source=tmpfs", "mode=700", f"size={64 << 20}")


@pytest.mark.parametrize("text,want", [("4096", 4096), ("64m", 64 << 20), ("1g", 1 << 30),
                                       ("1GiB", 1 << 30), ("512kb", 512 << 10), ("m", None),
                                       ("-1", None), ("1.5g", None), ("", None)])
def test_tmpfs_sizes(text, want):
    assert size_bytes(text) == want


@pytest.mark.parametrize("value,needle", [
    ("src=/a,dst=/b", "type= is missing"),
    ("type=volume,src=v,dst=/b", "named volumes are not offered"),
    ("type=npipe,dst=/b", "unknown type 'npipe'"),
    ("type=bind,src=/a", "dst= is missing"),
    ("type=bind,dst=/b", "src= is missing"),
    ("type=bind,src=/a,dst=b", "the destination must be an absolute path"),
    ("type=bind,src=/a,dst=/b/../../c", "may not contain '..'"),
    ("type=bind,src=/a,dst=/b,bind-propagation=rshared", "bind-propagation=rshared is not offered"),
    ("type=bind,src=/a,dst=/b,bind-propagation=private", "bind-propagation=private is not offered"),
    ("type=bind,src=/a,dst=/b,tmpfs-size=1m", "apply to type=tmpfs"),
    ("type=bind,src=/a,dst=/b,readonly=maybe", "is not true or false"),
    ("type=bind,src=/a,dst=/b,dst=/c", "dst given twice"),
    ("type=bind,src=/a,dst=/b,volume-nocopy", "unknown key 'volume-nocopy'"),
    ('type=bind,"src=/a,dst=/b', "unbalanced double quote"),
    ("type=tmpfs,src=/a,dst=/b", "src= does not apply to type=tmpfs"),
    ("type=tmpfs,dst=/b,tmpfs-size=lots", "is not a size"),
    ("type=tmpfs,dst=/b,tmpfs-size=0", "is not a size"),
    ("type=tmpfs,dst=/b,tmpfs-mode=999", "is not an octal mode"),
    ("type=tmpfs,dst=/b,tmpfs-mode=17777", "is not an octal mode"),
])
def test_mount_refusals_name_the_input(value, needle):
    e = refused("--mount", value)
    assert e.line().startswith("invalid --mount ") and needle in e.line(), e.line()
    with pytest.raises(UsageError):
        parse_mount(value)


def test_v_refusals():
    e = refused("-v", "relative")
    assert "invalid --bind 'relative'" in e.line()
    e = refused("-v", "/data:ro")
    assert e.hint == "for the same path inside: -v /data:/data:ro"


@pytest.mark.parametrize("value,want", [
    ("all", "all"), ("none", "none"), ("0,1", "0,1"), ("device=1,2", "1,2"),
    ('"device=1,2"', "1,2"), ("device=GPU-abc", "GPU-abc"), ("count=2", "count=2"),
    ("count=all", "all"), ("count=02", "count=2"), ("1:2", "1:2"), ("auto", "auto"),
])
def test_gpus_forms(value, want):
    assert parse("--gpus", value).gpus == want
    assert normalise(want)[0] == want


def test_gpus_bare_number_is_an_index_with_a_note():
    spec = parse("--gpus", "2")
    assert spec.gpus == "2"
    (note,) = spec.notes
    assert "index 2" in note and "--gpus count=2" in note and "\n" not in note
    for quiet in ("0", "device=2", "count=2", "0,1", "all"):
        assert parse("--gpus", quiet).notes == []


@pytest.mark.parametrize("value,needle", [
    ("0,0", "'0' is named twice"),
    ("0,00", "'00' is named twice"),
    ("GPU-ab,gpu-AB", "'gpu-AB' is named twice"),
    ('"device=1,1"', "'1' is named twice"),
    ("count=2,0", "count= and a device list together"),
    ("count=x", "count= takes a number or all"),
    ("count=0", "count=0 selects no GPU"),
    ("all,capabilities=compute", "capabilities are a separate option here"),
    ("driver=nvidia", "unknown key 'driver='"),
    ('"device=1', "unbalanced double quote"),
    ("device=", "no device named"),
])
def test_gpus_refusals(value, needle):
    e = refused("--gpus", value)
    assert e.line().startswith("invalid --gpus ") and needle in e.line(), e.line()


def test_gpus_capabilities_hint_names_gpu_caps():
    assert refused("--gpus", "all,capabilities=utility").hint == "use --gpu-caps utility"


@pytest.mark.parametrize("opt,line", [
    ("--gpu", "unknown option '--gpu'; did you mean --gpus?"),
    ("--gpu=0", "unknown option '--gpu=0'; did you mean --gpus?"),
    ("--workdr", "unknown option '--workdr'; did you mean --workdir?"),
    ("-rm", "unknown option '-rm'; did you mean --rm?"),
    ("-gpus", "unknown option '-gpus'; did you mean --gpus?"),
    ("--qwertyuiop", "unknown option '--qwertyuiop'"),
])
def test_unknown_option_suggests(opt, line):
    e = refused(opt, "0")
    assert e.line() == line and e.hint == "run 'gpusandbox run --help' for the options"


@pytest.mark.parametrize("opt,needle", [
    ("-p", "there is no port mapping"), ("--network", "the option is --net"),
    ("--tmpfs", "the option is --mount"),
])
def test_docker_options_not_taken_say_why(opt, needle):
    e = refused(opt)
    assert e.line() == f"unknown option {opt!r}: {needle}" and e.hint


def test_flag_with_a_value_is_refused():
    assert refused("--rm=true").line() == "option --rm takes no value"


def test_run_without_arguments_shows_the_current_usage():
    e = refused()
    assert e.line() == "missing IMAGE"
    assert e.hint.startswith(f"usage: {RUN_USAGE} ")
    assert RUN_HELP.startswith(f"usage: {RUN_USAGE}\n")
    assert RUN_USAGE == "gpusandbox run [options] IMAGE [--] [CMD [ARG...]]"


def test_help_documents_every_spelling():
    for word in ("-i, --interactive", "--rm", "-u, --user", "--mount type=bind,src=SRC,dst=DST",
                 "--mount type=tmpfs,dst=DST", "tmpfs-size", "count=N", "device=LIST",
                 "-v PATH", "$GPUSANDBOX_DRIVER_ROOT"):
        assert word in RUN_HELP, word


@pytest.mark.parametrize("cmd,line", [
    ("pul", "unknown command: pul; did you mean pull?"),
    ("imgaes", "unknown command: imgaes; did you mean images?"),
    ("rn", "unknown command: rn; did you mean run?"),
    ("frobnicate", "unknown command: frobnicate"),
])
def test_unknown_command_suggests(cmd, line):
    commands = ["run", "pull", "images", "rmi", "prune", "inspect", "info", "list", "mps"]
    assert unknown_command(cmd, commands) == line


def test_docker_lifecycle_commands_say_why():
    line = unknown_command("attach", ["run", "mps"])
    assert line.startswith("unknown command: attach: a sandbox lives as long as its command")


def test_the_launch_path_stays_lean():
    """Parsing docker's spellings imports no difflib (only an error suggests)."""
    import subprocess
    import sys
    from pathlib import Path
    code = ("import sys\nfrom gpusandbox.cli import parse_run_args\n"
            "parse_run_args(['-it', '--rm', '--gpus', 'count=2', '--mount',"
            " 'type=tmpfs,dst=/t', '-v', '/a', '/img', 'x'])\n"
            "print(sorted(m for m in ('difflib', 'gpusandbox.suggest', 'gpusandbox.gpu.select',"
            " 'gpusandbox.gpu.discover') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).parents[2])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_gpus_without_quotes_split_as_docker_csv_does():
    """--gpus text without a double quote is split without loading mountopt
    (the launch path's), into exactly what docker's CSV reader makes of it."""
    from gpusandbox.gpu import request
    from gpusandbox.mountopt import csv_fields
    for text in ("0,1", "count=2", "device=1", ",", "a,,b", "", " 0 , 1 ", "capabilities=x,0"):
        assert request._fields(text) == csv_fields(text), text
    assert normalise('"device=1,2"') == ("1,2", None)
