"""Another user on the node against gpusandbox-oci's state root (issue 23,
item 3): a squatted XDG_RUNTIME_DIR (/tmp/<name>, where no /run/user
exists), a --root under a directory the attacker can rename in, and a state
planted or swapped there before the victim's next command.  The victim
refuses with one line (or passes over the planted entry), never runs the
attacker's hooks (they would write into the victim's canary directory, or
root's under /root), never signals the process a planted state names (the
victim's own sleeper) and never prints the attacker's state; root and
rootless.  Each case runs in a private mount namespace with fresh /tmp and
/run (ocistate_ns.py)."""
import json
import os
import shutil
import tempfile

import pytest

from .conftest import BASE, MODES
from .crossuser import Canaries
from .oci_fixtures import make_rootfs
from .ocistate_ns import one_line_error, plant, run_steps, sh


@pytest.fixture(scope="module")
def bed(cli, test_user):
    """A root filesystem and a bundle per mode outside /tmp (the cases hide
    /tmp under a tmpfs of their own)."""
    base = tempfile.mkdtemp(prefix="ocistate-", dir=BASE)
    os.chmod(base, 0o755)
    rootfs = make_rootfs(base)
    for mode in MODES:
        conf = {"ociVersion": "1.0.2",
                "process": {"args": ["sleep", "300"], "cwd": "/", "user": {"uid": 0, "gid": 0},
                            "env": ["PATH=/usr/bin:/bin"]},
                "root": {"path": str(rootfs), "readonly": True},
                "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")]}}
        if mode == "rootless":
            conf["linux"]["namespaces"].append({"type": "user"})
            for key, i in (("uidMappings", test_user.pw_uid), ("gidMappings", test_user.pw_gid)):
                conf["linux"][key] = [{"containerID": 0, "hostID": i, "size": 1}]
        b = os.path.join(base, f"bundle-{mode}")
        os.mkdir(b)
        with open(os.path.join(b, "config.json"), "w") as f:
            json.dump(conf, f)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def canaries(bed, test_user):
    d = tempfile.mkdtemp(prefix="canaries-", dir=bed)
    c = Canaries.plant(d, [test_user])
    yield c
    c.remove()


def _victim(mode):
    return "root" if mode == "root" else "victim"


def _hook(canaries, mode, test_user):
    """A hook that writes a file into the victim's canary directory."""
    d = canaries.dirs["root" if mode == "root" else test_user.pw_name]
    return {"path": "/bin/sh", "args": ["sh", "-c", f"id -u > {d}/pwned"]}


def _detached(cmd):
    """A command whose container outlives it: its stdio to files (the
    container's init keeps what it inherits), their text passed on."""
    return (f'o=$(mktemp); e=$(mktemp); {cmd} </dev/null >"$o" 2>"$e"; rc=$?; '
            'cat "$o"; cat "$e" >&2; rm -f "$o" "$e"; exit $rc')


def _attacker_state(hook):
    return json.dumps({"id": "c1", "pid": 0, "start_time": 0, "bundle": "/attacker",
                       "rootfs": "/attacker/rootfs", "created": "now", "annotations": {},
                       "cgroup": "", "cgroup_version": 2, "hooks": {"poststop": [hook]}})


def _swap(root, hook):
    """The attacker's move after the victim's create: the state root renamed
    away and one of its own in its place, a container c1 with a poststop hook."""
    return (f"set -e; [ ! -e {root} ] || mv {root} {root}.moved\n"
            f"mkdir -m 0777 {root} {root}/c1\n"
            f"cat > {root}/c1/state.json <<'EOF'\n{_attacker_state(hook)}\nEOF\n"
            f"chmod 0666 {root}/c1/state.json")


def test_squatted_xdg_runtime_dir(bed, canaries, test_user, attack_user):
    """The issue's attack: XDG_RUNTIME_DIR=/tmp/<name> made first by the
    attacker (0777), no /run/user; the victim's `run -d c1`, the attacker
    swaps the state root, the victim's `delete --force c1`."""
    xdg = "/tmp/xdg-victim"
    env = {"XDG_RUNTIME_DIR": xdg}
    bundle = os.path.join(bed, "bundle-rootless")
    got = run_steps({"victim": test_user, "attacker": attack_user}, [
        sh("attacker", f"mkdir -m 0777 {xdg}"),
        sh("victim", _detached(f'"$OCI" run --detach --bundle {bundle} c1'), env),
        sh("attacker", _swap(f"{xdg}/gpusandbox-oci", _hook(canaries, "rootless", test_user))),
        sh("victim", '"$OCI" delete --force c1', env),
        sh("victim", '"$OCI" state c1', env),
        sh("victim", '"$OCI" list', env),
    ])
    canaries.check()
    run, _, delete, state, listed = got["steps"][1:]
    assert one_line_error(run), run
    assert xdg in run["err"] and "no state directory" in run["err"], run
    for res in (delete, state, listed):
        assert one_line_error(res), res
    assert got["sleeper"]


@pytest.mark.parametrize("mode", MODES)
def test_root_in_a_directory_the_attacker_renames_in(mode, bed, canaries, test_user,
                                                     attack_user):
    """--root under the attacker's directory (0777, no sticky bit): the
    victim's `run -d c1` there, the attacker swaps the state root, the
    victim's `delete --force c1`."""
    root = "/tmp/shared/state"
    g = f"--root {root}"
    who = _victim(mode)
    got = run_steps({"victim": test_user, "attacker": attack_user}, [
        sh("attacker", "mkdir -m 0777 /tmp/shared"),
        sh(who, _detached(f'"$OCI" {g} run --detach --bundle {bed}/bundle-{mode} c1')),
        sh("attacker", _swap(root, _hook(canaries, mode, test_user))),
        sh(who, f'"$OCI" {g} delete --force c1'),
        sh(who, f'"$OCI" {g} state c1'),
    ])
    canaries.check()
    run, _, delete, state = got["steps"][1:]
    assert one_line_error(run) and "/tmp/shared" in run["err"], run
    assert one_line_error(delete) and one_line_error(state), (delete, state)


