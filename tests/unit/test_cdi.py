"""CDI specs as data (gpusandbox.oci.cdi): strict parsing and the version
rules, the spec directories' priorities and conflicts, the order edits are
applied in, and NVIDIA's hook commands read as edits.  No privileges: the
device nodes are /dev/null and friends, the mounts files in tmp_path."""
import json
import os

import pytest

from gpusandbox.errors import SandboxError, UsageError
from gpusandbox.oci.cdi import apply, hooks, registry
from gpusandbox.oci.cdi.spec import SpecError, parse, validate

NULL = os.stat("/dev/null").st_rdev


def spec(version="0.5.0", kind="vendor.com/dev", devices=None, edits=None):
    d = {"cdiVersion": version, "kind": kind,
         "devices": devices or [{"name": "a", "containerEdits": {"env": ["A=1"]}}]}
    if edits is not None:
        d["containerEdits"] = edits
    return d


TOOLKIT_YAML = """---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - create-symlinks
    - --link
    - libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so
    env:
    - NVIDIA_CTK_DEBUG=false
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options:
    - ro
    - nosuid
    - nodev
    - bind
"""


def test_toolkit_yaml_parses_and_needs_0_5_0():
    doc, lowest = parse(TOOLKIT_YAML.encode(), "nvidia.yaml")
    assert doc["devices"][0]["name"] == "0" and lowest == "0.5.0"


@pytest.mark.parametrize("mutate, why", [
    (lambda d: d.update(extra=1), "unknown field 'extra'"),
    (lambda d: d["devices"][0]["containerEdits"].update(envs=[]), "unknown field 'envs'"),
    (lambda d: d["devices"][0].update(annotations={"a": "b"}), "needs 0.6.0"),
    (lambda d: d.update(cdiVersion="0.4.0"), "needs 0.5.0"),          # name "0"... see below
    (lambda d: d.update(cdiVersion="0.9.0"), "not a released version"),
    (lambda d: d.update(kind="nvidia.com"), "expected VENDOR/CLASS"),
    (lambda d: d["devices"][0].update(name="a/b"), "is not a device name"),
    (lambda d: d["devices"].append(dict(d["devices"][0])), "named twice"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        mounts=[{"hostPath": "/usr/../etc", "containerPath": "/x"}]), "without '..'"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        deviceNodes=[{"path": "dev/x"}]), "absolute path"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        deviceNodes=[{"path": "/dev/x", "major": True}]), "expected int"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        hooks=[{"hookName": "preStart", "path": "/bin/true"}]), "is not one of"),
    (lambda d: d["devices"][0]["containerEdits"].update(additionalGids=[44]), "needs 0.7.0"),
    (lambda d: d["devices"][0]["containerEdits"].update(
        mounts=[{"hostPath": "/a", "containerPath": "/b", "type": "bind"}],
        ) or d.update(cdiVersion="0.3.0", devices=[dict(d["devices"][0], name="x")]),
     "needs 0.4.0"),
])
def test_strict_parsing_and_version_rules(mutate, why):
    d = spec(devices=[{"name": "0", "containerEdits": {"env": ["A=1"]}}])
    mutate(d)
    with pytest.raises(SpecError) as e:
        parse(json.dumps(d).encode(), "s.json")
    assert why in e.value.why


def test_lowest_version_follows_content():
    assert validate(spec(version="0.3.0")) == "0.3.0"
    named = spec(devices=[{"name": "0", "containerEdits": {}}])
    assert validate(named) == "0.5.0"
    host = spec(devices=[{"name": "a", "containerEdits": {
        "deviceNodes": [{"path": "/dev/a", "hostPath": "/dev/b"}]}}])
    assert validate(host) == "0.5.0"
    assert validate(spec(version="0.6.0", kind="vendor.com/a.b")) == "0.6.0"


def test_duplicate_keys_are_errors_in_json_and_yaml():
    with pytest.raises(SpecError):
        parse(b'{"cdiVersion": "0.5.0", "cdiVersion": "0.6.0"}', "s.json")
    with pytest.raises(SpecError):
        parse(b"cdiVersion: 0.5.0\ncdiVersion: 0.6.0\n", "s.yaml")


def write(d, name, doc):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "w") as f:
        json.dump(doc, f)


