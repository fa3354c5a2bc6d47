"""Unit tests of the launcher's pure parts: the run parser, the environment
table, the error channel, the id-map ranges and the clone error hints."""
import errno

import pytest

from gpusandbox import environ as envmod
from gpusandbox.cli import parse_run_args
from gpusandbox.errors import UsageError
from gpusandbox.linux import idmap
from gpusandbox.linux import sys as k
from gpusandbox.stages import channel
from gpusandbox.stages.parent import _clone_error


def test_parser_stops_at_image_and_keeps_command_options():
    spec = parse_run_args(["-v", "/a:/b:ro", "--gpus=0,1", "-e", "X=1", "/img", "ls", "-l",
                           "--gpus", "9"])
    assert spec.image == "/img"
    assert spec.argv == ["ls", "-l", "--gpus", "9"]
    assert spec.gpus == "0,1"
    assert [(b.src, b.dst, b.rw) for b in spec.binds] == [("/a", "/b", False)]
    assert spec.env_set == ["X=1"]


def test_parser_double_dash_and_flags():
    spec = parse_run_args(["--rw", "--root", "-t", "/img", "--", "--weird-cmd"])
    assert spec.rootfs_mode == "rw" and spec.fakeroot and spec.tty
    assert spec.argv == ["--weird-cmd"]
    assert parse_run_args(["--writable-tmpfs", "/i", "x"]).rootfs_mode == "tmpfs-overlay"
    assert parse_run_args(["--help"]) is None


@pytest.mark.parametrize("argv,needle", [
    (["--gpus"], "option --gpus needs a value"),
    (["--user", "abc", "/i", "x"], "invalid --user 'abc'"),
    (["--userns", "maybe", "/i", "x"], "invalid --userns 'maybe'"),
    (["-v", "/a:/b/../c", "/i", "x"], "invalid --bind"),
    (["-v", "/a:relative", "/i", "x"], "invalid --bind"),
    (["--device", "/dev/x:/opt/x", "/i", "x"], "invalid --device"),
    (["--hostname", "a/b", "/i", "x"], "invalid --hostname"),
    ([], "missing IMAGE"),
])
def test_parser_errors_name_the_input(argv, needle):
    with pytest.raises(UsageError) as ei:
        parse_run_args(argv)
    assert needle in ei.value.line()
    assert ei.value.code == 125


class _Spec:
    env_host = False
    env_files = ()
    env_set = ()
    profile = None


