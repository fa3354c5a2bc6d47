"""The site's configuration door by door (docs/config.md, "What each door
honours"): the site hooks at both points (rootfs, exit) through the OCI
runtime driven as conmon drives it (create, start, the caller reaps,
delete), `slurm-oci run` on a step bundle and a Slurm step on the testbed
(scripts/slurm-testbed); `slurm-oci` honouring `run`'s keys; the driver
root of the site's TOML file honoured by the engine doors (gpusandbox-oci,
oci-filter, the gpusandbox-runtime wrapper, `gpusandbox hook` under runc).
Every command runs in a private mount namespace whose /etc carries this
test's site files (test_siteconf_registry.Etc); the host's /etc is never
written.  `run` itself and podman are in test_siteconf_registry.py."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .test_oci_runtime import OCI, _as, _config
from .test_siteconf_registry import etc, home, gsbx  # noqa: F401

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent

# rootfs: the plan and the point into the root (the command shows them);
# exit: the plan with its status into EXIT_LOG (a host file).
HOOK = """#!/bin/sh
case "$1" in
rootfs) cat > ./tmp/site-plan.json
        echo "$GPUSANDBOX_HOOK_POINT $GPUSANDBOX_DOOR" > ./tmp/site-hook
        exit 0 ;;
exit) cat >> {exit_log}; echo >> {exit_log}; exit 0 ;;
esac
"""
BROKEN = "#!/bin/sh\n[ \"$1\" = {point} ] && {{ echo broken >&2; exit 3; }}\nexit 0\n"
SHOW = "cat /tmp/site-hook /tmp/site-plan.json; echo; exit 3"


def _hooks(etc, text, name="10-site"):
    etc.write(f"gpusandbox/hooks.d/{name}", text, 0o755)
    os.chmod(etc.upper / "gpusandbox/hooks.d", 0o755)
    return f"/etc/gpusandbox/hooks.d/{name}"


@pytest.fixture
def exit_log(shared_tmp):
    p = shared_tmp / "exit.jsonl"
    p.touch()
    os.chmod(p, 0o666)
    return p


def _exits(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _shown(stdout):
    """(the point and door the rootfs hook wrote, the plan it was given)."""
    lines = stdout.split("\n")
    return lines[0], json.loads(lines[1])


# -- the OCI runtime ------------------------------------------------------------------

def _overlay(etc, argv):
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            'mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc '
            '&& shift 2 && exec "$@"', "sh", str(etc.upper), str(etc.work)] + argv


def _oci(mode, test_user, etc, d, rootfs, args, gpu_env=()):
    """create, start, reap, delete of a container (oci_caller.py, a minimal
    conmon) over a copy of `rootfs` (the rootfs hook writes into an OCI
    root itself, as into podman's); (caller's record, the workload's output)."""
    root = d / "rootfs"
    subprocess.run(["cp", "-a", str(rootfs), str(root)], check=True)
    for sub in ("state", "bundle"):
        (d / sub).mkdir()
    if mode == "rootless":
        subprocess.run(["chown", "-R", f"{test_user.pw_uid}:{test_user.pw_gid}", str(d)],
                       check=True)
    conf = _config(root, args, mode, test_user)
    conf["root"]["readonly"] = False
    conf["process"]["env"] += list(gpu_env)
    (d / "bundle" / "config.json").write_text(json.dumps(conf))
    out = d / "out"
    with open(out, "w") as f:
        os.chown(out, test_user.pw_uid, test_user.pw_gid)
        r = subprocess.run(_overlay(etc, _as(mode, test_user, [
            "/usr/bin/python3", str(HERE / "oci_caller.py"), OCI, str(d / "state" / "s"),
            str(d / "bundle"), "site1"], {"PATH": "/usr/bin:/bin"})),
            stdout=subprocess.PIPE, stderr=f, text=True, timeout=120, cwd="/")
    assert r.stdout, out.read_text()
    return json.loads(r.stdout), out.read_text()


@pytest.fixture
def oci_dir(cli, shared_tmp):
    d = shared_tmp / "oci"
    d.mkdir()
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_oci_runtime_runs_the_rootfs_point_at_create_and_the_exit_point_at_delete(
        mode, test_user, etc, oci_dir, small_rootfs, exit_log):
    _hooks(etc, HOOK.format(exit_log=exit_log))
    res, out = _oci(mode, test_user, etc, oci_dir, small_rootfs, ["sh", "-c", SHOW])
    assert res["create"] == [0, ""], res
    assert res["exit"] == 3 and res["delete"] == [0, ""] and res["left"] == [], res
    point, plan = _shown(out)
    assert point == "rootfs oci", out
    assert (plan["point"], plan["door"], plan["argv"]) == ("rootfs", "oci", ["sh", "-c", SHOW])
    # delete ran the exit point once; the status went to the caller that
    # reaped the workload (here oci_caller, under podman conmon): null.
    [ended] = _exits(exit_log)
    assert (ended["point"], ended["door"], ended["argv"][0], ended["status"]) == \
        ("exit", "oci", "sh", None)


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_oci_runtime_failing_site_hook_one_line(mode, test_user, etc, oci_dir, small_rootfs):
    hook = _hooks(etc, BROKEN.format(point="rootfs"), "50-broken")
    res, out = _oci(mode, test_user, etc, oci_dir, small_rootfs, ["echo", "never"])
    code, err = res["create"]
    assert code != 0 and "never" not in out, res
    # The hook's own stderr, then the one line naming it.
    assert err.splitlines()[:-1] == ["broken"], err
    assert f"site hook {hook} failed: exit status 3" in err.splitlines()[-1], err
    assert not os.listdir(oci_dir / "state" / "s")      # nothing left behind


def test_oci_runtime_failing_exit_hook_is_a_warning(test_user, etc, oci_dir, small_rootfs):
    _hooks(etc, BROKEN.format(point="exit"), "50-broken")
    res, _ = _oci("root", test_user, etc, oci_dir, small_rootfs, ["true"])
    assert res["exit"] == 0 and res["left"] == [], res
    # delete goes on (the warning naming the hook goes to the runtime's
    # --log, as a failing poststop hook's); the hook's own stderr shows.
    assert res["delete"] == [0, "broken\n"], res


# -- slurm-oci (srun --container) ------------------------------------------------------

def test_slurm_oci_runs_both_points(runner, etc, home, rootfs, shared_tmp, exit_log):
    _hooks(etc, HOOK.format(exit_log=exit_log))
    step = shared_tmp / "step"
    step.mkdir()
    (step / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.0", "root": {"path": str(rootfs)},
        "process": {"args": ["sh", "-c", SHOW], "cwd": "/",
                    "env": ["PATH=/usr/bin:/bin", "SLURM_JOB_ID=4242", "SLURM_STEP_ID=0"]}}))
    if runner.mode == "rootless":
        subprocess.run(["chown", "-R", f"{runner.uid}:{runner.gid}", str(step)], check=True)
    r = gsbx(runner, etc, home, ["slurm-oci", "run", str(step)])
    assert r.returncode == 3, r.stderr
    point, plan = _shown(r.stdout)
    assert point == "rootfs slurm-oci"
    assert (plan["door"], plan["image"], plan["argv"][0]) == ("slurm-oci", str(rootfs), "sh")
    [ended] = _exits(exit_log)
    assert (ended["point"], ended["door"], ended["status"]) == ("exit", "slurm-oci", 3)
    if runner.mode == "rootless":
        # Run as the job's user, the bundle's environment is the task's.
        assert (ended["job"], ended["step"]) == ("4242", "0")


