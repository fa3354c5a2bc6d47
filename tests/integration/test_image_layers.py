"""Layers shared between images (root and rootless), through the real CLI and
Debian's docker-registry: image B shares 4 of its 5 layers with image A;
pulling B after A fetches and unpacks only B's own layer, B's whiteouts and
opaque directory act on the shared lower layers, and rmi A leaves B
runnable while the layers B lists stay."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .registry_fixture import images, registry  # noqa: F401
from .test_images_local import gsbx, image_files, store  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
import image_fixtures as fx  # noqa: E402

SHARED = [
    {"opt/": None, "opt/d/": None, "opt/d/a": b"a", "opt/d/b": b"b", "srv/": None,
     "srv/gone": b"x", "srv/kept": b"k"},
    {"etc/l3": b"3"},
    {"etc/l4": b"4", "srv/sub/": None, "srv/sub/x": b"x"},
]
TOP_A = {"etc/a": b"A"}
# Whiteouts over the shared layers: an opaque directory, a file of layer 2
# and one of layer 3; srv/sub/ is only implied (its parent listed below).
TOP_B = {"opt/d/": None, "opt/d/.wh..wh..opq": b"", "opt/d/c": b"c", "srv/": None,
         "srv/.wh.gone": b"", "etc/.wh.l3": b"", "srv/sub/y": b"y"}
SHOW = "ls /opt/d /srv /srv/sub; cat /etc/l4; test -e /etc/l3 || echo no-l3; " \
       "test -e /etc/a || echo no-a"
WANT_B = "/opt/d:\nc\n\n/srv:\nkept\nsub\n\n/srv/sub:\nx\ny\n4no-l3\nno-a\n"


@pytest.fixture(scope="module")
def shared_pair(registry, image_files, workdir_base):
    """A and B pushed to the registry: {name: (ref, manifest digest)}."""
    out = {}
    for name, top in (("a", TOP_A), ("b", TOP_B)):
        man, blobs = fx.build_image([image_files["base"]] + SHARED + [top],
                                    Entrypoint=["/bin/sh", "-c"], Cmd=["true"])
        lay = fx.write_layout(str(workdir_base / f"layers-{name}"), [("t", man, blobs)])
        subprocess.run(["chmod", "-R", "a+rX", lay], check=True)
        dig = registry.push(lay, "t", f"layers/{name}")
        out[name] = (f"docker://{registry.host}/layers/{name}:t", dig)
    return out


def _events(stdout_err):
    return [json.loads(x) for x in stdout_err.splitlines() if x.startswith("{")]


def _layer_dirs(store):
    d = store / "layers"
    return {n: (os.stat(d / n / "diff").st_ino, os.stat(d / n / "diff").st_mtime_ns)
            for n in os.listdir(d)}


def test_second_image_unpacks_only_its_new_layer(runner, store, shared_pair):
    (ref_a, dig_a), (ref_b, dig_b) = shared_pair["a"], shared_pair["b"]
    r = gsbx(runner, store, ["pull", "--progress", "json", ref_a])
    assert r.returncode == 0, r.stderr
    ev = _events(r.stderr + r.stdout)
    assert sum(e["event"] == "layer" for e in ev) == 5, ev
    before = _layer_dirs(store)
    assert len(before) == 5

    r = gsbx(runner, store, ["pull", "--progress", "json", ref_b])
    assert r.returncode == 0, r.stderr
    ev = _events(r.stderr + r.stdout)
    # One layer fetched and one unpacked; the shared four untouched.
    assert [e["event"] for e in ev].count("layer") == 1, ev
    assert [e["event"] for e in ev].count("blob") == 1, ev
    after = _layer_dirs(store)
    assert len(after) == 6 and {n: after[n] for n in before} == before

    # B's whiteouts and opaque directory act on the shared lower layers.
    r = gsbx(runner, store, ["run", ref_b, SHOW])
    assert (r.returncode, r.stdout) == (0, WANT_B), r.stderr
    r = gsbx(runner, store, ["run", ref_a, "cat /etc/a; ls /opt/d; test -e /srv/gone && "
                             "cat /etc/l3"])
    assert (r.returncode, r.stdout) == (0, "Aa\nb\n3"), r.stderr
    # No data copied: B's files are the shared layer's inodes.
    l4 = [n for n in before if os.path.exists(store / "layers" / n / "diff/etc/l4")]
    assert len(l4) == 1
    assert os.stat(store / "images" / dig_b[7:] / "rootfs/etc/l4").st_ino == \
        os.stat(store / "layers" / l4[0] / "diff/etc/l4").st_ino

    # rmi A: A's own layer goes, the four B lists stay, B still runs.
    r = gsbx(runner, store, ["rmi", ref_a[len("docker://"):]])
    assert r.returncode == 0, r.stderr
    left = _layer_dirs(store)
    assert len(left) == 5 and {n: left[n] for n in before if n in left} == \
        {n: before[n] for n in before if n in left} and len(set(before) & set(left)) == 4
    assert os.listdir(store / "images") == [dig_b[7:]]
    r = gsbx(runner, store, ["run", ref_b, SHOW])
    assert (r.returncode, r.stdout) == (0, WANT_B), r.stderr
    r = gsbx(runner, store, ["rmi", ref_b[len("docker://"):]])
    assert r.returncode == 0, r.stderr
    assert os.listdir(store / "layers") == [] and os.listdir(store / "images") == []