def test_profile_untrusted_keeps_host_sockets_out_of_env_host():
    spec = _Spec()
    spec.env_host, spec.profile = True, "untrusted"
    host = {"SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/b",
            "DISPLAY": ":0", "LANG": "C.UTF-8"}
    env = envmod.build(spec, host, [], {}, "/home/u")
    assert env["LANG"] == "C.UTF-8"
    assert not {"SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "DISPLAY"} & set(env)
    spec.env_set = ["SSH_AUTH_SOCK"]                     # named with -e: the caller's word
    assert envmod.build(spec, host, [], {}, "/home/u")["SSH_AUTH_SOCK"] == "/tmp/ssh-x/agent.1"


def test_environment_precedence_table():
    spec = _Spec()
    spec.env_set = ["E=from-e", "HOSTONLY"]
    host = {"SLURM_JOB_ID": "7", "PMIX_RANK": "1", "LD_PRELOAD": "/x.so", "HOME": "/root",
            "HOSTONLY": "h", "CUDA_VISIBLE_DEVICES": "3", "RANDOM_HOST": "r"}
    image = [("PATH", "/opt/bin:/usr/bin"), ("E", "from-image"), ("SLURM_JOB_ID", "image"),
             ("CUDA_VISIBLE_DEVICES", "7"), ("NVIDIA_VISIBLE_DEVICES", "all")]
    gpu = {"NVIDIA_VISIBLE_DEVICES": "GPU-x", "CUDA_VISIBLE_DEVICES": "0,1"}
    env = envmod.build(spec, host, image, gpu, "/home/u")
    assert env["PATH"] == "/opt/bin:/usr/bin"          # image over defaults
    assert env["HOME"] == "/home/u"
    assert env["E"] == "from-e"                        # -e over image
    assert env["SLURM_JOB_ID"] == "image"              # image over host job variables
    assert env["PMIX_RANK"] == "1"
    assert env["HOSTONLY"] == "h"                      # -e KEY copies the host value
    # The GPU row (the host-side resolution, renumbered in gpu/inject.py)
    # over the image's values; the host's own value never passes.
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["NVIDIA_VISIBLE_DEVICES"] == "GPU-x"
    assert "LD_PRELOAD" not in env and "RANDOM_HOST" not in env
    # Without a GPU row the image's value is the command's data, and the
    # host's CUDA_VISIBLE_DEVICES stays out even with --env-host.
    env = envmod.build(spec, host, image, {}, "/home/u")
    assert env["CUDA_VISIBLE_DEVICES"] == "7"
    spec.env_host = True
    env = envmod.build(spec, host, [], {}, "/h")
    assert env["RANDOM_HOST"] == "r" and env["HOME"] == "/h" and "LD_PRELOAD" not in env
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_env_lines_parser():
    got = envmod.parse_env_lines('# c\nA=1\nexport B="two words"\n\nC=\'x\'\n', "f")
    assert got == [("A", "1"), ("B", "two words"), ("C", "x")]
    with pytest.raises(UsageError) as ei:
        envmod.parse_env_lines("A=1\nnot a line\n", "/etc/x")
    assert ei.value.what.startswith("/etc/x:2:")


def test_passwd_home():
    text = "root:x:0:0::/root:/bin/sh\nu:x:1000:1000::/home/u:/bin/sh\nbad:x:5\n"
    assert envmod.passwd_home(text, 1000) == "/home/u"
    assert envmod.passwd_home(text, 4242) == "/"


def test_error_channel_roundtrip_and_garbage():
    rec = f"127{channel.SEP}command not found in the image: foo{channel.SEP}{channel.SEP}hint\n"
    assert channel.parse(rec.encode()) == (127, "command not found in the image: foo", None,
                                           "hint")
    assert channel.parse(b"") is None
    code, what, why, _ = channel.parse(b"something odd")
    assert code == 125 and why == "something odd"


def test_subid_ranges_keep_the_caller_mapped():
    # Caller 1000 stays 1000 inside; 0..999 and 1001.. come from the range.
    assert idmap.ranges(1000, 1000, (100000, 65536)) == [
        (1000, 1000, 1), (0, 100000, 1000), (1001, 101000, 64536)]
    # --root: the caller is 0 inside, the range follows from 1.
    assert idmap.ranges(0, 1000, (100000, 65536)) == [(0, 1000, 1), (1, 100000, 65536)]


def test_subid_range_lookup(tmp_path):
    f = tmp_path / "subuid"
    f.write_text("alice:100000:65536\n1001:200000:1000\nbroken\n")
    assert idmap.subid_range("alice", 1000, str(f)) == (100000, 65536)
    assert idmap.subid_range("bob", 1001, str(f)) == (200000, 1000)
    assert idmap.subid_range("carol", 1002, str(f)) is None


class _Plan:
    clone_flags = k.CLONE_NEWUSER | k.CLONE_NEWNS


def test_clone_refused_names_the_userns_fix():
    err = _clone_error(OSError(errno.EPERM, "Operation not permitted"), _Plan())
    assert err.code == 125
    assert "clone3" in err.what
    assert "kernel.unprivileged_userns_clone" in err.hint
    assert "apparmor_restrict_unprivileged_userns" in err.hint


def test_a_channel_record_fits_the_smallest_pipe_with_room_for_two():
    # A launcher without a terminal reads the channel only once init has
    # exited: a record that could fill the pipe would leave its writer (and
    # the launch) waiting for ever.  An argv[0] of 100 KB is cut short.
    huge = "x" * 100_000
    rec = channel.record(127, f"command not found in the image: {huge}", None, "check PATH")
    assert len(rec) <= channel.RECORD_MAX and 2 * channel.RECORD_MAX <= 4096
    code, what, why, hint = channel.parse(rec)
    assert (code, why, hint) == (127, None, "check PATH")
    assert what.startswith("command not found in the image: xxx") and what.endswith("...")
    small = channel.record(125, "mounting /proc", "Permission denied", "try --net host")
    assert channel.parse(small) == (125, "mounting /proc", "Permission denied", "try --net host")
