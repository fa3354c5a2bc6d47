"""Mounts as data, both ways (issue 24): GPU edits become the plan's mount
ops (edits.from_edits), oci/configedit.py writes those ops into a
config.json, and oci/configmount.py reads the config's mounts back into
ops: the same ops come back (path, source, flags), so the door that edits a
config and the door that runs one cannot drift apart."""
import os

from gpusandbox.edits import ContainerEdits, DeviceNode, File, Mount, Symlink, Tmpfs, from_edits
from gpusandbox.oci import configedit, configmount


def _edits(tmp_path):
    host = tmp_path / "host"
    for d in ("lib", "bin", "dev", "mps"):
        (host / d).mkdir(parents=True, exist_ok=True)
    for f in ("lib/libcuda.so.1", "lib/libnvidia-ml.so.1", "bin/nvidia-smi", "dev/nvidia1"):
        (host / f).write_bytes(b"x")
    e = ContainerEdits()
    e.tmpfs += [Tmpfs("/var/lib/gpu-scratch", ro=False), Tmpfs("/srv/masked"),
                Tmpfs("/proc/driver/nvidia")]
    e.device_nodes += [DeviceNode("/dev/nvidiactl", "/dev/nvidiactl", 195, 255),
                       DeviceNode("/dev/nvidia1", str(host / "dev/nvidia1"), 195, 1)]
    lib = "/usr/lib/x86_64-linux-gnu"
    e.mounts += [Mount(str(host / "lib/libcuda.so.1"), f"{lib}/libcuda.so.1"),
                 # Neither ro nor rw: read-only, as `run` binds it.
                 Mount(str(host / "lib/libnvidia-ml.so.1"), f"{lib}/libnvidia-ml.so.1",
                       ("nosuid",)),
                 Mount(str(host / "bin/nvidia-smi"), "/usr/bin/nvidia-smi",
                       ("ro", "nosuid", "nodev", "noexec")),
                 Mount(str(host / "mps"), "/tmp/nvidia-mps", ("rw", "nosuid", "nodev")),
                 Mount(str(host / "bin/nvidia-smi"), "/proc/driver/nvidia/x")]
    e.symlinks += [Symlink(f"{lib}/libcuda.so", "libcuda.so.1"),
                   Symlink(f"{lib}/libnvidia-ml.so", f"{lib}/libnvidia-ml.so.1"),
                   Symlink("/usr/bin/dangling", "nowhere")]
    e.files += [File("/etc/ld.so.cache", b"a cache")]
    e.env["NVIDIA_VISIBLE_DEVICES"] = "1"
    return e


def _written(ops):
    """What each op is in config.json terms, as a runtime reads it back:
    a node not at its own host path is a bind of it (noexec added), a link
    to a bound file a read-only bind of that file, a tmpfs read-only when
    the ops seal it.  What has no config.json form is left out: /proc, the
    node at its own path (linux.devices), a link to no bound file."""
    sealed = {op.path for op in ops if op.op == "seal"}
    bound = {op.path: op.source for op in ops if op.op == "bind"}
    out = []
    for op in ops:
        if op.path.startswith("/proc/"):
            continue
        if op.op == "fs":
            out.append(("fs", op.path, op.fstype, tuple(op.data), op.path in sealed,
                        op.nosuid, op.nodev, op.noexec))
        elif op.op == "node" and op.source != op.path:
            out.append(("bind", op.path, op.kind, op.source, False, op.nosuid, False, True))
        elif op.op == "bind":
            out.append(("bind", op.path, op.kind, op.source, op.ro, op.nosuid, op.nodev,
                        op.noexec))
        elif op.op == "symlink":
            target = os.path.normpath(os.path.join(os.path.dirname(op.path), op.target))
            if target in bound:
                out.append(("bind", op.path, "file", bound[target], True, True, True, False))
        elif op.op == "file":
            out.append(("bind", op.path, "file", "<state>", True, True, True, False))
    return out


def _read(ops, statedir):
    out = []
    for op in ops:
        if op.op == "fs":
            data = tuple(d for d in op.data if not d.startswith("source="))
            out.append(("fs", op.path, op.fstype, data, op.ro, op.nosuid, op.nodev, op.noexec))
        else:
            src = "<state>" if op.source.startswith(statedir + "/") else op.source
            out.append(("bind", op.path, op.kind, src, op.ro, op.nosuid, op.nodev, op.noexec))
    return out


def test_gpu_edits_written_into_a_config_read_back_as_the_same_ops(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    ops = from_edits(_edits(tmp_path))
    cfg = configedit.apply({"mounts": []}, _edits(tmp_path), str(state))
    back = configmount.mounts(cfg, str(tmp_path))
    assert _read(back, str(state)) == _written(ops)
    # What has no mount form: the node at its own path, as a device the
    # runtime makes, and every node's allow rule; the env.
    assert cfg["linux"]["devices"] == [{"path": "/dev/nvidiactl", "type": "c", "major": 195,
                                        "minor": 255, "fileMode": 0o666, "uid": 0, "gid": 0}]
    assert [(r["major"], r["minor"]) for r in cfg["linux"]["resources"]["devices"]] == \
        [(195, 255), (195, 1)]
    assert cfg["process"]["env"] == ["NVIDIA_VISIBLE_DEVICES=1"]
    # The generated file's content is the op's.
    cache = next(op for op in back if op.path == "/etc/ld.so.cache")
    assert open(cache.source, "rb").read() == b"a cache"
    # Read-only unless the edit says rw, in both directions.
    ro = {op.path: op.ro for op in back if op.op == "bind"}
    assert ro["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"] and not ro["/tmp/nvidia-mps"]


def test_a_destination_the_config_mounts_already_is_kept(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "own").mkdir()
    mine = {"destination": "/tmp/nvidia-mps", "type": "bind", "source": str(tmp_path / "own"),
            "options": ["rbind", "ro"]}
    cfg = configedit.apply({"mounts": [dict(mine)]}, _edits(tmp_path), str(state))
    assert cfg["mounts"][0] == mine
    assert [m["destination"] for m in cfg["mounts"]].count("/tmp/nvidia-mps") == 1
