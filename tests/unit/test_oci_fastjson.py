"""The OCI runtime's `create` reads config.json and writes its state
without importing the json package (whose re and enum imports cost more
than the rest of the parse): fastjson gives json.loads' results and errors
and json.dumps' text, and the modules `create` loads include none of json,
re, enum or socket."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from gpusandbox.oci import fastjson

REPO = Path(__file__).resolve().parents[2]

DOCS = [
    '{"ociVersion": "1.0.2", "process": {"args": ["/bin/true"], "env": ["A=caf\\u00e9"],'
    ' "user": {"uid": 0, "gid": 0, "additionalGids": [1, 2]}, "oomScoreAdj": -999},'
    ' "linux": {"seccomp": {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 38,'
    ' "syscalls": [{"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"}]},'
    ' "resources": {"memory": {"limit": 1.5e9, "swap": -1}}}, "annotations": {}}',
    '  \n\t{"a": [1, 2.5, -0.0, 1E400, true, false, null, "\\n\\"\\\\\\ud83d\\ude00"]}\r\n',
    '[]', '3', '"x"', '[NaN, Infinity, -Infinity]', '{"a": 1, "a": 2}', '"\u00e9\u4e2d"',
]
BAD = ["", " ", "{", "[1,]", "{} x", "[1] [2]", "nul", "{'a': 1}", '"\x01"', "\ufeff{}",
       "[" * 100000, b"\xef\xbb\xbf{}", b"\xff\xfe{\x00}\x00", b"\xc3\x28", b"{\"a\": \"\xe9\"}"]


def _outcome(fn, arg):
    try:
        return "ok", repr(fn(arg))
    except Exception as e:   # noqa: BLE001 - the exact exception is compared
        return type(e).__name__, str(e)


@pytest.mark.parametrize("doc", DOCS)
def test_loads_and_dumps_as_json(doc):
    want = json.loads(doc)
    got = fastjson.loads(doc)
    assert repr(got) == repr(want)
    assert repr(fastjson.loads(doc.encode())) == repr(json.loads(doc.encode()))
    assert fastjson.dumps(want) == json.dumps(want)


@pytest.mark.parametrize("bad", BAD, ids=range(len(BAD)))
def test_errors_as_json(bad):
    assert _outcome(fastjson.loads, bad) == _outcome(json.loads, bad)


def test_dumps_refusals_as_json():
    loop = {"a": 1}
    loop["self"] = loop
    for obj in (loop, {"s": {1, 2}}, {(1, 2): 3}):
        # The same refusal (its words are fastjson's).
        assert _outcome(fastjson.dumps, obj)[0] == _outcome(json.dumps, obj)[0] != "ok"
    obj = {1: (1, 2), "f": [math.inf, -math.inf, 0.1], "n": None, "u": "\u00e9\n\x00"}
    assert fastjson.dumps(obj) == json.dumps(obj)


def test_create_loads_no_json_re_enum_or_socket():
    # -S: no site (an editable install's finder imports re itself).
    code = ("import sys\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            "before = set(sys.modules)\n"
            "from gpusandbox.oci.runtime.cli import main\n"
            "from gpusandbox.oci.runtime import create, state\n"
            "from gpusandbox.oci import config\n"
            "print(' '.join(sorted(set(sys.modules) - before)))\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, cwd="/", check=True).stdout.split()
    assert "gpusandbox.oci.runtime.create" in out
    assert not {"json", "re", "enum", "socket", "selectors"} & set(out), out


# What `create` may load from the standard library beyond the interpreter's
# own start (-I -S): os, ctypes and what they pull in, struct, stat, errno,
# _json.  Each further package is measured start-up cost on every container
# (docs/bench.md): subprocess, signal, tempfile, shutil, dataclasses,
# threading, selectors, json, re, enum, socket all stay off this path.
CREATE_STDLIB = {"_collections_abc", "_ctypes", "_json", "_stat", "_struct", "ctypes",
                 "ctypes._endian", "errno", "genericpath", "os", "os.path", "posixpath",
                 "stat", "struct", "types"}


def test_create_loads_only_the_stdlib_it_needs():
    code = ("import sys\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            "before = set(sys.modules)\n"
            "from gpusandbox.oci.runtime.cli import main\n"
            "from gpusandbox.oci.runtime import create, state\n"
            "from gpusandbox.oci import config\n"
            "print(' '.join(sorted(set(sys.modules) - before)))\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, cwd="/", check=True).stdout.split()
    extra = {m for m in out if m.split(".")[0] != "gpusandbox"} - CREATE_STDLIB
    assert not extra, sorted(extra)
