"""A `pull -o FILE.sqsh` file carries the image config: `run FILE.sqsh`
with no CMD runs its Entrypoint + Cmd with its Env, WorkingDir and User as
for a store image; and `doctor FILE.sqsh` checks the image in the file,
mounted as run mounts it and released after; root and rootless."""
import json
import subprocess

from tests.integration.conftest import host_mounts

from .test_doctor_cli import _destroy, _sim
from .test_images_local import ENV, PASSWD, _layout, gsbx, image_files, store  # noqa: F401


def _pull_o(runner, store, shared_tmp, image_files, **cfg):  # noqa: F811
    ref = _layout(shared_tmp / "lay", image_files["base"],
                  [{"srv/": None, "srv/app/": None, "srv/app/hello": b"hi\n",
                    "etc/": None, "etc/passwd": PASSWD}], **cfg)
    target = shared_tmp / "out.sqsh"
    r = gsbx(runner, store, ["pull", "-q", "-o", str(target), ref])
    assert r.returncode == 0, r.stderr
    return target


def test_pull_o_carries_the_config_for_run_and_doctor(runner, store, shared_tmp,  # noqa: F811
                                                      image_files, cli):  # noqa: F811
    """One pulled file, every use: run with no CMD, with a CMD, with
    --entrypoint; doctor of the file; the same file without its config."""
    target = _pull_o(runner, store, shared_tmp, image_files,
                     Env=ENV + ["NVIDIA_REQUIRE_CUDA=cuda>=12.4"],
                     Entrypoint=["/bin/sh", "-c"],
                     Cmd=['echo "cmd:$FROM_IMAGE:$OVERRIDE:$(pwd):$(id -u):$(id -g)"'],
                     WorkingDir="/srv/app", User="svc")
    r = gsbx(runner, store, ["run", "--no-require", str(target)])
    assert r.returncode == 0, r.stderr
    if runner.mode == "root":
        assert (r.stdout, r.stderr) == ("cmd:yes:image:/srv/app:1234:2345\n", "")
    else:
        assert r.stdout == f"cmd:yes:image:/srv/app:{runner.uid}:{runner.gid}\n"
        assert r.stderr.startswith("gpusandbox: note: the image's User 'svc' is not applied")
        assert len(r.stderr.splitlines()) == 1, r.stderr
    # A CMD replaces Cmd (the Entrypoint stays); -e and -w win over the image.
    r = gsbx(runner, store, ["run", "--no-require", "-e", "OVERRIDE=mine", "-w", "/etc",
                             str(target), 'echo "$FROM_IMAGE:$OVERRIDE:$(pwd)"'])
    assert (r.returncode, r.stdout) == (0, "yes:mine:/etc\n"), r.stderr
    # --entrypoint replaces the Entrypoint and drops Cmd.
    r = gsbx(runner, store, ["run", "--no-require", "--entrypoint", "/bin/cat", str(target),
                             "hello"])
    assert (r.returncode, r.stdout) == (0, "hi\n"), r.stderr
    # The config is in the file, under /.gpusandbox (read-only, root's).
    out = subprocess.run(["unsquashfs", "-cat", str(target), ".gpusandbox/config.json"],
                         capture_output=True, check=True).stdout
    assert json.loads(out)["config"]["User"] == "svc"

    # doctor FILE.sqsh: the tree and the requirement the carried config
    # states, checked in the mounted file; the sandbox steps run the file.
    old = _sim(cli, gpus=1, driver_version="535.104.05", cuda_version="12.2")
    try:
        before = host_mounts()
        res = runner.run(["doctor", "--json", "--gpus", "0", "--driver-root",
                          str(old / "host"), str(target)], timeout=300)
        checks = {(c["section"], c["name"]): c for c in json.loads(res.stdout)["checks"]}
        assert checks[("image", "rootfs")]["status"] == "pass", checks[("image", "rootfs")]
        assert checks[("image", "rootfs")]["detail"].startswith(f"{target}, shell /bin/sh")
        assert checks[("image", "libc")]["status"] == "pass"
        req = checks[("image", "CUDA requirement")]
        assert res.returncode == 1 and req["status"] == "fail", req
        assert "cuda>=12.4" in req["detail"] and "up to 12.2" in req["detail"], req
        cuda = checks[("verify", "CUDA in sandbox")]
        assert cuda["status"] == "pass" and "lists 1 device(s)" in cuda["detail"], cuda
        assert host_mounts() == before      # nothing attached on the host
    finally:
        _destroy(cli, old)

    # A file made by hand (no /.gpusandbox/config.json): CMD is required.
    plain, tree = shared_tmp / "plain.sqsh", shared_tmp / "tree"
    subprocess.run(["unsquashfs", "-q", "-d", str(tree), str(target)], check=True,
                   capture_output=True)
    subprocess.run(["rm", "-rf", str(tree / ".gpusandbox")], check=True)
    subprocess.run(["mksquashfs", str(tree), str(plain), "-quiet", "-no-progress"], check=True,
                   capture_output=True)
    r = gsbx(runner, store, ["run", str(plain)])
    assert r.returncode == 125 and r.stderr.startswith(
        f"gpusandbox: error: no command to run in {plain}"), r.stderr
    assert len(r.stderr.splitlines()) == 2 and r.stderr.splitlines()[1].startswith("hint: ")
    r = gsbx(runner, store, ["run", str(plain), "cat", "/srv/app/hello"])
    assert (r.returncode, r.stdout) == (0, "hi\n"), r.stderr


def test_a_pod_rank_from_a_file_with_a_user_joins_the_pod(root_runner, store, shared_tmp,  # noqa: F811
                                                          image_files):  # noqa: F811
    """The file's User chooses the identity again after the first plan: the
    rank still gets the pod's pid namespace (the keeper is its pid 1), not a
    namespace of its own."""
    target = _pull_o(root_runner, store, shared_tmp, image_files, User="svc")
    r = subprocess.run([root_runner.cli, "run", "--no-require", "--share", "node",
                        str(target), "/bin/sh", "-c", "cat /proc/1/comm; id -u"],
                       capture_output=True, text=True, timeout=120, cwd="/",
                       env=root_runner.env({"GPUSANDBOX_STORE": str(store),
                                            "GPUSANDBOX_POD": f"sqsh-{shared_tmp.name}"}))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["gpusandbox-pod", "1234"], r.stdout
