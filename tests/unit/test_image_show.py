"""`images` and `inspect` output: sizes for people (decimal units, unpacked
and compressed), key: value lines without Python values, and docker's
`image inspect` JSON shape for tools."""
import json
import os

import pytest

from gpusandbox.image import archive, store as storemod
from gpusandbox.image.cli import main_images, main_inspect
from gpusandbox.image.pull import pull
from gpusandbox.image.sizes import human
from tests.unit import image_fixtures as fx


@pytest.mark.parametrize("n,text", [(None, "-"), (0, "0 B"), (999, "999 B"), (1000, "1.0 kB"),
                                    (4100, "4.1 kB"), (72_800_000, "72.8 MB"),
                                    (118_400_000, "118 MB"), (999_960, "1.0 MB"),
                                    (1_234_000_000, "1.2 GB")])
def test_human_sizes_are_docker_style_decimal(n, text):
    assert human(n) == text


@pytest.fixture
def store(tmp_path):
    man, blobs = fx.build_image(
        [{"bin/": None, "bin/sh": b"s" * 5000},
         {"srv/": None, "srv/data": b"d" * 2_000_000}],
        Env=["A=1", "PATH=/bin"], Entrypoint=["/bin/sh", "-c"], Cmd=['echo "hi there"'],
        WorkingDir="/srv", ExposedPorts={"80/tcp": {}})
    lay = fx.write_layout(str(tmp_path / "lay"), [("v1", man, blobs)])
    st = storemod.Store(str(tmp_path / "s"))
    pull(st, archive.OciLayoutSource(lay, "v1"), ["docker.io/library/demo:1"])
    return st, fx.sha(man), sum(d["size"] for d in json.loads(man)["layers"])


def _out(capsys, fn, argv):
    assert fn(argv) == 0
    return capsys.readouterr().out


def test_images_shows_unpacked_and_compressed_sizes_for_people(store, capsys):
    st, dig, compressed = store
    text = _out(capsys, main_images, ["--store", st.root])
    header, row = text.splitlines()
    assert header.split()[:7] == ["REFERENCE", "DIGEST", "CREATED", "SIZE", "SHARED",
                                  "UNIQUE", "LAST"]
    cols = row.split("  ")
    cols = [c.strip() for c in cols if c.strip()]
    assert cols[0] == "docker.io/library/demo:1" and cols[1] == dig[:19]
    assert cols[3] == "2.0 MB"                   # 2,005,000 bytes of files
    assert cols[4] == "0 B"                      # no other image shares a layer
    assert cols[5].endswith(" MB")               # its layers on disk, each once
    assert str(compressed) not in text
    rows = json.loads(_out(capsys, main_images, ["--store", st.root, "--json"]))
    assert rows[0]["size"] == compressed and rows[0]["unpacked_size"] == 2_005_000
    assert rows[0]["shared_size"] == 0 and rows[0]["unique_size"] >= 2_005_000


def test_images_of_an_older_pull_shows_no_unpacked_size(store, capsys):
    st, dig, _ = store
    path = os.path.join(st.root, st.image_dir(dig), "image.json")
    rec = json.load(open(path))
    del rec["unpacked"]
    with open(path, "w") as f:
        json.dump(rec, f)
    row = _out(capsys, main_images, ["--store", st.root]).splitlines()[1]
    assert [c.strip() for c in row.split("  ") if c.strip()][3] == "-"
    # inspect measures it
    doc = json.loads(_out(capsys, main_inspect, ["--store", st.root, "--json", "demo:1"]))[0]
    assert doc["Size"] == 2_005_000


def test_inspect_reads_as_key_value_lines_without_python_values(store, capsys):
    st, dig, compressed = store
    text = _out(capsys, main_inspect, ["--store", st.root, "demo:1"])
    lines = dict((ln[:13].rstrip(": "), ln[13:]) for ln in text.splitlines()
                 if not ln.startswith(" "))
    for python in ("None", "{}", "[]", "['", "{'"):
        assert python not in text, text
    assert lines["Names"] == "docker.io/library/demo:1"
    assert lines["Digest"] == dig
    assert lines["Entrypoint"] == "/bin/sh -c"
    assert lines["Cmd"] == "'echo \"hi there\"'"
    assert lines["User"] == "-" and lines["Labels"] == "-"
    assert lines["Size"] == f"2.0 MB ({human(compressed)} compressed)"
    assert "Env:         A=1\n             PATH=/bin\n" in text
    assert lines["Platform"] == "linux/amd64"


def test_inspect_json_is_dockers_shape(store, capsys):
    st, dig, compressed = store
    docs = json.loads(_out(capsys, main_inspect, ["--store", st.root, "--json", "demo:1"]))
    assert isinstance(docs, list) and len(docs) == 1
    doc = docs[0]
    rec = st.image_record(dig)
    assert doc["Id"] == rec["config"] and doc["Digest"] == dig
    assert doc["RepoTags"] == ["docker.io/library/demo:1"]
    assert doc["RepoDigests"] == [f"docker.io/library/demo@{dig}"]
    assert doc["Created"] == "2024-01-01T00:00:00Z"
    assert (doc["Architecture"], doc["Os"]) == ("amd64", "linux")
    assert doc["Config"] == {"User": "", "Env": ["A=1", "PATH=/bin"],
                             "Entrypoint": ["/bin/sh", "-c"], "Cmd": ['echo "hi there"'],
                             "WorkingDir": "/srv", "Labels": None,
                             "ExposedPorts": {"80/tcp": {}}}
    assert doc["RootFS"] == {"Type": "layers", "Layers": rec["diff_ids"]}
    assert doc["Size"] == 2_005_000
    assert doc["GpuSandbox"]["CompressedSize"] == compressed


def test_inspect_takes_several_images(store, capsys):
    st, _, _ = store
    docs = json.loads(_out(capsys, main_inspect, ["--store", st.root, "--json", "demo:1",
                                                  "docker.io/library/demo:1"]))
    assert len(docs) == 2 and docs[0] == docs[1]