@pytest.mark.parametrize("mode", MODES)
def test_every_command_refuses_a_planted_state(mode, bed, canaries, test_user, attack_user):
    """A state root the attacker controls (rootless: the squatted
    XDG_RUNTIME_DIR's default; root: --root in the attacker's directory)
    holding its containers: c1 with hooks, c2 a plain one naming the
    victim's own sleeper.  Every command refuses with one line."""
    hook = _hook(canaries, mode, test_user)
    if mode == "root":
        top, root, g, env = "/tmp/shared", "/tmp/shared/state", "--root /tmp/shared/state", {}
    else:
        top, env, g = "/tmp/xdg-victim", {"XDG_RUNTIME_DIR": "/tmp/xdg-victim"}, ""
        root = f"{top}/gpusandbox-oci"
    who = _victim(mode)
    cmds = ["state c1", "state c2", "kill c2 KILL", "kill c1 TERM", "kill --all c2 KILL",
            "start c1", "pause c2", "resume c2", "ps c2", "list", "exec c2 true",
            "delete c1", "delete --force c1", "delete --force c2"]
    steps = [sh("attacker", f"mkdir -m 0777 {top} {root}"),
             plant(root, "c1", owner="attacker", hooks={"poststart": [hook], "poststop": [hook]},
                   dir_mode=0o777, file_mode=0o666),
             plant(root, "c2", owner="attacker", dir_mode=0o777, file_mode=0o666)]
    steps += [sh(who, f'"$OCI" {g} {c}', env) for c in cmds]
    steps.append(sh(who, _detached(f'"$OCI" {g} create --bundle {bed}/bundle-{mode} c3'), env))
    got = run_steps({"victim": test_user, "attacker": attack_user}, steps)
    canaries.check()
    assert got["sleeper"], "a planted state had the victim signal its own process"
    for cmd, res in zip(cmds + ["create c3"], got["steps"][3:]):
        assert one_line_error(res), (cmd, res)
        assert "/attacker" not in res["out"] + res["err"], (cmd, res)


@pytest.mark.parametrize("mode", MODES)
def test_swapped_pieces_of_the_victims_own_root(mode, bed, canaries, test_user, attack_user):
    """The victim's own default root, with what someone who once had a way
    in would leave: ROOT/ID another user's (d1) or open to others (d2),
    state.json a link to the attacker's file (d3) or the attacker's (d4),
    state.fast the attacker's (d5: answered from state.json, not from it).
    delete never runs their hooks, state refuses them, list passes over
    them."""
    hook = _hook(canaries, mode, test_user)
    who = _victim(mode)
    uid, gid = (0, 0) if mode == "root" else (test_user.pw_uid, test_user.pw_gid)
    atk = f"{attack_user.pw_uid}:{attack_user.pw_gid}"
    if mode == "root":
        root, env, setup = "/run/gpusandbox-oci", {}, "mkdir -m 0700 /run/gpusandbox-oci"
    else:
        root, env = "/tmp/xdg/gpusandbox-oci", {"XDG_RUNTIME_DIR": "/tmp/xdg"}
        setup = (f"mkdir -m 0700 /tmp/xdg {root} && chown {uid}:{gid} /tmp/xdg {root}")
    owner = "root" if mode == "root" else "victim"
    steps = [sh("root", setup),
             plant(root, "d1", owner="attacker", hooks={"poststop": [hook]}),
             plant(root, "d2", owner=owner, hooks={"poststop": [hook]}, dir_mode=0o777),
             plant(root, "d3", owner=owner),
             plant(root, "d4", owner=owner),
             plant(root, "d5", owner=owner),
             sh("root", "set -e\n"
                # d3: state.json a link to a file of the attacker's with a hook
                f"cat > /tmp/atk.json <<'EOF'\n{_attacker_state(hook)}\nEOF\n"
                f"chown {atk} /tmp/atk.json\n"
                f"rm {root}/d3/state.json {root}/d3/state.fast\n"
                f"ln -s /tmp/atk.json {root}/d3/state.json\n"
                # d4: state.json the attacker's, with a hook
                f"cp /tmp/atk.json {root}/d4/state.json\n"
                f"chown {atk} {root}/d4/state.json\n"
                f"rm {root}/d4/state.fast\n"
                # d5: state.fast the attacker's, naming another bundle
                f"sed -i 's|/planted|/attacker|g' {root}/d5/state.fast\n"
                f"chown {atk} {root}/d5/state.fast")]
    cmds = [f"{c} d{i}" for i in range(1, 5) for c in ("state", "delete --force")]
    steps += [sh(who, f'"$OCI" {c}', env) for c in cmds]
    steps += [sh(who, '"$OCI" state d5', env), sh(who, '"$OCI" list', env)]
    got = run_steps({"victim": test_user, "attacker": attack_user}, steps)
    canaries.check()
    res = got["steps"][7:]
    for cmd, r in zip(cmds, res):
        assert one_line_error(r), (cmd, r)
    state, listed = res[-2:]
    assert state["rc"] == 0 and json.loads(state["out"])["bundle"] == "/planted", state
    assert [ln.split("\t")[0] for ln in listed["out"].splitlines()[1:]] == ["d5"], listed
