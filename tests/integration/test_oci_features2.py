"""gpusandbox-oci: the config features crun's own suite checks (issue 13),
each seen from inside the container: the workload is pid 1 (parent 0),
process.scheduler / ioPriority / execCPUAffinity, linux.memoryPolicy and
personality, createContainer and startContainer hooks, LISTEN_FDS, the
standard /dev nodes nosuid,noexec, the mount table in the config's order; and,
as real root, a container sharing the host's pid and uts namespaces,
linux.devices made by mknod, stdio owned by the process's user and
run.oci.keep_original_groups.  One `run` per mode and case."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import MODES, VENV

OCI = str(VENV / "bin" / "gpusandbox-oci")
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}[os.uname().machine]

PROBE = f"""
import ctypes, json, os
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
def mount_opts(point):
    for line in open("/proc/self/mountinfo"):
        f = line.split()
        if f[4] == point:
            return f[5].split(",")
libc = ctypes.CDLL(None, use_errno=True)
def stat_of(p):
    try:
        st = os.stat(p)
    except OSError as e:
        return e.strerror
    return [oct(st.st_mode), st.st_uid, st.st_gid, os.major(st.st_rdev), os.minor(st.st_rdev)]
def fd3():
    try:
        return os.fstat(3).st_rdev == os.makedev(1, 3)
    except OSError:
        return False
out = {{
    "pid": os.getpid(), "ppid": status("PPid"), "uid": os.getuid(),
    "groups": sorted(os.getgroups()),
    "pidns": os.readlink("/proc/self/ns/pid"), "host": os.uname().nodename,
    "policy": os.sched_getscheduler(0), "nice": os.getpriority(os.PRIO_PROCESS, 0),
    "ioprio": libc.syscall({_IOPRIO_GET}, 1, 0),
    "numa": open("/proc/self/numa_maps").read().splitlines()[1].split()[1],
    "personality": open("/proc/self/personality").read().strip(),
    "cpus": sorted(os.sched_getaffinity(0)),
    "home": os.environ.get("HOME"),
    "listen": [os.environ.get("LISTEN_FDS"), os.environ.get("LISTEN_PID"), fd3()],
    "started": open("/tmp/started").read().strip() if os.path.exists("/tmp/started") else None,
    "devnull": mount_opts("/dev/null"),
    "stdout_owner": [os.fstat(1).st_uid, os.fstat(1).st_gid],
    "devices": {{p: stat_of(p) for p in ("/dev/ff", "/dev/zz", "/dev/bb", "/opt/dev/zz")}},
    "zero": open("/dev/zz", "rb").read(3) == bytes(3) if os.path.exists("/dev/zz") else None,
    "order": [f[4] for f in (line.split() for line in open("/proc/self/mountinfo"))
              if f[4] in ("/dev/mqueue", "/sys")],
}}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def oci_env(cli, test_user):
    d = Path(tempfile.mkdtemp(prefix="gsbx-ocif2-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run(d, name, conf, mode, user, wrap=()):
    """`gpusandbox-oci run` of conf as root or as the test user, with the
    runtime's fd 3 open on /dev/null and LISTEN_FDS=1 in its environment."""
    bundle = d / name
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(conf))
    if mode != "root":
        subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(bundle)], check=True)
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "LISTEN_FDS": "1"}
    argv = ["sh", "-c", 'exec 3</dev/null; exec "$@"', "sh", *wrap, OCI,
            "--root", str(bundle / "state"), "run", "--bundle", str(bundle), name]
    if mode != "root":
        argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                "--clear-groups", "--", *argv]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env,
                       cwd="/", stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not os.listdir(bundle / "state")       # `run` deletes what it created
    return json.loads(r.stdout.splitlines()[-1]), bundle


def _base(rootfs, mode, user, namespaces=("pid", "ipc", "uts", "mount", "network")):
    conf = {
        "ociVersion": "1.0.2",
        "process": {"args": ["python3", "-c", PROBE], "cwd": "/", "user": {"uid": 0, "gid": 0},
                    "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]},
        "root": {"path": str(rootfs), "readonly": True},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"namespaces": [{"type": t} for t in namespaces]},
    }
    return conf