def test_later_directory_wins_equal_priority_conflicts(tmp_path):
    etc, run = str(tmp_path / "etc"), str(tmp_path / "run")
    write(etc, "a.json", spec(devices=[{"name": "a", "containerEdits": {"env": ["W=etc"]}}]))
    write(run, "a.json", spec(devices=[{"name": "a", "containerEdits": {"env": ["W=run"]}}]))
    res = apply.resolve(["vendor.com/dev=a"], spec_dirs=[etc, run])
    assert res.edits.env == {"W": "run"}
    write(run, "b.json", spec(devices=[{"name": "a", "containerEdits": {"env": ["W=b"]}}]))
    with pytest.raises(SandboxError) as e:
        apply.resolve(["vendor.com/dev=a"], spec_dirs=[etc, run])
    assert "a.json" in e.value.why and "b.json" in e.value.why


def test_unknown_device_names_the_unusable_spec(tmp_path):
    d = str(tmp_path)
    write(d, "bad.json", dict(spec(), extra=1))
    with pytest.raises(SandboxError) as e:
        apply.resolve(["vendor.com/dev=a"], spec_dirs=[d])
    assert "bad.json" in e.value.why and "unknown field 'extra'" in e.value.why
    with pytest.raises(UsageError):
        registry.parse_name("vendor.com/dev=")


def test_spec_edits_before_its_first_device_mounts_by_depth(tmp_path):
    f = tmp_path / "lib"
    f.write_text("x")
    doc = spec(edits={"env": ["X=spec", "Y=spec"], "mounts": [
        {"hostPath": str(f), "containerPath": "/a/b/c", "options": ["ro", "bind"]}]},
        devices=[{"name": "a", "containerEdits": {"env": ["X=a"], "mounts": [
            {"hostPath": str(tmp_path), "containerPath": "/a", "options": ["bind"]}]}},
                 {"name": "b", "containerEdits": {"env": ["X=b"], "deviceNodes": [
                     {"path": "/dev/mynull", "hostPath": "/dev/null"}]}}])
    write(str(tmp_path / "d"), "s.json", doc)
    res = apply.resolve(["vendor.com/dev=b", "vendor.com/dev=a"],
                        spec_dirs=[str(tmp_path / "d")])
    assert res.edits.env == {"X": "a", "Y": "spec"}
    assert [m.path for m in res.edits.mounts] == ["/a", "/a/b/c"]
    assert res.edits.mounts[0].options == ("rw",) and res.edits.mounts[1].options == ("ro",)
    assert res.rules == [("c", os.major(NULL), os.minor(NULL), "rwm")]


@pytest.mark.parametrize("node, why", [
    ({"path": "/dev/x", "hostPath": "/dev/null", "major": 999}, "the spec says"),
    ({"path": "/dev/x", "hostPath": "/", "type": "c"}, "not a character device"),
    ({"path": "/dev/x", "hostPath": "/dev/gsbx-no-such-node"}, "No such file"),
])
def test_device_nodes_checked_by_number(tmp_path, node, why):
    write(str(tmp_path), "s.json", spec(devices=[{"name": "a", "containerEdits": {
        "deviceNodes": [node]}}]))
    with pytest.raises(SandboxError) as e:
        apply.resolve(["vendor.com/dev=a"], spec_dirs=[str(tmp_path)])
    assert why in e.value.why


def test_nvidia_hooks_become_work_unknown_ones_warn():
    work = hooks.Work()
    hooks.collect([
        {"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
         "args": ["nvidia-cdi-hook", "create-symlinks", "--link", "a.so.1::/l/a.so"]},
        {"hookName": "createContainer", "path": "/usr/bin/nvidia-ctk",
         "args": ["nvidia-ctk", "hook", "update-ldcache", "--folder", "/l", "--folder=/m"]},
        {"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
         "args": ["nvidia-cdi-hook", "enable-cuda-compat", "--host-driver-version=550.54.15"]},
        {"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
         "args": ["nvidia-cdi-hook", "disable-device-node-modification"]},
        {"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
         "args": ["nvidia-cdi-hook", "chmod", "--mode", "755", "--path", "/dev/dri"]},
        {"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
         "args": ["nvidia-cdi-hook", "update-application-profile"]},
        {"hookName": "prestart", "path": "/usr/local/bin/other-hook", "args": ["x"]},
    ], work)
    assert work.links == [("/l/a.so", "a.so.1")]
    assert work.folders == ["/l", "/m"]
    assert work.compat_host_version == "550.54.15" and work.params
    assert len(work.warnings) == 2
    assert "update-application-profile" in work.warnings[0]
    assert "other-hook" in work.warnings[1]