def test_slurm_oci_failing_site_hook_one_line(runner, etc, home, rootfs, shared_tmp):
    hook = _hooks(etc, BROKEN.format(point="rootfs"), "50-broken")
    step = shared_tmp / "step"
    step.mkdir()
    (step / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.0", "root": {"path": str(rootfs)},
        "process": {"args": ["echo", "never"], "cwd": "/", "env": ["PATH=/usr/bin:/bin"]}}))
    if runner.mode == "rootless":
        subprocess.run(["chown", "-R", f"{runner.uid}:{runner.gid}", str(step)], check=True)
    r = gsbx(runner, etc, home, ["slurm-oci", "run", str(step)])
    assert r.returncode == 125 and r.stdout == "", r.stderr
    assert r.stderr.splitlines()[:-1] == ["broken"], r.stderr
    assert f"site hook {hook} failed: exit status 3" in r.stderr.splitlines()[-1]


def test_slurm_oci_honours_the_sites_run_keys(runner, etc, home, rootfs, shared_tmp):
    """slurm-oci is `run`: the site's env and locks apply, and its
    forbidden binds refuse RunTimeRun's -v in one line."""
    etc.write("gpusandbox/gpusandbox.conf", 'forbid-binds = ["/etc/shadow"]\n'
              'lock = ["seccomp"]\n[env]\nSITE_NAME = "cluster-{uid}"\n')
    step = shared_tmp / "step"
    step.mkdir()
    (step / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.0", "root": {"path": str(rootfs)},
        "process": {"args": ["sh", "-c", "echo $SITE_NAME"], "cwd": "/",
                    "env": ["PATH=/usr/bin:/bin"]}}))
    if runner.mode == "rootless":
        subprocess.run(["chown", "-R", f"{runner.uid}:{runner.gid}", str(step)], check=True)
    r = gsbx(runner, etc, home, ["slurm-oci", "run", str(step)])
    assert (r.returncode, r.stdout) == (0, f"cluster-{runner.uid}\n"), r.stderr
    r = gsbx(runner, etc, home, ["slurm-oci", "run", "-v", "/etc:/host-etc", str(step)])
    assert r.returncode == 125 and r.stderr.startswith(
        "gpusandbox: error: bind of /etc: forbidden by the site: matches '/etc/shadow'"), r.stderr
    r = gsbx(runner, etc, home, ["slurm-oci", "run", "--seccomp", "unconfined", str(step)])
    assert r.returncode == 125 and "the site locks seccomp = default" in r.stderr, r.stderr


