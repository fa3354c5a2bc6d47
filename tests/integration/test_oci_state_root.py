"""Which state root `gpusandbox-oci` uses when no --root is given: the shell
entry (bin/gpusandbox-oci, which answers `state` without Python) picks the
same one as the Python path (rundir.oci_root), or hands the call to Python,
in every case of the table: real root (/run/gpusandbox-oci, whatever
XDG_RUNTIME_DIR says), $XDG_RUNTIME_DIR when it is the caller's and closed
to others, /run/user/UID otherwise, and one error line when neither is
usable; rootless, and as root of the caller's own user namespace (rootless
podman).  Each candidate root holds a container of the same id whose bundle
names the root, so the answer says which root was read.  Each case runs in
a private mount namespace with fresh /tmp and /run (ocistate_ns.py)."""
import json

import pytest

from .ocistate_ns import one_line_error, plant, run_steps, sh

XDG = "/tmp/xdg"

# (caller, XDG_RUNTIME_DIR: whose and how open, /run/user/UID there,
#  the root expected: its bundle name or None for the error, whether the
#  shell entry answers itself)
CASES = [
    ("root", "mine", True, "run-root", True),
    ("victim", "mine", True, "xdg", True),
    ("victim", "mine", False, "xdg", True),
    ("victim", None, True, "run-user", True),
    ("victim", "relative", True, "run-user", True),
    ("victim", "theirs", True, "run-user", False),
    ("victim", "open", True, "run-user", False),
    ("victim", "theirs", False, None, False),
    ("victim", "open", False, None, False),
    ("victim", None, False, None, False),
    ("victim-userns", "mine", True, "xdg", True),
    ("victim-userns", None, True, "run-user", True),
    ("victim-userns", "theirs", True, "run-user", False),
]


def _id(case):
    who, xdg, run_user = case[:3]
    return f"{who}-xdg_{xdg}-{'runuser' if run_user else 'norunuser'}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_shell_entry_picks_the_python_root(case, cli, test_user, attack_user):
    who, xdg, run_user, want, fast = case
    root = who == "root"
    uid, gid = (0, 0) if root else (test_user.pw_uid, test_user.pw_gid)
    atk = f"{attack_user.pw_uid}:{attack_user.pw_gid}"
    setup = ["set -e"]
    steps = []
    if run_user:
        setup += ["mkdir -p /run/user", f"mkdir -m 0700 /run/user/{uid}",
                  f"chown {uid}:{gid} /run/user/{uid}"]
    if xdg in ("mine", "open", "theirs"):
        setup += [f"mkdir -m {'0700' if xdg == 'mine' else '0777'} {XDG}",
                  f"chown {atk if xdg == 'theirs' else f'{uid}:{gid}'} {XDG}"]
    if root:
        setup += ["mkdir -m 0700 /run/gpusandbox-oci"]
    steps.append(sh("root", "\n".join(setup)))
    # A container c1 in every candidate root, owned as its directory is.
    if root:
        steps.append(plant("/run/gpusandbox-oci", "c1", owner="root", bundle="run-root"))
    if xdg in ("mine", "open", "theirs"):
        owner = "attacker" if xdg == "theirs" else ("root" if root else "victim")
        steps.append(sh("root", f"mkdir -m 0700 {XDG}/gpusandbox-oci && "
                        f"chown {atk if owner == 'attacker' else f'{uid}:{gid}'} "
                        f"{XDG}/gpusandbox-oci"))
        steps.append(plant(f"{XDG}/gpusandbox-oci", "c1", owner=owner, bundle="xdg"))
    if run_user:
        steps.append(sh("root", f"mkdir -m 0700 /run/user/{uid}/gpusandbox-oci && "
                        f"chown {uid}:{gid} /run/user/{uid}/gpusandbox-oci"))
        steps.append(plant(f"/run/user/{uid}/gpusandbox-oci", "c1",
                           owner="root" if root else "victim", bundle="run-user"))
    env = {}
    if xdg == "relative":
        env["XDG_RUNTIME_DIR"] = "xdg"
    elif xdg:
        env["XDG_RUNTIME_DIR"] = XDG
    steps.append(sh(who, '"$OCI" state c1', env, trace=True))
    steps.append(sh(who, '"$CLI" oci state c1', env))
    got = run_steps({"victim": test_user, "attacker": attack_user}, steps)
    entry, ref = got["steps"][-2:]
    assert entry["rc"] == ref["rc"], (entry, ref)
    if want is None:
        assert (entry["out"], entry["err"]) == (ref["out"], ref["err"])
        assert one_line_error(ref), ref
        assert "no state directory" in ref["err"], ref
    else:
        assert ref["rc"] == 0, ref
        assert json.loads(entry["out"]) == json.loads(ref["out"])
        assert json.loads(ref["out"])["bundle"] == want, ref
    assert entry["py"] is not fast, entry
