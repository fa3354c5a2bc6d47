"""config.json -> RunSpec + OciRequest (gpusandbox/oci/config.py), no privileges."""
import json
import os

import pytest

from gpusandbox.errors import UsageError
from gpusandbox.oci import config as oc
from gpusandbox.oci.runtime import ops, state


def _bundle(tmp_path, **over):
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True, exist_ok=True)
    conf = {"ociVersion": "1.0.2",
            "process": {"args": ["sh"], "env": ["A=1", "NVIDIA_VISIBLE_DEVICES=0"],
                        "cwd": "/w", "user": {"uid": 0, "gid": 0, "umask": 18},
                        "capabilities": {"bounding": ["CAP_KILL", "CAP_CHOWN"],
                                         "effective": ["CAP_KILL"]},
                        "rlimits": [{"type": "RLIMIT_NOFILE", "soft": 10, "hard": 20}]},
            "root": {"path": "rootfs"},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                       {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                        "options": ["nosuid", "nodev"]},
                       {"destination": "/data", "type": "bind", "source": str(tmp_path),
                        "options": ["rbind", "ro", "noexec"]}],
            "linux": {"namespaces": [{"type": t} for t in ("pid", "mount", "uts", "network")],
                      "uidMappings": [], "maskedPaths": ["/proc/kcore"],
                      "sysctl": {"net.ipv4.ping_group_range": "0 0"},
                      "resources": {"pids": {"limit": 99}, "memory": {"limit": 1 << 30},
                                    "devices": [{"allow": True, "type": "c", "major": 10,
                                                 "minor": 200, "access": "rwm"}]}}}
    for path, value in over.items():
        obj = conf
        *keys, last = path.split(".")
        for k in keys:
            obj = obj[k]
        obj[last] = value
    (tmp_path / "config.json").write_text(json.dumps(conf))
    return str(tmp_path)


def _load(tmp_path, **over):
    return oc.load(_bundle(tmp_path, **over), {"GPUSANDBOX_DRIVER_ROOT": "/sim"}, "/f", 2)


def test_translation(tmp_path):
    spec = _load(tmp_path)
    req = spec.oci
    assert spec.argv == ["sh"] and spec.image == str(tmp_path / "rootfs")
    assert spec.image_env == ([("A", "1"), ("NVIDIA_VISIBLE_DEVICES", "0")], "/w")
    assert spec.rootfs_mode == "rw" and spec.net == "none"
    assert (spec.pids_limit, spec.memory) == ("99", str(1 << 30))
    # GPUs: the config's selection, the caller's driver root; nothing else of the caller's.
    assert req.plan_env == {} and spec.driver_root == "/sim"
    assert spec.gpu_request.devices == "0" and spec.gpu_request.caps == ("compute", "utility")
    assert [(m.path, m.op) for m in req.mounts] == [("/dev/mqueue", "fs"), ("/data", "bind")]
    data = req.mounts[1]
    assert (data.ro, data.noexec, data.recursive, data.nosuid) == (True, True, True, False)
    assert req.mounts[0].data == ("source=mqueue",)
    pr = req.process
    assert pr.caps[0] == (0, 5) and pr.caps[1] == (5,) and pr.caps[4] == ()
    assert pr.rlimits == [(7, 10, 20)] and pr.umask == 18
    assert req.sysctl == [("net.ipv4.ping_group_range", "0 0")]
    assert req.dev_rules == [("c", 10, 200, "rw")]
    assert req.keep_fds == (3, 4)
    assert req.devices == ([], [])