# -- the driver root of the site's file, at the engine doors ----------------------------

def _site_driver_root(etc, sim_host):
    etc.write("gpusandbox/gpusandbox.conf", f'driver-root = "{sim_host.root}"\n')


def _gpu_minors(cfg):
    return sorted(x["minor"] for x in cfg["linux"]["resources"]["devices"]
                  if x.get("major") == 195 and x.get("allow") and x.get("minor") != 255)


def test_oci_filter_takes_the_driver_root_of_the_site_file(cli, etc, sim_host, shared_tmp):
    from .oci_fixtures import BASE_ENV
    cfg = {"ociVersion": "1.0.2", "root": {"path": str(shared_tmp)},
           "process": {"args": ["true"], "cwd": "/",
                       "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=1"]},
           "linux": {}}
    argv = _overlay(etc, [cli, "oci-filter"])
    r = subprocess.run(argv, input=json.dumps(cfg), capture_output=True, text=True,
                       env=BASE_ENV, timeout=60)
    assert r.returncode == 125, r.stderr          # no driver at "/": no GPU 1 here
    _site_driver_root(etc, sim_host)
    r = subprocess.run(argv, input=json.dumps(cfg), capture_output=True, text=True,
                       env=BASE_ENV, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert _gpu_minors(out) == [1]
    for post in out.get("hooks", {}).get("poststop", []):   # its directory, removed
        subprocess.run(post["args"], env=dict(e.split("=", 1) for e in post["env"]),
                       input=b"{}", capture_output=True)


def test_inspection_commands_take_the_driver_root_of_the_site_file(cli, etc, sim_host):
    """info, list, cdi generate and doctor look at the driver the site file
    names (the `inspect` door), as `run` uses it; --driver-root still wins."""
    from .oci_fixtures import BASE_ENV
    _site_driver_root(etc, sim_host)

    def run(*args):
        return subprocess.run(_overlay(etc, [cli, *args]), capture_output=True, text=True,
                              env=BASE_ENV, timeout=120)
    r = run("info", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["driver_root"] == str(sim_host.root) and len(info["gpus"]) == 4
    r = run("list", "--gpus", "1", "--json")
    assert r.returncode == 0 and str(sim_host.root) in r.stdout, r.stderr
    r = run("cdi", "generate")
    assert r.returncode == 0 and "nvidia.com/gpu" in r.stdout, r.stderr
    r = run("doctor", "--json")
    assert str(sim_host.root) in r.stdout, r.stdout + r.stderr
    r = run("info", "--json", "--driver-root", "/")
    assert r.returncode != 0 or json.loads(r.stdout)["driver_root"] == "/", r.stdout


def test_wrapper_takes_the_driver_root_of_the_site_file(cli, etc, sim_host, shared_tmp):
    """gpusandbox-runtime edits the bundle with the site file's driver
    root, then execs the runtime (here a stand-in that keeps the config)."""
    from .conftest import VENV
    from .oci_fixtures import BASE_ENV
    bundle = shared_tmp / "bundle"
    bundle.mkdir()
    (bundle / "rootfs").mkdir()
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": "rootfs"},
        "process": {"args": ["true"], "cwd": "/",
                    "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=2"]}, "linux": {}}))
    rt = shared_tmp / "runtime"
    rt.write_text(f"#!/bin/sh\ncp {bundle}/config.json {shared_tmp}/seen.json\n")
    os.chmod(rt, 0o755)
    _site_driver_root(etc, sim_host)
    r = subprocess.run(_overlay(etc, [str(VENV / "bin" / "gpusandbox-runtime"), "create",
                                      "--bundle", str(bundle), "w1"]),
                       capture_output=True, text=True, timeout=60,
                       env=dict(BASE_ENV, GPUSANDBOX_OCI_RUNTIME=str(rt)))
    assert r.returncode == 0, r.stderr
    assert _gpu_minors(json.loads((shared_tmp / "seen.json").read_text())) == [2]


