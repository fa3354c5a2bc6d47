"""`run` of a cached store image stays cheap: no json, no re.

The reference grammar is checked by hand (compared here with the
distribution spec's regular expressions on many strings), a ref file is
read without json when it has the exact form set_ref writes, and the pull
writes a run record (image/runrec.py) that `run` reads instead of the
config blob, falling back to the blob when the record is missing or bad."""
import os
import random
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from gpusandbox.image import archive, ref as refmod, runrec, store as storemod
from gpusandbox.image import config as cfgmod
from gpusandbox.image.pull import pull
from tests.unit import image_fixtures as fx
from tests.unit.test_image_store import _test_apply

REPO = str(Path(__file__).parents[2])

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*\Z")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_HOST_LABEL = re.compile(r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])\Z")
_IPV6 = re.compile(r"\[[0-9A-Fa-f:.]+\]\Z")


@pytest.mark.parametrize("check,rx,alphabet", [
    (refmod._component_ok, _COMPONENT, "ab09._-A/\n é"),
    (refmod._tag_ok, _TAG, "aZ9_.-:/\n é"),
    (refmod._label_ok, _HOST_LABEL, "aZ9-._\n é"),
    (refmod._ipv6_ok, _IPV6, "[]0fF:.g\n é"),
])
def test_hand_checks_accept_what_the_grammar_accepts(check, rx, alphabet):
    rnd = random.Random(11)
    cases = ["", "a", "a__b", "a___b", "a--b", "a-._b", "a.b", "a..b", "_a", "a_", "-a",
             "a-", "[::1]", "[]", "x" * 128, "x" * 129, "_" + "x" * 127, "a\n", "[::1]\n"]
    for _ in range(20000):
        cases.append("".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 8))))
    for c in cases:
        assert check(c) == bool(rx.match(c)), repr(c)


@pytest.mark.parametrize("text", ["a__b/c---d:T_1.x", "localhost:5000/x",
                                  "[fe80::1]:5000/a/b@sha256:" + "a" * 64])
def test_names_still_parse(text):
    assert refmod.parse_name(text)


@pytest.mark.parametrize("bad", ["a___b", "a-", "A", "x:.tag", "ho-.st:1/x", "[g::1]/x",
                                 "x:" + "t" * 129, "a/-b", "a..b"])
def test_names_still_refused(bad):
    with pytest.raises(refmod.ImageError):
        refmod.parse_name(bad)


def _conf(**cfg):
    man, blobs = fx.build_image([{"a": b"1"}], **cfg)
    raw = blobs[fx.sha(man)]
    import json
    cdig = json.loads(raw)["config"]["digest"]
    return cdig, cfgmod.parse(blobs[cdig])


def test_run_record_round_trip():
    cdig, conf = _conf(Env=["A=1", "B=x=y", "E="], Entrypoint=["/e", ""], Cmd=None,
                       WorkingDir="srv/../w", User="app:grp")
    r = runrec.load(runrec.dump(cdig, conf))
    assert (r.config, r.os, r.architecture, r.variant, r.user, r.workdir) == \
        (cdig, conf.os, conf.architecture, conf.variant, "app:grp", "/w")
    assert r.env == [("A", "1"), ("B", "x=y"), ("E", "")]
    assert r.entrypoint == ["/e", ""] and r.cmd is None
    assert cfgmod.command(r, [], None) == cfgmod.command(conf, [], None)


def test_run_record_refuses_anything_but_its_exact_form():
    cdig, conf = _conf(Env=["A=1"], Cmd=["sh"])
    good = runrec.dump(cdig, conf)
    assert runrec.load(good) is not None
    fields = good[:-1].split(b"\0")
    for bad in [good[:-1], good + b"x\0", b"gsbx-run-2" + good[10:], good.replace(b"A=1", b"A-1"),
                good.replace(b"A=1", b"A B=1"), b"\0".join(fields[:-1]) + b"\0",
                good.replace(cdig.encode(), b"sha256:../x"), good.replace(b"\0=", b"\0+", 1),
                good.replace(b"\x001\0sh", b"\x009\0sh"), b"\xff" + good, b"",
                _with(fields, 6, b"=rel/dir"), _with(fields, 6, b"=/a/../b"),
                _with(fields, 5, b"="), b"x" * (runrec.MAX_FILE + 1)]:
        assert runrec.load(bad) is None, bad


