"""`gpusandbox runtime configure` against sample engine configs (the rest of
each file kept), and the wrapper's reading of runc/crun command lines."""
import json
import os
import tomllib

import pytest

from gpusandbox.errors import UsageError
from gpusandbox.oci import configedit, runtimeconf, wrapper

W = "/opt/gpusandbox/bin/gpusandbox-runtime"

CONTAINERS_CONF = """\
# site defaults
[containers]
log_driver = "k8s-file"   # keep this comment

[engine]
runtime = "crun"
events_logger = "file"

[engine.runtimes]
crun = ["/usr/bin/crun"]
gpusandbox = ["/old/path"]

[network]
network_backend = "netavark"
"""

CONTAINERD_V2 = """\
version = 2
root = "/var/lib/containerd"

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true
"""


def configure(tmp_path, kind, text, name="conf"):
    p = tmp_path / name
    if text is not None:
        p.write_text(text)
        os.chmod(p, 0o640)
    runtimeconf.main(["configure", "--runtime", kind, "--config", str(p), "--path", W])
    return p


def test_podman_containers_conf(tmp_path):
    p = configure(tmp_path, "podman", CONTAINERS_CONF)
    text = p.read_text()
    doc = tomllib.loads(text)
    assert doc["engine"]["runtimes"] == {"crun": ["/usr/bin/crun"], "gpusandbox": [W]}
    assert doc["engine"]["runtime"] == "crun" and doc["network"]["network_backend"] == "netavark"
    assert "# site defaults" in text and "# keep this comment" in text
    assert text.count("gpusandbox =") == 1
    assert os.stat(p).st_mode & 0o777 == 0o640
    # Only the one line changed.
    assert [ln for ln in text.splitlines() if ln not in CONTAINERS_CONF.splitlines()] == \
        [f'gpusandbox = ["{W}"]']


def test_podman_new_file_and_table(tmp_path):
    p = configure(tmp_path, "podman", None)
    assert tomllib.loads(p.read_text())["engine"]["runtimes"]["gpusandbox"] == [W]
    p = configure(tmp_path, "podman", '[engine]\nruntime = "runc"\n', "c2")
    doc = tomllib.loads(p.read_text())
    assert doc["engine"] == {"runtime": "runc", "runtimes": {"gpusandbox": [W]}}


def test_docker_daemon_json(tmp_path):
    src = {"log-driver": "journald", "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}},
           "x-unknown": [1, 2]}
    p = configure(tmp_path, "docker", json.dumps(src))
    doc = json.loads(p.read_text())
    assert doc["runtimes"] == {"nvidia": {"path": "nvidia-container-runtime"},
                               "gpusandbox": {"path": W}}
    assert doc["log-driver"] == "journald" and doc["x-unknown"] == [1, 2]
    assert list(doc) == ["log-driver", "runtimes", "x-unknown"]


@pytest.mark.parametrize("twice", [False, True])
def test_containerd_v2(tmp_path, twice):
    p = configure(tmp_path, "containerd", CONTAINERD_V2)
    if twice:
        runtimeconf.main(["configure", "--runtime", "containerd", "--config", str(p),
                          "--path", W + "2"])
    doc = tomllib.loads(p.read_text())
    cri = doc["plugins"]["io.containerd.grpc.v1.cri"]
    rts = cri["containerd"]["runtimes"]
    assert rts["runc"] == {"runtime_type": "io.containerd.runc.v2",
                           "options": {"SystemdCgroup": True}}
    assert rts["gpusandbox"] == {"runtime_type": "io.containerd.runc.v2",
                                 "options": {"BinaryName": W + ("2" if twice else "")}}
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.9" and doc["version"] == 2


def test_containerd_v3_and_empty(tmp_path):
    p = configure(tmp_path, "containerd", 'version = 3\n')
    rts = tomllib.loads(p.read_text())["plugins"]["io.containerd.cri.v1.runtime"][
        "containerd"]["runtimes"]
    assert rts["gpusandbox"]["options"]["BinaryName"] == W
    p = configure(tmp_path, "containerd", None, "empty")
    doc = tomllib.loads(p.read_text())
    assert doc["version"] == 2
    assert doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"][
        "gpusandbox"]["options"]["BinaryName"] == W


def test_bad_input_leaves_file(tmp_path):
    p = tmp_path / "daemon.json"
    p.write_text("{not json")
    with pytest.raises(UsageError):
        runtimeconf.main(["configure", "--runtime", "docker", "--config", str(p)])
    assert p.read_text() == "{not json" and os.listdir(tmp_path) == ["daemon.json"]
    with pytest.raises(UsageError):
        runtimeconf.main(["configure", "--runtime", "lxc"])


@pytest.mark.parametrize("argv,want", [
    (["--root", "/run/runc", "--log", "/l", "--log-format", "json", "create", "--bundle", "/b",
      "--pid-file", "/p", "id1"], ("create", "/b", "id1")),
    (["--systemd-cgroup", "create", "-b", "/b2", "--console-socket", "/s", "id2"],
     ("create", "/b2", "id2")),
    (["--root=/r", "create", "--bundle=/b3", "id3"], ("create", "/b3", "id3")),
    (["--root", "create", "state", "x"], ("state", None, None)),
    (["state", "create"], ("state", None, None)),
    (["create", "id4"], ("create", None, "id4")),
    (["--debug", "run", "-d", "--bundle", "/b5", "id5"], ("run", "/b5", "id5")),
])
def test_wrapper_parse(argv, want):
    cmd, _opts, bundle, cid = wrapper.parse(argv)
    assert (cmd, bundle, cid) == want


