"""gpusandbox-oci at crun's level for namespaces and hooks (issue 25): user
namespaces mapping the container's root to another host id, namespaces
joined by path, mount propagation, hooks per the runtime spec, and errors
of the init after `create` reported by `start`; through the runtime CLI
and through podman, root and rootless where it applies."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import MODES, VENV

OCI = str(VENV / "bin" / "gpusandbox-oci")
ENV = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}


@pytest.fixture(scope="module")
def work(cli, test_user):
    d = Path(tempfile.mkdtemp(prefix="gsbx-ocins-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as(mode, user, argv):
    if mode == "root":
        return argv
    return ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups",
            "--", *argv]


def _conf(rootfs, script, namespaces=("pid", "ipc", "uts", "mount", "network"), **linux):
    return {
        "ociVersion": "1.0.2",
        "process": {"args": ["sh", "-c", script], "cwd": "/", "user": {"uid": 0, "gid": 0},
                    "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]},
        "root": {"path": str(rootfs), "readonly": True},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                    "options": ["nosuid", "mode=755", "size=65536k"]}],
        "linux": dict({"namespaces": [{"type": t} for t in namespaces]}, **linux),
    }


def _bundle(work, name, conf, mode="root", user=None):
    bundle = work / name
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(conf))
    if mode != "root":
        subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(bundle)], check=True)
    return bundle


def _rt(bundle, mode="root", user=None):
    return _as(mode, user, [OCI, "--root", str(bundle / "state")])


def _oci(bundle, *args, mode="root", user=None, timeout=60):
    return subprocess.run(_rt(bundle, mode, user) + list(args), capture_output=True, text=True,
                          timeout=timeout, env=ENV, cwd="/", stdin=subprocess.DEVNULL)


# -- user namespaces mapping root to another host id ------------------------

@pytest.mark.parametrize("readonly", [True, False])
def test_userns_maps_root_to_another_host_id(work, rootfs, readonly):
    """Real root, container root mapped to host 100000 (podman --uidmap,
    --userns=auto): the init becomes the namespace's root before it
    creates mount points, so create works; the workload is uid 0 inside,
    100000 outside, and can write its tmpfs."""
    rows = [{"containerID": 0, "hostID": 100000, "size": 65536}]
    conf = _conf(rootfs, "id -u; id -g; cat /proc/self/uid_map; touch /dev/x && echo wrote",
                 ("pid", "ipc", "uts", "mount", "network", "user"),
                 uidMappings=rows, gidMappings=rows)
    conf["root"]["readonly"] = readonly
    if not readonly:
        # Written through, an image of root's without /run and /tmp: their
        # mount points are made as the caller, before the switch (the
        # namespace's root may not write there).  A copy of hard links.
        image = work / "idmap-image"
        subprocess.run(["cp", "-al", str(rootfs), str(image)], check=True)
        shutil.rmtree(image / "tmp")
        shutil.rmtree(image / "run")
        conf["root"]["path"] = str(image)
    # In a bundle closed to others: the image is walked with the caller's
    # ids, before the switch.
    b = _bundle(work, f"idmap-{readonly}", conf)
    os.chmod(b, 0o700)
    r = _oci(b, "run", "--bundle", str(b), f"idmap-{readonly}")
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert out[:2] == ["0", "0"]
    assert out[2:5] == ["0", "100000", "65536"]
    assert out[-1] == "wrote"


def test_userns_map_of_neither_caller_nor_root(work, rootfs):
    rows = [{"containerID": 1, "hostID": 100000, "size": 10}]
    conf = _conf(rootfs, "true", ("pid", "ipc", "uts", "mount", "network", "user"),
                 uidMappings=rows, gidMappings=rows)
    b = _bundle(work, "idmap-noroot", conf)
    r = _oci(b, "run", "--bundle", str(b), "idmap-noroot")
    assert r.returncode != 0
    assert "maps neither the caller's uid nor uid 0" in r.stderr, r.stderr
    assert not os.listdir(b / "state")


# -- podman ------------------------------------------------------------------

class Podman:
    def __init__(self, mode, user, home, image):
        self.mode, self.user, self.home, self.image = mode, user, home, image

    def argv(self, args):
        cmd = ["podman", "--runtime", OCI] + list(args)
        if self.mode == "root":
            cmd[1:1] = ["--root", f"{self.home}/storage", "--runroot", f"{self.home}/rr",
                        "--tmpdir", f"{self.home}/tmp"]
        else:
            cmd = ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                   "--clear-groups", "--", "env", "-i", "PATH=/usr/bin:/bin:/usr/sbin:/sbin",
                   f"HOME={self.home}", f"XDG_RUNTIME_DIR={self.home}/run"] + cmd
        return cmd

    def __call__(self, *args, timeout=90):
        return subprocess.run(self.argv(args), capture_output=True, text=True, timeout=timeout,
                              cwd="/", stdin=subprocess.DEVNULL)


RUN = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--network", "none"]


@pytest.fixture(scope="module", params=MODES)
def podman(request, cli, rootfs, test_user):
    if not shutil.which("podman") or not shutil.which("conmon"):
        pytest.skip("podman and conmon are not installed")
    home = Path(tempfile.mkdtemp(prefix="gsbx-test-podman-ocins-", dir="/tmp"))
    os.chmod(home, 0o755)
    (home / "run").mkdir(mode=0o700)
    for p in (home, home / "run"):
        os.chown(p, test_user.pw_uid, test_user.pw_gid)
    tar = home / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
    pm = Podman(request.param, test_user, home, f"localhost/gsbx-ocins-{os.getpid()}:1")
    yield from with_image(pm, tar, home)


def with_image(pm, tar, home):
    """A podman fixture's body: the rootfs tar imported as pm.image; its store
    reset and `home` removed afterwards."""
    r = pm("import", str(tar), pm.image, timeout=120)
    assert r.returncode == 0, r.stderr
    try:
        yield pm
    finally:
        pm("rmi", "-f", pm.image)
        pm("system", "reset", "--force", timeout=120)
        shutil.rmtree(home, ignore_errors=True)


def test_podman_uidmap(podman):
    """--uidmap: root maps the container's 0 to host 100000; rootless to
    the second id of its own namespace (the user's first subordinate id)."""
    start = "100000" if podman.mode == "root" else "1"
    r = podman("run", "--rm", *RUN, "--uidmap", f"0:{start}:5000", "--gidmap",
               f"0:{start}:5000", podman.image, "sh", "-c",
               "id -u; cat /proc/self/uid_map; touch /tmp/x && echo wrote")
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert out[:4] == ["0", "0", start, "5000"] and out[-1] == "wrote", r.stdout


# -- hooks per the runtime spec -----------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_hooks_env_state_and_a_failing_poststart(mode, work, rootfs, test_user):
    """A hook without `env` inherits the runtime's environment (runc, crun's
    test_hook_env_inherit), one with `env` gets only that; prestart sees
    the container created (runtime-tools' hooks_stdin), createRuntime
    creating; a failing poststart hook is a warning: the next one runs and
    `start` goes on (runtime-spec runtime.md, Lifecycle)."""
    b = work / f"hooks-{mode}"
    conf = _conf(rootfs, "echo ran")

    def hook(name, env=None, cmd="cat > {b}/{n}.json; env > {b}/{n}.env"):
        h = {"path": "/bin/sh", "args": ["sh", "-c", cmd.format(b=b, n=name)]}
        if env is not None:
            h["env"] = env
        return h
    conf["hooks"] = {"prestart": [hook("pre")],
                     "createRuntime": [hook("crt", ["ONLY=1"])],
                     "poststart": [{"path": "/bin/false"}, hook("post")]}
    _bundle(work, b.name, conf, mode, test_user)
    env = dict(ENV, GSBX_MARK="inherited")
    r = subprocess.run(_rt(b, mode, test_user) + ["run", "--bundle", str(b), b.name],
                       capture_output=True, text=True, timeout=60, env=env, cwd="/",
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ran"]
    assert "gpusandbox: warning: poststart hook /bin/false: exit 1" in r.stderr, r.stderr
    pre_env = (b / "pre.env").read_text().splitlines()
    assert "GSBX_MARK=inherited" in pre_env and f"PATH={ENV['PATH']}" in pre_env
    crt_env = (b / "crt.env").read_text().splitlines()
    assert "ONLY=1" in crt_env and not any(x.startswith("GSBX_MARK=") for x in crt_env)
    states = {n: json.loads((b / f"{n}.json").read_text()) for n in ("pre", "crt", "post")}
    assert [states[n]["status"] for n in ("pre", "crt", "post")] == \
        ["created", "creating", "running"]


# -- errors of the init after create ------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("entry", ["sh", "python"])
def test_start_reports_a_failure_after_create(entry, mode, work, rootfs, test_user):
    """Capabilities the init cannot set (effective beyond permitted): create
    succeeds, the init fails at capset after `start` released it, and
    `start` (the shell entry's and the Python path's alike) exits 1 with
    that one line instead of 0."""
    name = f"late-{entry}-{mode}"
    conf = _conf(rootfs, "echo should-not-run")
    conf["process"]["capabilities"] = {"bounding": ["CAP_SYS_ADMIN"],
                                       "effective": ["CAP_SYS_ADMIN"], "permitted": []}
    b = _bundle(work, name, conf, mode, test_user)
    # The init keeps create's stdio (conmon's pipes): files here, not pipes
    # whose end would wait for the container.
    with open(b / "init.err", "w+") as err:
        r = subprocess.run(_rt(b, mode, test_user) + ["create", "--bundle", str(b), name],
                           stdout=err, stderr=err, timeout=60, env=ENV, cwd="/",
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, err.read()
    try:
        rt = _rt(b, mode, test_user)
        if entry == "python":
            rt[rt.index(OCI)] = str(VENV / "bin" / "gpusandbox")
            rt.insert(rt.index(str(VENV / "bin" / "gpusandbox")) + 1, "oci")
        r = subprocess.run(rt + ["start", name], capture_output=True, text=True, timeout=60,
                           env=ENV, cwd="/", stdin=subprocess.DEVNULL)
        assert r.returncode == 1
        assert r.stderr == ("gpusandbox: error: dropping privileges: capset failed: "
                            "Operation not permitted\n")
        assert "should-not-run" not in r.stdout
    finally:
        r = _oci(b, "delete", "--force", name, mode=mode, user=test_user)
    assert r.returncode == 0, r.stderr


# -- namespaces by path ---------------------------------------------------------

NS_LINKS = {"pid": "pid", "mount": "mnt", "cgroup": "cgroup", "ipc": "ipc", "uts": "uts",
            "network": "net"}


def _ns_of(pid, types):
    return [os.readlink(f"/proc/{pid}/ns/{NS_LINKS[t]}") for t in types]


def test_join_every_namespace_by_path(work, rootfs):
    """pid, mount, cgroup, ipc, uts and network namespaces given by path are
    the container's (runc's rule: joined, never made): a holder's, made by
    unshare(1); the container sees the holder as pid 1 of its pid
    namespace, and builds its root in the holder's mount namespace."""
    types = ["pid", "mount", "cgroup", "ipc", "uts", "network"]
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--mount", "--cgroup", "--ipc",
                               "--uts", "--net", "--propagation", "private", "sh", "-c",
                               "echo in; exec sleep 60"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "in\n"
        inner = int(subprocess.run(["pgrep", "-P", str(holder.pid)], capture_output=True,
                                   text=True).stdout.split()[0])
        want = _ns_of(inner, types)
        assert want != _ns_of(os.getpid(), types)
        conf = _conf(rootfs, "readlink " + " ".join(f"/proc/self/ns/{NS_LINKS[t]}"
                                                     for t in types)
                     + "; cat /proc/1/comm", ())
        conf["linux"]["namespaces"] = [{"type": t, "path": f"/proc/{inner}/ns/{NS_LINKS[t]}"}
                                       for t in types]
        b = _bundle(work, "join-all", conf)
        r = _oci(b, "run", "--bundle", str(b), "join-all")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == want + ["sleep"]
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("mode", ["root"])
def test_second_container_joins_the_firsts_namespaces(mode, work, rootfs, test_user):
    """A pod's way: the second container joins the first's pid, ipc, uts,
    network and cgroup namespaces by /proc/PID/ns path; its mount namespace
    is its own."""
    first = "ns-first"
    b1 = _bundle(work, first, _conf(rootfs, "exec sleep 60"), mode, test_user)
    with open(b1 / "init.err", "w") as err:
        r = subprocess.run(_rt(b1, mode, test_user) + ["create", "--bundle", str(b1), first],
                           stdout=err, stderr=err, timeout=60, env=ENV, cwd="/",
                           stdin=subprocess.DEVNULL)
    assert r.returncode == 0, (b1 / "init.err").read_text()
    try:
        assert _oci(b1, "start", first, mode=mode, user=test_user).returncode == 0
        pid = json.loads(_oci(b1, "state", first, mode=mode, user=test_user).stdout)["pid"]
        shared = ["pid", "ipc", "uts", "network", "cgroup"]
        conf = _conf(rootfs, "readlink " + " ".join(f"/proc/self/ns/{NS_LINKS[t]}"
                                                     for t in shared + ["mount"])
                     + "; cat /proc/1/comm", ("mount",))
        conf["linux"]["namespaces"] += [{"type": t, "path": f"/proc/{pid}/ns/{NS_LINKS[t]}"}
                                        for t in shared]
        b2 = _bundle(work, "ns-second", conf, mode, test_user)
        r = _oci(b2, "run", "--bundle", str(b2), "ns-second", mode=mode, user=test_user)
        assert r.returncode == 0, r.stderr
        out = r.stdout.split()
        assert out[:5] == _ns_of(pid, shared)
        assert out[5] != _ns_of(pid, ["mount"])[0]
        assert out[6] == "sleep"
    finally:
        _oci(b1, "delete", "--force", first, mode=mode, user=test_user)


def test_podman_pid_and_ipc_of_another_container(podman):
    """podman --pid container:X --ipc container:X --uts container:X: the
    runtime joins X's namespaces by the paths podman writes."""
    if podman.mode != "root":
        pytest.skip("rootless: each container has a user namespace of its own, and joining "
                    "a user namespace by path is not supported")
    name = f"gsbx-ocins-x-{os.getpid()}"
    r = podman("run", "-d", "--name", name, *RUN, podman.image, "sleep", "60")
    assert r.returncode == 0, r.stderr
    try:
        probe = "readlink /proc/self/ns/pid /proc/self/ns/ipc /proc/self/ns/uts; cat /proc/1/comm"
        want = podman("exec", name, "sh", "-c", probe)
        assert want.returncode == 0, want.stderr
        r = podman("run", "--rm", *RUN, "--pid", f"container:{name}", "--ipc",
                   f"container:{name}", "--uts", f"container:{name}", podman.image,
                   "sh", "-c", probe)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == want.stdout.split()
        assert r.stdout.split()[-1] == "sleep"
    finally:
        podman("rm", "-f", "-t", "0", name)


# -- mount propagation ------------------------------------------------------------

PROP_PROBE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
def mount(src, tgt, fs, flags):
    r = libc.mount(src and src.encode(), tgt.encode(), fs and fs.encode(), flags, None)
    return 0 if r == 0 else ctypes.get_errno()
if mount("/", "/opt", None, 0x1000 | 0x4000):      # MS_BIND | MS_REC
    print("bind-refused"); sys.exit(0)
mount("none", "/mnt", "tmpfs", 0)
open("/mnt/seen", "w").close()
print("propagated" if os.path.exists("/opt/mnt/seen") else "not-propagated")
"""


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prop,want", [("shared", "propagated"), ("rshared", "propagated"),
                                       ("slave", "not-propagated"),
                                       ("private", "not-propagated"),
                                       ("unbindable", "bind-refused")])
def test_rootfs_propagation(prop, want, mode, work, rootfs, test_user):
    """linux.rootfsPropagation on the container's root (runtime-tools'
    linux_rootfs_propagation): shared, a bind of / sees a mount made after
    it; slave and private, not; unbindable, the bind is refused."""
    conf = _conf(rootfs, "", rootfsPropagation=prop)
    conf["process"]["args"] = ["python3", "-c", PROP_PROBE]
    conf["process"]["capabilities"] = {s: ["CAP_SYS_ADMIN"]
                                       for s in ("bounding", "effective", "permitted")}
    name = f"rprop-{prop}-{mode}"
    b = _bundle(work, name, conf, mode, test_user)
    r = _oci(b, "run", "--bundle", str(b), name, mode=mode, user=test_user)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [want]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("opt,want", [("rslave", "seen"), ("rshared", "seen"),
                                      ("rprivate", "unseen")])
def test_bind_mount_propagation(opt, want, mode, work, rootfs, test_user):
    """A bind mount's propagation option: slave (and shared, which the init
    makes of a slave copy) keep receiving what the host mounts under the
    source after the container started (Kubernetes' HostToContainer);
    private does not."""
    name = f"mprop-{opt}-{mode}"
    src = work / f"{name}-src"
    src.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "none", str(src)], check=True)
    try:
        subprocess.run(["mount", "--make-shared", str(src)], check=True)
        (src / "sub").mkdir()
        conf = _conf(rootfs, "until [ -e /src/go ]; do sleep 0.05; done; "
                     "if [ -e /src/sub/marker ]; then echo seen; else echo unseen; fi "
                     "> /src/result")
        conf["mounts"].append({"destination": "/src", "type": "bind", "source": str(src),
                               "options": ["rbind", opt]})
        b = _bundle(work, name, conf, mode, test_user)
        with open(b / "init.err", "w") as err:
            r = subprocess.run(_rt(b, mode, test_user) + ["create", "--bundle", str(b), name],
                               stdout=err, stderr=err, timeout=60, env=ENV, cwd="/",
                               stdin=subprocess.DEVNULL)
        assert r.returncode == 0, (b / "init.err").read_text()
        try:
            assert _oci(b, "start", name, mode=mode, user=test_user).returncode == 0
            subprocess.run(["mount", "-t", "tmpfs", "none", str(src / "sub")], check=True)
            (src / "sub" / "marker").touch()
            (src / "go").touch()
            for _ in range(600):
                if (src / "result").exists() and (src / "result").read_text():
                    break
                subprocess.run(["sleep", "0.05"])
            assert (src / "result").read_text().split() == [want], \
                (b / "init.err").read_text()
        finally:
            _oci(b, "delete", "--force", name, mode=mode, user=test_user)
    finally:
        subprocess.run(["umount", "-R", str(src)])


# -- delete --regex -------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_delete_regex(mode, work, rootfs, test_user):
    """crun's `delete --force --regex RE`: every container whose id RE
    matches goes; the others stay; a bad expression is one line, exit 1."""
    b = _bundle(work, f"regex-{mode}", _conf(rootfs, "exec sleep 60"), mode, test_user)
    for name in ("rx-a", "rx-b", "keep"):
        with open(b / "init.err", "w") as err:
            r = subprocess.run(_rt(b, mode, test_user) + ["create", "--bundle", str(b), name],
                               stdout=err, stderr=err, timeout=60, env=ENV, cwd="/",
                               stdin=subprocess.DEVNULL)
        assert r.returncode == 0, (b / "init.err").read_text()
    try:
        r = _oci(b, "delete", "--regex", "^rx-", mode=mode, user=test_user)
        assert r.returncode == 1 and "not stopped" in r.stderr     # created: needs --force
        r = _oci(b, "delete", "-f", "--regex", "^rx-", mode=mode, user=test_user)
        assert (r.returncode, r.stderr) == (0, "")
        assert _oci(b, "list", "-q", mode=mode, user=test_user).stdout.split() == ["keep"]
        r = _oci(b, "delete", "-f", "--regex", "(", mode=mode, user=test_user)
        assert r.returncode == 1
        assert r.stderr.startswith("gpusandbox: error: delete --regex '(': not a regular "
                                   "expression")
    finally:
        _oci(b, "delete", "-f", "keep", mode=mode, user=test_user)


# -- seccomp: unknown syscall names -------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_seccomp_unknown_syscall_names(mode, work, rootfs, test_user):
    """An OCI config's syscall name the runtime does not know is left out
    (runc's and crun's rule), the rest of the profile applies; crun's
    annotation run.oci.seccomp_fail_unknown_syscall=1 makes it a refusal."""
    conf = _conf(rootfs, "mkdir /dev/d 2>/dev/null && echo made || echo denied")
    conf["linux"]["seccomp"] = {
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["this_syscall_does_not_exist_12345", "mkdir", "mkdirat"],
                      "action": "SCMP_ACT_ERRNO", "errnoRet": 1}]}
    b = _bundle(work, f"scunk-{mode}", conf, mode, test_user)
    r = _oci(b, "run", "--bundle", str(b), "scunk", mode=mode, user=test_user)
    assert (r.returncode, r.stdout.split()) == (0, ["denied"]), r.stderr
    conf["annotations"] = {"run.oci.seccomp_fail_unknown_syscall": "1"}
    (b / "config.json").write_text(json.dumps(conf))
    r = _oci(b, "run", "--bundle", str(b), "scunk", mode=mode, user=test_user)
    assert r.returncode != 0
    assert "unknown syscall 'this_syscall_does_not_exist_12345'" in r.stderr, r.stderr
    assert not os.listdir(b / "state")


@pytest.mark.parametrize("mode", MODES)
def test_mount_table_in_the_configs_order_with_binds(mode, work, rootfs, test_user):
    """A bind mount listed between two tmpfs shows between them in
    /proc/self/mountinfo (listed by mount id since Linux 6.8: the bind's
    source, cloned before the image was attached, is cloned again when
    attached)."""
    conf = _conf(rootfs, "awk '$5 ~ /^\\/mnt\\/m[123]$/ {print $5}' /proc/self/mountinfo")
    conf["mounts"] += [
        {"destination": "/mnt/m1", "type": "tmpfs", "source": "tmpfs", "options": ["size=1k"]},
        {"destination": "/mnt/m2", "type": "bind", "source": "/etc", "options": ["rbind", "ro"]},
        {"destination": "/mnt/m3", "type": "tmpfs", "source": "tmpfs", "options": ["size=1k"]}]
    name = f"order-{mode}"
    b = _bundle(work, name, conf, mode, test_user)
    r = _oci(b, "run", "--bundle", str(b), name, mode=mode, user=test_user)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["/mnt/m1", "/mnt/m2", "/mnt/m3"]