def _with(fields, i, value):
    """The record with field i (0: magic, 6: WorkingDir) replaced."""
    return b"\0".join(fields[:i] + [value] + fields[i + 1:]) + b"\0"


def test_ref_file_read_without_json_and_with(tmp_path):
    st = storemod.Store(str(tmp_path / "s"))
    dig = "sha256:" + "b" * 64
    st.set_ref("docker.io/library/x:1", dig)
    assert runrec.ref_fast(open(st.root + "/refs/" + storemod.escape(
        "docker.io/library/x:1"), "rb").read(), "docker.io/library/x:1")
    assert st.get_ref("docker.io/library/x:1") == dig
    st.set_ref('oci:/a "b\\é', dig)          # escaped by json: read by json
    assert st.get_ref('oci:/a "b\\é') == dig
    with open(st.root + "/refs/" + storemod.escape("y"), "wb") as f:
        f.write(b'{"name": "y", "digest": "sha256:../x"}')
    assert st.get_ref("y") is None


@pytest.fixture
def cached(tmp_path, monkeypatch):
    mod = types.ModuleType("gpusandbox.image.unpack")
    mod.apply_layer = _test_apply
    monkeypatch.setitem(sys.modules, "gpusandbox.image.unpack", mod)
    import gpusandbox.image
    monkeypatch.setattr(gpusandbox.image, "unpack", mod, raising=False)
    man, blobs = fx.build_image([{"bin/": None, "bin/sh": b"sh"}], Env=["A=1", "P=/x"],
                                Entrypoint=["/bin/sh"], Cmd=["-c", "x"], WorkingDir="/srv")
    lay = fx.write_layout(str(tmp_path / "lay"), [("v1", man, blobs)])
    st = storemod.Store(str(tmp_path / "s"))
    pull(st, archive.OciLayoutSource(lay, "v1"), ["docker.io/library/fast:1"])
    return st, fx.sha(man)


_RUN = ("import sys\n"
        "from gpusandbox.cli import parse_run_args\n"
        "from gpusandbox.image.runimage import prepare\n"
        "s = parse_run_args(['--store', sys.argv[1], sys.argv[2]])\n"
        "prepare(s)\n"
        "print(s.image, s.argv, s.image_env)\n"
        "print(sorted(m for m in ('json', 're', 'enum', 'gpusandbox.image.progress') "
        "if m in sys.modules))\n")


def _run(st, name):
    # -S: no site (an editable install's .pth imports re); gpusandbox from cwd.
    out = subprocess.run([sys.executable, "-S", "-c", _RUN, st.root, name],
                         capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_run_of_a_cached_image_imports_neither_json_nor_re(cached):
    st, dig = cached
    assert os.path.isfile(st.bundle(dig) + "/" + runrec.NAME)
    for name in ("fast:1", "docker://fast:1"):
        desc, mods = _run(st, name)
        assert mods == "[]", name
        assert desc == f"{st.bundle(dig)}/rootfs ['/bin/sh', '-c', 'x'] " \
            "([('A', '1'), ('P', '/x')], '/srv')"


@pytest.mark.parametrize("damage", ["remove", b"gsbx-run-1\0garbage\0"])
def test_a_missing_or_bad_record_falls_back_to_the_config(cached, damage):
    st, dig = cached
    path = st.bundle(dig) + "/" + runrec.NAME
    want = _run(st, "fast:1")[0]
    os.unlink(path)
    if damage != "remove":
        with open(path, "wb") as f:
            f.write(damage)
    desc, mods = _run(st, "fast:1")
    assert desc == want and "json" in mods