def test_hook_takes_the_driver_root_of_the_site_file(cli, etc, sim_host, shared_tmp):
    """`gpusandbox hook` installed without --driver-root, run by runc as a
    createRuntime hook: the driver root is the site file's."""
    from .oci_fixtures import BASE_ENV, RUNC, SHOW, runc_bundle
    d = shared_tmp / "hooked"
    d.mkdir()
    r = subprocess.run([cli, "hook", "install", "--dir", str(d / "hooks.d"),
                        "--stage", "createRuntime"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    hook = json.loads((d / "hooks.d" / "gpusandbox-hook.json").read_text())["hook"]
    runc_bundle(d, ["sh", "-c", SHOW], env=["NVIDIA_VISIBLE_DEVICES=0"],
                hooks={"createRuntime": [hook]})
    _site_driver_root(etc, sim_host)
    state = d / "runc-state"
    try:
        r = subprocess.run(_overlay(etc, [RUNC, "--root", str(state), "run", "--bundle", str(d),
                                          "site-hook"]), capture_output=True, text=True,
                           timeout=60, env=BASE_ENV, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run([RUNC, "--root", str(state), "delete", "-f", "site-hook"],
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    assert "open: cat: /dev/nvidia0: Operation not permitted" in r.stdout, r.stdout
    assert "absent /dev/nvidia1" in r.stdout and "ls: /usr/bin/nvidia-smi\n" in r.stdout


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_oci_runtime_takes_the_driver_root_of_the_site_file(
        mode, test_user, etc, oci_dir, small_rootfs, sim_host):
    _site_driver_root(etc, sim_host)
    res, out = _oci(mode, test_user, etc, oci_dir, small_rootfs,
                    ["sh", "-c", "ls /dev | grep -c '^nvidia[0-9]'; ls /dev/nvidia2"],
                    gpu_env=["NVIDIA_VISIBLE_DEVICES=2"])
    assert res["create"] == [0, ""] and res["exit"] == 0, (res, out)
    assert out.split() == ["1", "/dev/nvidia2"], out


# -- a Slurm step on the testbed -------------------------------------------------------

@pytest.fixture(scope="module")
def testbed(cli, workdir_base):
    from . import slurm_fixture as sf
    sim = workdir_base / "site-hooks-sim"
    r = subprocess.run(["python3", "-m", "gpusandbox.sim", "create", str(sim), "--gpus", "2"],
                       cwd=sf.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout
    state = workdir_base / "site-hooks-slurm"
    state.mkdir()
    os.chmod(state, 0o755)
    try:
        bed = sf.slurm_testbed(state, sim, constrain=False)
    except sf.TestbedUnavailable as e:
        pytest.skip(f"Slurm testbed unavailable: {e}")
    yield bed
    bed.stop()


@pytest.mark.slurm
def test_slurm_step_runs_both_points(testbed, runner, etc, home, rootfs, exit_log):
    """`srun gpusandbox run IMAGE CMD` (the SPANK plugin's task is that too):
    the step's task sees the site's hooks directory (here through the /etc
    overlay its argv makes), the rootfs hook adds its file, the exit hook
    gets the command's status, both the job and step ids."""
    _hooks(etc, HOOK.format(exit_log=exit_log))
    argv = etc.argv(runner, ["run", str(rootfs), "sh", "-c", SHOW])
    r = testbed.srun(["--job-name", "site-hooks", *argv], timeout=120,
                     env=runner.env({"GPUSANDBOX_STORE": str(home / "store"),
                                     "HOME": str(home)}))
    assert r.returncode == 3, r.stderr
    point, plan = _shown(r.stdout)
    assert point == "rootfs run", r.stdout
    assert plan["job"] and plan["job"].isdigit() and plan["step"] == "0", plan
    [ended] = _exits(exit_log)
    assert (ended["point"], ended["status"], ended["job"]) == ("exit", 3, plan["job"])