@pytest.mark.parametrize("mode", MODES)
def test_process_settings_hooks_and_pid1(mode, oci_env, rootfs, test_user):
    """Rootless, the config names no user namespace: the runtime makes one
    mapping the process's ids to the caller's (crun's rule)."""
    conf = _base(rootfs, mode, test_user)
    conf["process"]["scheduler"] = {"policy": "SCHED_BATCH", "nice": 7}
    conf["process"]["ioPriority"] = {"class": "IOPRIO_CLASS_BE", "priority": 6}
    conf["process"]["execCPUAffinity"] = {"final": "0"}
    conf["linux"]["memoryPolicy"] = {"mode": "MPOL_BIND", "nodes": "0"}
    conf["linux"]["personality"] = {"domain": "LINUX32"}
    # The container's mount table in the config's order: its own /sys after its mqueue.
    conf["mounts"] += [{"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue"},
                       {"destination": "/sys", "type": "sysfs", "source": "sysfs",
                        "options": ["ro"]}]
    if mode == "root":
        conf["linux"]["sysctl"] = {"kernel.domainname": "example.org"}
    else:   # a user namespace's root may not write the uts sysctls; setdomainname works
        conf["domainname"] = "example.org"
    # createContainer: cwd the bundle, the container's /proc already mounted
    # over the root; startContainer: inside the container, after start.
    conf["hooks"] = {
        "createContainer": [{"path": "/bin/sh", "args": [
            "sh", "-c", f"test -e {rootfs}/proc/self/status && cat > created"]}],
        "startContainer": [{"path": "/bin/sh", "args": [
            "sh", "-c", "cat /proc/sys/kernel/domainname > /tmp/started"]}]}
    out, bundle = _run(oci_env, f"f2-{mode}", conf, mode, test_user)
    assert (out["pid"], out["ppid"]) == (1, "0")
    assert out["uid"] == 0
    assert (out["policy"], out["nice"]) == (os.SCHED_BATCH, 7)
    assert out["ioprio"] == (2 << 13) | 6
    assert out["numa"] == "bind:0"
    assert out["personality"] == "00000008"
    assert out["cpus"] == [0]
    assert out["listen"] == ["1", "1", True]
    assert out["started"] == "example.org"
    assert {"nosuid", "noexec"} <= set(out["devnull"])
    assert out["order"] == ["/dev/mqueue", "/sys"]
    state = json.loads((bundle / "created").read_text())
    assert (state["id"], state["status"], state["bundle"]) == (f"f2-{mode}", "created",
                                                               str(bundle))
    assert state["pid"] > 1


@pytest.mark.parametrize("mode", MODES)
def test_env_as_runc_home_from_passwd_no_path(mode, oci_env, rootfs, test_user):
    """The process's environment is the config's, as runc gives it: HOME (not
    in the config) from the container's passwd entry of the process's uid,
    whatever the caller's uid is; no PATH added; the command found without
    one (execvp(3)'s default)."""
    conf = _base(rootfs, mode, test_user)
    conf["process"]["args"] = ["python3", "-c",
                               "import json, os; print(json.dumps(dict(os.environ)))"]
    conf["process"]["env"] = ["A=1"]
    out, _ = _run(oci_env, f"f2-env-{mode}", conf, mode, test_user)
    assert out == {"A": "1", "HOME": "/root", "LISTEN_FDS": "1", "LISTEN_PID": "1"}
    conf["process"]["user"] = {"uid": 1000, "gid": 1000}
    if mode != "root":
        conf["linux"]["namespaces"].append({"type": "user"})
        conf["linux"]["uidMappings"] = [{"containerID": 1000, "hostID": test_user.pw_uid,
                                         "size": 1}]
        conf["linux"]["gidMappings"] = [{"containerID": 1000, "hostID": test_user.pw_gid,
                                         "size": 1}]
    out, _ = _run(oci_env, f"f2-env1000-{mode}", conf, mode, test_user)
    assert out["HOME"] == "/home/user" and "PATH" not in out


def test_host_namespaces_devices_and_user(cli, oci_env, rootfs, test_user, tmp_path):
    """Real root: no pid or uts namespace in the config shares the host's;
    linux.devices of every type are made by mknod with their mode and owner
    (a char device one is usable through the device filter); the process's
    user owns its stdio, gets HOME from the passwd, keeps the caller's groups
    with run.oci.keep_original_groups."""
    conf = _base(rootfs, "root", test_user, ("ipc", "mount", "network"))
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/sh\ntest:x:1000:1000:t:/var/empty:/bin/sh\n")
    conf["mounts"].append({"destination": "/etc/passwd", "type": "bind",
                           "source": str(passwd), "options": ["bind", "ro"]})
    conf["process"]["user"] = {"uid": 1000, "gid": 1000}
    conf["annotations"] = {"run.oci.keep_original_groups": "1"}
    conf["linux"]["devices"] = [
        {"path": "/dev/ff", "type": "p", "fileMode": 0o640, "uid": 1, "gid": 2},
        {"path": "/dev/zz", "type": "c", "major": 1, "minor": 5, "fileMode": 0o604, "uid": 3},
        {"path": "/dev/bb", "type": "b", "major": 7, "minor": 200, "fileMode": 0o600},
        {"path": "/opt/dev/zz", "type": "c", "major": 1, "minor": 5}]
    out, _ = _run(oci_env, "f2-host", conf, "root", test_user,
                  wrap=("setpriv", "--groups", "4242,4343", "--"))
    assert out["pid"] != 1 and out["pidns"] == os.readlink("/proc/self/ns/pid")
    assert out["host"] == os.uname().nodename
    assert out["devices"] == {"/dev/ff": ["0o10640", 1, 2, 0, 0],
                              "/dev/zz": ["0o20604", 3, 0, 1, 5],
                              "/dev/bb": ["0o60600", 0, 0, 7, 200],
                              "/opt/dev/zz": ["0o20666", 0, 0, 1, 5]}
    assert out["zero"] is True
    assert (out["uid"], out["stdout_owner"]) == (1000, [1000, 1000])
    assert out["groups"] == [4242, 4343]