def test_hook_paths_checked_links_kept_inside():
    work = hooks.Work()
    hooks.collect([{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                    "args": ["nvidia-cdi-hook", "create-symlinks",
                             "--link", "x::/usr/../../etc/x", "--link", "y::relative/y"]},
                   {"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                    "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "lib"]}], work)
    assert work.links == [] and work.folders == [] and len(work.warnings) == 3


def test_cuda_compat_used_only_when_newer_than_the_host(tmp_path):
    compat = tmp_path / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    for n in ("libcuda.so.1", "libcuda.so.575.57.08", "libnvidia-ptxjitcompiler.so.1"):
        (compat / n).write_text("")
    assert sorted(hooks._image_compat(str(tmp_path), "550.54.15")) == [
        "libcuda.so.1", "libcuda.so.575.57.08", "libnvidia-ptxjitcompiler.so.1"]
    assert hooks._image_compat(str(tmp_path), "580.65.06") is None
    (compat / "libcuda.so.570.26").write_text("")     # two: the toolkit uses none
    assert hooks._image_compat(str(tmp_path), "550.54.15") is None


def test_two_names_of_one_device_give_its_node_once(tmp_path):
    node = {"path": "/dev/mynull", "hostPath": "/dev/null"}
    write(str(tmp_path), "s.json", spec(devices=[
        {"name": "0", "containerEdits": {"deviceNodes": [node]}},
        {"name": "GPU-x", "containerEdits": {"deviceNodes": [node]}}]))
    res = apply.resolve(["vendor.com/dev=0", "vendor.com/dev=GPU-x"], spec_dirs=[str(tmp_path)])
    assert [n.path for n in res.edits.device_nodes] == ["/dev/mynull"] and len(res.rules) == 1


@pytest.mark.parametrize("edits, why", [
    ({"deviceNodes": [{"path": "/opt/null", "hostPath": "/dev/null"}]}, "under /dev"),
    ({"mounts": [{"hostPath": "/usr", "containerPath": "/"}]}, "container's root"),
    ({"mounts": [{"hostPath": "/usr", "containerPath": "/u", "type": "overlay"}]},
     "not supported"),
    ({"mounts": [{"hostPath": "/usr", "containerPath": "/u", "options": ["bind", "suid"]}]},
     "unsupported options suid"),
])
def test_edits_gpusandbox_refuses(tmp_path, edits, why):
    write(str(tmp_path), "s.json", spec(devices=[{"name": "a", "containerEdits": edits}]))
    with pytest.raises(SandboxError) as e:
        apply.resolve(["vendor.com/dev=a"], spec_dirs=[str(tmp_path)])
    assert why in e.value.why


def test_update_ldcache_and_compat_build_the_cache(tmp_path):
    """update-ldcache lists what the edits place in the folder (SONAME links
    made, as ldconfig does), after the image's own entries; with
    enable-cuda-compat the image's newer compat libcuda comes first."""
    from gpusandbox.edits import ContainerEdits, Mount
    from gpusandbox.gpu import ldcache
    image = tmp_path / "image"
    compat = image / "usr/local/cuda/compat"
    compat.mkdir(parents=True)
    (compat / "libcuda.so.575.57.08").write_text("")
    (compat / "libcuda.so.1").write_text("")
    (image / "etc").mkdir()
    (image / "etc/ld.so.cache").write_bytes(ldcache.build(
        [ldcache.Entry(b"libz.so.1", b"/usr/lib/x86_64-linux-gnu/libz.so.1")]))
    lib = tmp_path / "libcuda.so.550.54.15"
    lib.write_text("")
    edits = ContainerEdits()
    edits.mounts.append(Mount(str(lib), "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"))
    work = hooks.Work()
    hooks.collect([{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                    "args": ["nvidia-cdi-hook", "update-ldcache", "--folder",
                             "/usr/lib/x86_64-linux-gnu"]}], work)
    hooks.finish(work, edits, str(image))
    names = {e.name: e.path for e in ldcache.parse(edits.files[0].content)}
    assert names[b"libz.so.1"] == b"/usr/lib/x86_64-linux-gnu/libz.so.1"
    assert names[b"libcuda.so.550.54.15"] == b"/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    work.compat_host_version = "550.54.15"
    edits.files.clear()
    hooks.finish(work, edits, str(image))
    names = {e.name: e.path for e in ldcache.parse(edits.files[0].content)}
    assert names[b"libcuda.so.1"] == b"/usr/local/cuda/compat/libcuda.so.1"
