"""`exec`'s plan (oci/runtime/execute.py) comes through create's typed process
parser (oci/configprocess.py) and the same plan fields (configplan.process):
a bad field is one line naming it, and the process a container's config
describes gets, through `exec`, the seccomp program, capability sets, ids,
groups, umask and environment `create` gives it."""
import json
import os

import pytest

from gpusandbox import plan as planmod
from gpusandbox.errors import UsageError
from gpusandbox.oci import config as oc
from gpusandbox.oci.runtime import execute

SECCOMP = {"defaultAction": "SCMP_ACT_ALLOW",
           "syscalls": [{"names": ["mknod", "mknodat"], "action": "SCMP_ACT_ERRNO"}]}
PROCESS = {"args": ["sh", "-c", "id"], "cwd": "/w", "env": ["A=1", "PATH=/bin"],
           "noNewPrivileges": True,
           "user": {"uid": 1000, "gid": 100, "umask": 18, "additionalGids": [5, 7]},
           "capabilities": {"bounding": ["CAP_KILL", "CAP_CHOWN", "CAP_SETUID"],
                            "effective": ["CAP_KILL"], "permitted": ["CAP_KILL", "CAP_CHOWN"],
                            "inheritable": ["CAP_CHOWN"], "ambient": ["CAP_CHOWN"]},
           "scheduler": {"policy": "SCHED_BATCH"}}


def _bundle(tmp_path, process=PROCESS):
    (tmp_path / "rootfs" / "bin").mkdir(parents=True, exist_ok=True)
    conf = {"ociVersion": "1.0.2", "process": process, "root": {"path": "rootfs"},
            "linux": {"namespaces": [{"type": t} for t in ("pid", "mount", "user")],
                      "uidMappings": [{"containerID": 0, "hostID": 0, "size": 65536}],
                      "gidMappings": [{"containerID": 0, "hostID": 0, "size": 65536}],
                      "seccomp": SECCOMP}}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    return {"bundle": str(tmp_path), "pid": os.getpid()}


def _fields(p):
    return (p.argv, p.env, p.workdir, p.cmd_uid, p.cmd_gid, p.cap_bounding, p.cap_effective,
            p.cap_permitted, p.cap_inheritable, p.cap_ambient, p.groups, p.clear_groups,
            p.no_new_privs, p.umask, p.stdio_owner, p.seccomp)


def _exec(tmp_path, st, args):
    cid, proc, opts, where = execute._parse(args)
    return execute._plan(st, proc, "--no-new-privs" in args, where)


def test_exec_of_the_configs_process_is_creates(tmp_path):
    st = _bundle(tmp_path / "b")
    spec = oc.load(st["bundle"], {})
    created = planmod.build(spec, spec.oci.plan_env)
    # podman's exec: the whole process object in --process FILE.
    pfile = tmp_path / "process.json"
    pfile.write_text(json.dumps(dict(PROCESS, env=[])))
    p = _exec(tmp_path, st, ["--process", str(pfile), "c1"])
    assert _fields(p) == _fields(created)
    assert p.seccomp is not None
    assert p.proc_settings.sched == created.proc_settings.sched


def test_a_command_line_exec_over_the_containers_process(tmp_path):
    """Its user, capabilities and environment are the container's, its
    arguments, variables and no_new_privs its own (crun's rule: only from
    --no-new-privs); the container's kernel settings are not inherited."""
    st = _bundle(tmp_path)
    p = _exec(tmp_path, st, ["-e", "B=2", "--cwd", "/tmp", "c1", "ls", "/"])
    assert (p.argv, p.workdir, p.env) == (["ls", "/"], "/tmp",
                                          {"A": "1", "PATH": "/bin", "B": "2"})
    assert (p.cmd_uid, p.cmd_gid, p.groups, p.umask) == (1000, 100, [5, 7], 18)
    assert (p.cap_effective, p.cap_ambient, p.no_new_privs) == ((5,), (0,), False)
    assert p.proc_settings is None
    assert _exec(tmp_path, st, ["--no-new-privs", "c1", "ls"]).no_new_privs is True
    p = _exec(tmp_path, st, ["-u", "7:8", "c1", "ls"])
    assert (p.cmd_uid, p.cmd_gid, p.groups) == (7, 8, None)


@pytest.mark.parametrize("process,line", [
    ({"args": ["sh"], "user": {"uid": "root"}},
     "process.user: uid has the wrong type (str)"),
    ({"args": ["sh"], "user": {"uid": 0, "additionalGids": ["wheel"]}},
     "process.user.additionalGids: must be a list of group ids"),
    ({"args": []}, "process.args: empty"),
    ({"args": ["sh"], "cwd": "tmp"}, "process.cwd: must be an absolute path"),
    ({"args": ["sh"], "env": "A=1"}, "process: env has the wrong type (str)"),
    ({"args": ["sh"], "capabilities": {"effective": ["CAP_NOPE"]}},
     "process.capabilities.effective: unknown capability CAP_NOPE"),
    ({"args": ["sh"], "noNewPrivileges": "yes"},
     "process: noNewPrivileges has the wrong type (str)"),
])
def test_a_bad_exec_process_field_is_one_line_naming_it(tmp_path, process, line):
    st = _bundle(tmp_path / "b")
    pfile = tmp_path / "process.json"
    pfile.write_text(json.dumps(process))
    with pytest.raises(UsageError) as e:
        _exec(tmp_path, st, ["--process", str(pfile), "c1"])
    assert e.value.line() == f"exec --process {pfile}: {line}"


def test_a_bad_exec_user_or_file(tmp_path):
    st = _bundle(tmp_path / "b")
    with pytest.raises(UsageError) as e:
        _exec(tmp_path, st, ["-u", "root", "c1", "ls"])
    assert e.value.line() == "exec --user root: not UID[:GID] (numbers)"
    pfile = tmp_path / "process.json"
    pfile.write_text("[1]")
    with pytest.raises(UsageError) as e:
        _exec(tmp_path, st, ["--process", str(pfile), "c1"])
    assert e.value.line() == f"exec --process {pfile}: not a JSON object"
    pfile.write_text("{")
    with pytest.raises(UsageError) as e:
        _exec(tmp_path, st, ["--process", str(pfile), "c1"])
    assert e.value.line() == f"exec --process {pfile}: not valid JSON"
