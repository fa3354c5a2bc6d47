"""The command's process settings are plan fields every door fills (plan.build):
capability sets, supplementary groups, no_new_privs, umask and the masked
and read-only /proc and /sys paths, whether the
launch is `gpusandbox run` or an OCI config; the command stage reads only
these (no branch on the door)."""
import json

from gpusandbox import plan as planmod
from gpusandbox.cli import parse_run_args
from gpusandbox.linux.caps import root_caps
from gpusandbox.oci import config as oc


def _fields(p):
    return (p.cap_bounding, p.cap_effective, p.cap_permitted, p.cap_inheritable,
            p.cap_ambient, p.groups, p.no_new_privs, p.umask)


def test_run_gets_the_five_sets_from_its_capabilities(tmp_path):
    root = tmp_path / "root"
    (root / "bin").mkdir(parents=True)
    p = planmod.build(parse_run_args([str(root), "true"]), {})
    keep = root_caps(False) if p.cmd_uid == 0 else ()
    assert _fields(p) == (keep, keep, keep, (), (), None, True, None)
    assert (p.masked_files, p.masked_dirs, p.readonly_paths) == \
        (planmod.MASKED_FILES, planmod.MASKED_DIRS, planmod.READONLY_PATHS)
    p = planmod.build(parse_run_args(["--net", "host", str(root), "true"]), {})
    keep = root_caps(True) if p.cmd_uid == 0 else ()
    assert p.cap_bounding == p.cap_effective == p.cap_permitted == keep


def test_an_oci_config_gives_each_set_its_own(tmp_path):
    (tmp_path / "rootfs" / "bin").mkdir(parents=True)
    conf = {"ociVersion": "1.0.2",
            "process": {"args": ["sh"], "cwd": "/", "noNewPrivileges": False,
                        "user": {"uid": 0, "gid": 0, "umask": 18, "additionalGids": [5, 7]},
                        "capabilities": {"bounding": ["CAP_KILL", "CAP_CHOWN", "CAP_SETUID"],
                                         "effective": ["CAP_KILL"],
                                         "permitted": ["CAP_KILL", "CAP_CHOWN"],
                                         "inheritable": ["CAP_CHOWN"],
                                         "ambient": ["CAP_CHOWN"]}},
            "root": {"path": "rootfs"},
            "linux": {"namespaces": [{"type": t} for t in ("pid", "mount", "user")],
                      "maskedPaths": ["/proc/kcore", "/proc/acpi"],
                      "readonlyPaths": ["/proc/sys"],
                      "uidMappings": [{"containerID": 0, "hostID": 0, "size": 1}],
                      "gidMappings": [{"containerID": 0, "hostID": 0, "size": 1}]}}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    spec = oc.load(str(tmp_path), {})
    p = planmod.build(spec, spec.oci.plan_env)
    assert _fields(p) == ((0, 5, 7), (5,), (0, 5), (0,), (0,), [5, 7], False, 18)
    assert (p.masked_files, p.masked_dirs, p.readonly_paths) == \
        (("/proc/kcore", "/proc/acpi"),) * 2 + (("/proc/sys",),)