def test_legacy_hook_dropped_others_kept():
    cfg = {"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook"},
                                  {"path": "/usr/libexec/other-hook"}],
                     "poststop": [{"path": "/x"}]}}
    assert configedit.drop_legacy_hooks(cfg)
    assert cfg["hooks"] == {"prestart": [{"path": "/usr/libexec/other-hook"}],
                            "poststop": [{"path": "/x"}]}
    assert not configedit.drop_legacy_hooks(cfg)


def test_selection_reads_only_gpu_variables():
    cfg = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", "LD_PRELOAD=/x.so",
                               "GPUSANDBOX_DRIVER_ROOT=/evil", "NVIDIA_VISIBLE_DEVICES=0"]}}
    assert configedit.container_env(cfg) == {"NVIDIA_VISIBLE_DEVICES": "0"}
    assert configedit.host_roots({"GPUSANDBOX_OCI_CONF": "/nonexistent"}) == ("/", None)


def test_cdi_names_go_through_the_cdi_resolver(tmp_path, monkeypatch):
    """cdi.k8s.io/* annotations and CDI names in NVIDIA_VISIBLE_DEVICES reach
    gpusandbox.oci.cdi.resolve (the CDI consumer); its edits are written."""
    import sys
    import types
    from gpusandbox.edits import ContainerEdits, DeviceNode, Mount
    seen = []

    class Result:   # gpusandbox.oci.cdi.apply.Result's shape
        def __init__(self, edits):
            self.edits, self.rules, self.warnings = edits, [("c", 241, 7, "rw")], []

    def resolve(names, spec_dirs=None, rootfd=None, environ=None):
        seen.append(list(names))
        e = ContainerEdits()
        e.device_nodes.append(DeviceNode("/dev/vendor0", "/dev/vendor0", 240, 3))
        e.mounts.append(Mount("/opt/vendor/lib.so", "/usr/lib/vendor.so"))
        e.env["VENDOR"] = "1"
        return Result(e)

    fake = types.ModuleType("gpusandbox.oci.cdi")
    fake.resolve = resolve
    monkeypatch.setitem(sys.modules, "gpusandbox.oci.cdi", fake)
    cfg = {"annotations": {"cdi.k8s.io/vendor": "example.com/dev=a,example.com/dev=b",
                           "other": "x=y/z"},
           "process": {"env": ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0"]}}
    out = configedit.edit(cfg, {}, str(tmp_path))
    assert seen == [["example.com/dev=a", "example.com/dev=b", "nvidia.com/gpu=0"]]
    assert out["linux"]["devices"][0]["path"] == "/dev/vendor0"
    assert {"allow": True, "type": "c", "major": 240, "minor": 3, "access": "rwm"} in \
        out["linux"]["resources"]["devices"]
    assert {"allow": True, "type": "c", "major": 241, "minor": 7, "access": "rw"} in \
        out["linux"]["resources"]["devices"]
    assert out["mounts"][0]["destination"] == "/usr/lib/vendor.so"
    assert "VENDOR=1" in out["process"]["env"]
    cfg = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0,1"]}}
    with pytest.raises(UsageError):
        configedit.edit(cfg, {}, str(tmp_path))


def test_containerd_keeps_default_runtime(tmp_path):
    """A file whose runtimes table names only ours would replace containerd's
    built-in one: the default runtime (runc, or default_runtime_name) is
    written too, unless the file has it already."""
    debian = ('version = 2\n\n[plugins]\n  [plugins."io.containerd.grpc.v1.cri"]\n'
              '    [plugins."io.containerd.grpc.v1.cri".cni]\n'
              '      bin_dir = "/usr/lib/cni"\n')
    for text in (debian, None):
        p = configure(tmp_path, "containerd", text, f"c{text is None}")
        rts = tomllib.loads(p.read_text())["plugins"]["io.containerd.grpc.v1.cri"][
            "containerd"]["runtimes"]
        assert rts["runc"] == {"runtime_type": "io.containerd.runc.v2"}
        assert rts["gpusandbox"]["options"]["BinaryName"] == W
    p = configure(tmp_path, "containerd", 'version = 3\n', "v3")
    ctd = tomllib.loads(p.read_text())["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert ctd["runtimes"]["runc"] == {"runtime_type": "io.containerd.runc.v2"}
    own = ('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
           'default_runtime_name = "crun"\n'
           '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]\n'
           'runtime_type = "io.containerd.runc.v2"\n')
    p = configure(tmp_path, "containerd", own, "own")
    rts = tomllib.loads(p.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"][
        "runtimes"]
    assert sorted(rts) == ["crun", "gpusandbox"]
    p = configure(tmp_path, "containerd", own.replace("runtimes.crun]", "runtimes.x]"), "nodef")
    rts = tomllib.loads(p.read_text())["plugins"]["io.containerd.grpc.v1.cri"]["containerd"][
        "runtimes"]
    assert sorted(rts) == ["crun", "gpusandbox", "x"]