def test_exec_home_and_no_new_privs(cli, oci_env, rootfs, test_user, tmp_path):
    """exec: HOME from the container's passwd when neither config sets it;
    a command-line exec gets no_new_privs only from --no-new-privs (crun's
    rule, whatever the container's config says)."""
    conf = _base(rootfs, "root", test_user)
    conf["process"]["args"] = ["sleep", "60"]
    conf["process"]["noNewPrivileges"] = True
    passwd = tmp_path / "passwd"
    passwd.write_text("root:x:0:0:root:/root:/bin/sh\ntest:x:1000:1000:t:/var/empty:/bin/sh\n")
    conf["mounts"].append({"destination": "/etc/passwd", "type": "bind",
                           "source": str(passwd), "options": ["bind", "ro"]})
    bundle = oci_env / "f2-exec"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(conf))
    rt = [OCI, "--root", str(bundle / "state")]
    # The container keeps the stdio it is given: none this test waits on.
    r = subprocess.run(rt + ["run", "--detach", "--bundle", str(bundle), "f2-exec"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       stdin=subprocess.DEVNULL, timeout=60)
    assert r.returncode == 0
    try:
        proc = bundle / "process.json"
        proc.write_text(json.dumps({"args": ["sh", "-c", "echo $HOME"], "cwd": "/",
                                    "user": {"uid": 1000, "gid": 1000},
                                    "env": ["PATH=/usr/bin:/bin"]}))
        r = subprocess.run(rt + ["exec", "--process", str(proc), "f2-exec"],
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout) == (0, "/var/empty\n"), r.stderr
        nnp = []
        for flags in ([], ["--no-new-privs"]):
            r = subprocess.run(rt + ["exec", *flags, "f2-exec", "grep", "NoNewPrivs",
                                     "/proc/self/status"], capture_output=True, text=True,
                               timeout=60)
            assert r.returncode == 0, r.stderr
            nnp.append(r.stdout.split()[-1])
        assert nnp == ["0", "1"]
    finally:
        subprocess.run(rt + ["delete", "--force", "f2-exec"], capture_output=True, timeout=60)


def test_devices_in_a_user_namespace(cli, oci_env, rootfs, test_user):
    """Real root, a container with a user namespace of its own (where nothing
    holds CAP_MKNOD): `create` makes the nodes outside and the init binds
    them; owners are the container's ids through the mapping."""
    conf = _base(rootfs, "root", test_user, ("pid", "ipc", "uts", "mount", "user"))
    # The whole range, as crun's test_devices: the image's files stay owned.
    rows = [{"containerID": 0, "hostID": 0, "size": 4294967295}]
    conf["linux"].update(uidMappings=rows, gidMappings=rows)
    conf["linux"]["devices"] = [
        {"path": "/dev/ff", "type": "p", "fileMode": 0o640, "uid": 1, "gid": 2},
        {"path": "/dev/bb", "type": "b", "major": 7, "minor": 200, "fileMode": 0o157,
         "uid": 10, "gid": 11}]
    out, _ = _run(oci_env, "f2-userns-dev", conf, "root", test_user)
    assert out["devices"]["/dev/ff"] == ["0o10640", 1, 2, 0, 0]
    assert out["devices"]["/dev/bb"] == ["0o60157", 10, 11, 7, 200]


def test_hostname_in_a_uts_namespace_given_by_path(cli, oci_env, rootfs, test_user):
    """A uts namespace given by path is the container's own: the config's
    hostname is set there (it was refused once pid and uts became optional)."""
    holder = subprocess.Popen(["unshare", "--uts", "sh", "-c", "echo in; exec sleep 60"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "in\n"      # the namespace exists
        path = f"/proc/{holder.pid}/ns/uts"
        conf = _base(rootfs, "root", test_user, ("pid", "ipc", "mount"))
        conf["linux"]["namespaces"].append({"type": "uts", "path": path})
        conf["hostname"] = "joined-host"
        out, _ = _run(oci_env, "f2-uts", conf, "root", test_user)
        assert out["host"] == "joined-host"
        r = subprocess.run(["nsenter", "-t", str(holder.pid), "-u", "hostname"],
                           capture_output=True, text=True, timeout=30)
        assert r.stdout.strip() == "joined-host"
        assert os.uname().nodename != "joined-host"
    finally:
        holder.kill()
        holder.wait()