@pytest.mark.parametrize("path,value,why", [
    ("linux.intelRdt", {"closID": "a"}, "intelRdt is not supported"),
    ("process.apparmorProfile", "x", "no LSM support"),
    ("linux.namespaces", [{"type": "uts"}], "no mount namespace"),
    ("linux.namespaces", [{"type": "mount"}, {"type": "user"}], "needs a pid namespace"),
    ("linux.namespaces", [{"type": "pid"}, {"type": "mount"}, {"type": "uts"},
                          {"type": "user", "path": "/nonexistent/ns/user"}],
     "cannot open the user namespace /nonexistent/ns/user"),
    ("mounts", [{"destination": "/x", "type": "nfs", "source": "h:/x"}],
     "filesystem type 'nfs'"),
    ("mounts", [{"destination": "/x", "type": "bind", "source": "/", "options": ["remount"]}],
     "option remount"),
    ("linux.sysctl", {"../../x": "1"}, "invalid key"),
    ("process.capabilities", {"effective": ["CAP_NOPE"]}, "unknown capability"),
    ("ociVersion", "0.9", "not a 1.x version"),
    ("linux.rootfsPropagation", "rsharedd", "'rsharedd' is not a mount propagation"),
    ("linux.seccomp", {"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/x"},
     "listenerPath and flags"),
    ("linux.devices", [{"path": "/dev/sda", "type": "q", "major": 8, "minor": 0}],
     "unknown device type 'q'"),
    ("linux.devices", [{"path": "/dev/sda", "type": "b", "minor": 0}], "needs major and minor"),
])
def test_refusals(tmp_path, path, value, why):
    with pytest.raises(UsageError) as e:
        _load(tmp_path, **{path: value})
    assert why in e.value.line()


def test_propagation_and_namespaces_by_path(tmp_path):
    """Propagation as (MS_* flag, recursive): the root's and each mount's
    last option; pid, mount and cgroup namespaces with a path are joined,
    not made (no clone flag, and no cgroup namespace of the runtime's)."""
    from gpusandbox.linux import sys as k
    spec = _load(tmp_path, **{
        "linux.rootfsPropagation": "rshared",
        "mounts": [{"destination": "/x", "type": "bind", "source": "/",
                    "options": ["rbind", "rprivate", "slave"]},
                   {"destination": "/y", "type": "tmpfs", "source": "tmpfs",
                    "options": ["unbindable", "size=1m"]}],
        "linux.namespaces": [{"type": "pid", "path": "/proc/1/ns/pid"}, {"type": "ipc"},
                             {"type": "network"},
                             {"type": "mount", "path": "/proc/1/ns/mnt"},
                             {"type": "cgroup", "path": "/proc/1/ns/cgroup"}]})
    req = spec.oci
    x = req.extras
    assert req.rootfs_propagation == (k.MS_SHARED, True)
    assert [m.propagation for m in req.mounts] == [(k.MS_SLAVE, False),
                                                   (k.MS_UNBINDABLE, False)]
    assert req.mounts[1].data == ("source=tmpfs", "size=1m")
    assert x.ns_join == [("pid", "/proc/1/ns/pid"), ("mount", "/proc/1/ns/mnt"),
                         ("cgroup", "/proc/1/ns/cgroup")]
    flags = req.flags
    assert flags & k.CLONE_NEWIPC
    assert not flags & (k.CLONE_NEWPID | k.CLONE_NEWNS | k.CLONE_NEWCGROUP)


def test_devices_without_mknod():
    """Without CAP_MKNOD in the host's namespace a device is a host node, bound."""
    from gpusandbox.oci.confighost import _devices
    for dev, why in (({"path": "/dev/sda", "type": "b", "major": 8, "minor": 0},
                      "only character devices"),
                     ({"path": "/dev/x", "type": "c", "major": 4095, "minor": 77},
                      "no host character device 4095:77")):
        with pytest.raises(UsageError) as e:
            _devices({"devices": [dev]}, make=False)
        assert why in e.value.line()
    assert _devices({"devices": [{"path": "/dev/z", "type": "c", "major": 1, "minor": 5}]},
                    make=False) == ([("/dev/z", "/dev/zero", 1, 5)], [])


def test_signals_and_ids():
    assert [ops.parse_signal(s) for s in ("9", "KILL", "SIGTERM", "term", "RTMIN+2")] == \
        [9, 9, 15, 15, 36]
    with pytest.raises(Exception):
        ops.parse_signal("SIGNOPE")
    assert state.check_id("abc-1.2_x+y") == "abc-1.2_x+y"
    for bad in ("", "../x", "-a", "a/b", "é"):
        with pytest.raises(Exception):
            state.check_id(bad)
