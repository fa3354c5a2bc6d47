"""Images from local transports through the real CLI, root and rootless:
pull oci:/docker-archive:, images/inspect/rmi/prune, run with the image
config applied, and bad input refused with one line and nothing left."""
import json
import os
import subprocess
import tarfile

import pytest

from tests.unit import image_fixtures as fx

ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "FROM_IMAGE=yes", "OVERRIDE=image"]


def _rootfs_layer(root):
    import io
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name in sorted(os.listdir(root)):
            tf.add(os.path.join(root, name), arcname=name)
    return buf.getvalue()


@pytest.fixture(scope="session")
def image_files(workdir_base):
    """An OCI layout, its oci-archive and a docker-archive of one image: a
    small rootfs plus a layer with /srv/app, readable by the test user."""
    d = workdir_base / "images"
    root = d / "rootfs"
    subprocess.run([str(fx_repo() / "scripts" / "mkrootfs"), str(root), "--no-python"],
                   check=True, capture_output=True)
    base = _rootfs_layer(str(root))
    app = {"srv/": None, "srv/app/": None, "srv/app/hello": b"hello from the image\n"}
    cfg = dict(Env=ENV, Entrypoint=["/bin/sh", "-c"],
               Cmd=['echo "cmd:$FROM_IMAGE:$OVERRIDE:$(pwd)"'], WorkingDir="/srv/app")
    man, blobs = fx.build_image([base, app], **cfg)
    lay = fx.write_layout(str(d / "layout"), [("v1", man, blobs)])
    fx.tar_dir(lay, str(d / "layout.tar"))
    fx.write_docker_archive(str(d / "docker.tar"), [(["gsbx/test:1"], [base, app], cfg)])
    for dirpath, dirs, files in os.walk(d):
        os.chmod(dirpath, 0o755)
        for f in files:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                os.chmod(p, 0o755 if os.access(p, os.X_OK) else 0o644)
    return {"layout": lay, "archive": str(d / "layout.tar"), "docker": str(d / "docker.tar"),
            "digest": fx.sha(man), "base": base}


def _layout(where, base, layers=(), arch="amd64", **cfg):
    man, blobs = fx.build_image([base] + list(layers), arch=arch, **cfg)
    lay = fx.write_layout(str(where), [("t", man, blobs)])
    subprocess.run(["chmod", "-R", "a+rX", lay], check=True)
    return f"oci:{lay}:t"


def fx_repo():
    from pathlib import Path
    return Path(__file__).resolve().parents[2]


@pytest.fixture
def store(runner, shared_tmp):
    """Where the runner's store will be: gpusandbox creates it (0700)."""
    os.chown(shared_tmp, runner.uid, runner.gid)
    return shared_tmp / "store"


def gsbx(runner, store, args, timeout=120):
    """Any gpusandbox subcommand as the runner's user, on `store`."""
    cmd = [runner.cli] + list(args)
    if runner.mode == "rootless":
        cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
               "--clear-groups", "--"] + cmd
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd="/",
                          env=runner.env({"GPUSANDBOX_STORE": str(store)}))


def _leftovers(store):
    out = []
    for sub in ("tmp", "images", "layers", "refs", "blobs/sha256"):
        p = store / sub
        if p.exists():
            out += [f"{sub}/{n}" for n in os.listdir(p)]
    return out


def test_pull_oci_and_run_with_config(runner, store, image_files):
    ref = f"oci:{image_files['layout']}:v1"
    r = gsbx(runner, store, ["pull", "-q", ref])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == image_files["digest"]
    r = gsbx(runner, store, ["run", ref])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "cmd:yes:image:/srv/app\n"
    # a given CMD replaces Cmd (the Entrypoint stays); the caller's -e wins
    r = gsbx(runner, store, ["run", "-e", "OVERRIDE=caller", ref,
                             'echo "$OVERRIDE $FROM_IMAGE"; cat hello'])
    assert (r.returncode, r.stdout) == (0, "caller yes\nhello from the image\n"), r.stderr
    # --entrypoint replaces the Entrypoint and drops Cmd; -w beats WorkingDir
    r = gsbx(runner, store, ["run", "--entrypoint", "/bin/pwd", "-w", "/tmp", ref])
    assert (r.returncode, r.stdout) == (0, "/tmp\n"), r.stderr
    # the image is never written: read-only as a directory is, and with
    # --writable-tmpfs writes go to the private overlay
    r = gsbx(runner, store, ["run", ref, "echo x > hello"])
    assert r.returncode != 0 and "Read-only file system" in r.stderr
    r = gsbx(runner, store, ["run", "--writable-tmpfs", ref, "echo x > hello && cat hello"])
    assert (r.returncode, r.stdout) == (0, "x\n"), r.stderr
    hexd = image_files["digest"][7:]
    assert (store / "images" / hexd / "rootfs/srv/app/hello").read_text() == \
        "hello from the image\n"
    r = gsbx(runner, store, ["run", "--rw", ref, "true"])
    assert r.returncode == 125
    assert r.stderr.startswith("gpusandbox: error: --rw cannot be used with a store image")
    st = os.stat(store)
    assert (st.st_uid, st.st_mode & 0o777) == (runner.uid, 0o700)


def test_docker_archive_names_images_inspect_rmi_prune(runner, store, image_files):
    r = gsbx(runner, store, ["pull", "-q", f"docker-archive:{image_files['docker']}"])
    assert r.returncode == 0, r.stderr
    r = gsbx(runner, store, ["images", "--json"])
    rows = json.loads(r.stdout)
    assert [x["reference"] for x in rows] == ["docker.io/gsbx/test:1"]
    dig = rows[0]["digest"]
    # by its store name, as docker load + docker run
    r = gsbx(runner, store, ["run", "gsbx/test:1"])
    assert (r.returncode, r.stdout) == (0, "cmd:yes:image:/srv/app\n"), r.stderr
    r = gsbx(runner, store, ["inspect", "--json", "gsbx/test:1"])
    [info] = json.loads(r.stdout)
    conf = info["Config"]
    assert info["Digest"] == dig and conf["Env"] == ENV and conf["WorkingDir"] == "/srv/app"
    assert conf["Entrypoint"] == ["/bin/sh", "-c"] and len(info["RootFS"]["Layers"]) == 2
    r = gsbx(runner, store, ["run", "gsbx/nope:1"])
    assert r.returncode == 125
    assert r.stderr.startswith("gpusandbox: error: image not found: docker.io/gsbx/nope:1")
    r = gsbx(runner, store, ["rmi", "gsbx/test:1"])
    assert r.returncode == 0, r.stderr
    assert json.loads(gsbx(runner, store, ["images", "--json"]).stdout) == []
    # rmi freed it all at once (layers and blobs): prune finds nothing
    assert _leftovers(store) == []
    r = gsbx(runner, store, ["prune"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "removed 0 images, 0 blobs, 0 B freed\n", r.stdout
    assert os.listdir(store / "blobs" / "sha256") == []


def test_oci_archive_run_pulls_first(runner, store, image_files):
    r = gsbx(runner, store, ["run", f"oci-archive:{image_files['archive']}", "cat hello"])
    assert (r.returncode, r.stdout) == (0, "hello from the image\n"), r.stderr
    assert os.listdir(store / "images") == [image_files["digest"][7:]]


@pytest.mark.parametrize("case", ["missing", "tampered", "badref", "notar"])
def test_bad_input_one_line_nothing_left(runner, store, image_files, shared_tmp, case):
    if case == "missing":
        ref = f"oci:{shared_tmp}/none:v1"
    elif case == "badref":
        ref = "docker://UPPER/case"
    elif case == "notar":
        p = shared_tmp / "garbage.tar"
        p.write_bytes(b"\x1f\x8b" + os.urandom(2000))
        os.chmod(p, 0o644)
        ref = f"docker-archive:{p}"
    else:
        import shutil
        lay = shared_tmp / "lay"
        shutil.copytree(image_files["layout"], lay)
        man = json.loads(open(os.path.join(lay, "blobs", "sha256",
                                           image_files["digest"][7:])).read())
        p = lay / "blobs" / "sha256" / man["layers"][1]["digest"][7:]
        data = bytearray(p.read_bytes())
        data[-3] ^= 0xFF
        p.write_bytes(bytes(data))
        subprocess.run(["chmod", "-R", "a+rX", str(lay)], check=True)
        ref = f"oci:{lay}:v1"
    for args in (["pull", "-q", ref], ["run", ref, "true"]):
        r = gsbx(runner, store, args)
        assert r.returncode == 125, r.stderr
        lines = r.stderr.splitlines()
        assert lines[0].startswith("gpusandbox: error: ") and len(lines) <= 2, r.stderr
        assert len(lines) == 1 or lines[1].startswith("hint: ")
        assert _leftovers(store) == []


PASSWD = (b"root:x:0:0:root:/root:/bin/sh\n"
          b"svc:x:1234:2345:svc:/home/svc:/bin/sh\n")


@pytest.mark.parametrize("user,want", [("1000:1001", "1000 1001"), ("svc", "1234 2345")])
def test_image_user(runner, store, image_files, shared_tmp, user, want):
    ref = _layout(shared_tmp / "lay", image_files["base"],
                  [{"etc/": None, "etc/passwd": PASSWD}], User=user)
    r = gsbx(runner, store, ["run", ref, "sh", "-c", "echo $(id -u) $(id -g)"])
    assert r.returncode == 0, r.stderr
    if runner.mode == "root":
        assert r.stdout == want + "\n" and r.stderr == ""
    else:
        # rootless: the command runs as the caller, with one note line
        assert r.stdout == f"{runner.uid} {runner.gid}\n"
        assert r.stderr.startswith(f"gpusandbox: note: the image's User '{user}' is not applied")
        assert len(r.stderr.splitlines()) == 1


def test_image_user_passwd_hostile(runner, store, image_files, shared_tmp):
    """An image /etc/passwd that is a symlink to /dev/zero: never read
    unbounded, the name is simply not found (root resolves names)."""
    ref = _layout(shared_tmp / "lay", image_files["base"],
                  [{"etc/": None, "etc/passwd": ("link", "/dev/zero")}], User="svc")
    r = gsbx(runner, store, ["run", ref, "true"], timeout=60)
    if runner.mode == "root":
        assert r.returncode == 125
        assert r.stderr.startswith("gpusandbox: error: the image's User 'svc' is not in its "
                                   "/etc/passwd"), r.stderr
    else:
        assert r.returncode == 0, r.stderr


def test_foreign_architecture_refused(runner, store, image_files, shared_tmp):
    ref = _layout(shared_tmp / "lay", image_files["base"], arch="s390x", Cmd=["true"])
    r = gsbx(runner, store, ["run", ref])
    assert r.returncode == 125
    assert r.stderr.splitlines() == [
        "gpusandbox: error: the image is for linux/s390x; this host runs linux/amd64",
        "hint: to run it anyway (emulated), pass --platform linux/s390x"]
    assert _leftovers(store) == []
    r = gsbx(runner, store, ["pull", "-q", "--platform", "linux/s390x", ref])
    assert r.returncode == 0, r.stderr


def test_workdir_through_proc_contained(runner, store, image_files, shared_tmp):
    ref = _layout(shared_tmp / "lay", image_files["base"], WorkingDir="/proc/self/fd/3")
    r = gsbx(runner, store, ["run", ref, "sh", "-c", "pwd; ls"])
    # refused, or inside the sandbox's own /proc: never a host directory
    assert r.returncode == 125 or r.stdout.startswith("/proc/"), (r.stdout, r.stderr)
    assert str(store) not in r.stdout


@pytest.fixture
def nosuid_dir(shared_tmp):
    d = shared_tmp / "nosuid"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "nosuid,nodev,mode=0755,size=256m",
                    "gsbx-test-site", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


def test_shared_store_needs_nosuid(runner, image_files, shared_tmp):
    """A store opened to other users (a site store) must be on a nosuid
    filesystem: its images keep their setuid files."""
    site = shared_tmp / "site"
    site.mkdir(mode=0o755)
    os.chown(site, runner.uid, runner.gid)
    r = gsbx(runner, site, ["pull", "-q", f"oci:{image_files['layout']}:v1"])
    assert r.returncode == 125
    assert r.stderr.startswith(f"gpusandbox: error: the image store {site} is shared with "
                               "other users but its filesystem is not mounted nosuid"), r.stderr
    assert os.listdir(site) == []


def test_site_store_searched_after_own(runner, store, image_files, nosuid_dir):
    site = nosuid_dir / "site"
    site.mkdir(mode=0o755)
    r = subprocess.run([runner.cli, "pull", "-q", "--store", str(site),
                        f"docker-archive:{image_files['docker']}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cmd = [runner.cli, "run", "gsbx/test:1", "echo site"]
    if runner.mode == "rootless":
        cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
               "--clear-groups", "--"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, cwd="/",
                       env=runner.env({"GPUSANDBOX_STORE": str(store),
                                       "GPUSANDBOX_SITE_STORE": str(site)}))
    assert (r.returncode, r.stdout) == (0, "site\n"), r.stderr
    assert _leftovers(store) == []            # nothing copied into the own store


def test_skopeo_written_archives(runner, store, image_files, shared_tmp):
    """Archives written by a real tool (skopeo copy) from the test layout:
    a docker-archive as `docker save` lays it out, and an oci-archive."""
    import shutil
    if not shutil.which("skopeo"):
        pytest.skip("skopeo is not installed (scripts/test installs it)")
    src = f"oci:{image_files['layout']}:v1"
    d, o = shared_tmp / "sk-docker.tar", shared_tmp / "sk-oci.tar"
    for dst in (f"docker-archive:{d}:gsbx/sk:2", f"oci-archive:{o}:v9"):
        subprocess.run(["skopeo", "--insecure-policy", "copy", "-q", src, dst], check=True,
                       capture_output=True)
    os.chmod(d, 0o644)
    os.chmod(o, 0o644)
    r = gsbx(runner, store, ["run", f"docker-archive:{d}"])
    assert (r.returncode, r.stdout) == (0, "cmd:yes:image:/srv/app\n"), r.stderr
    r = gsbx(runner, store, ["run", f"oci-archive:{o}:v9", "cat hello"])
    assert (r.returncode, r.stdout) == (0, "hello from the image\n"), r.stderr
    names = [x["reference"] for x in json.loads(gsbx(runner, store, ["images", "--json"]).stdout)]
    assert sorted(names) == sorted(["docker.io/gsbx/sk:2", f"oci-archive:{o}:v9"])


def test_concurrent_runs_on_a_cold_store(runner, store, image_files):
    """8 `run oci:` at once on an empty store: all succeed, one image, no
    staging left."""
    ref = f"oci:{image_files['layout']}:v1"
    cmd = [runner.cli, "run", ref, "cat hello"]
    if runner.mode == "rootless":
        cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
               "--clear-groups", "--"] + cmd
    env = runner.env({"GPUSANDBOX_STORE": str(store)})
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd="/") for _ in range(8)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [e for _, e in outs]
    assert all(o == "hello from the image\n" for o, _ in outs)
    assert os.listdir(store / "images") == [image_files["digest"][7:]]
    assert os.listdir(store / "tmp") == []


def test_foreign_site_store_needs_nosuid(runner, store, image_files, shared_tmp):
    """Another user's site store on a filesystem that honours setuid is
    refused by `run` (the caller would be handed its setuid files)."""
    if runner.mode == "root":
        pytest.skip("the site store belongs to root here: foreign only to the test user")
    site = shared_tmp / "site"
    site.mkdir(mode=0o700)
    r = subprocess.run([runner.cli, "pull", "-q", "--store", str(site),
                        f"docker-archive:{image_files['docker']}"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    subprocess.run(["chmod", "-R", "a+rX", str(site)], check=True)
    cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}", "--clear-groups",
           "--", runner.cli, "run", "gsbx/test:1", "true"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd="/",
                       env=runner.env({"GPUSANDBOX_STORE": str(store),
                                       "GPUSANDBOX_SITE_STORE": str(site)}))
    assert r.returncode == 125
    assert "is shared with other users but its filesystem is not mounted nosuid" in r.stderr


@pytest.mark.parametrize("arg,want", [
    ("No_Such_Dir", "gpusandbox: error: image directory not found: No_Such_Dir"),
    ("tmp/../x", "gpusandbox: error: image directory not found: tmp/../x"),
    ("etc/passwd", "gpusandbox: error: image is not a directory: etc/passwd"),
])
def test_missing_directory_named_like_a_name(root_runner, shared_tmp, arg, want):
    """A relative IMAGE that is neither a directory nor a store name gets
    the directory error, not a store one (run's cwd is /)."""
    os.chown(shared_tmp, 0, 0)
    r = gsbx(root_runner, shared_tmp / "store", ["run", arg, "true"])
    assert r.returncode == 125
    assert r.stderr.splitlines()[0] == want


def test_layers_applied_in_order_with_whiteouts(runner, store, image_files, shared_tmp):
    """Later layers delete (whiteout) and hide (opaque directory) what
    earlier ones wrote: the store applies them in manifest order."""
    ref = _layout(shared_tmp / "lay", image_files["base"], [
        {"opt/": None, "opt/d/": None, "opt/d/a": b"a", "opt/d/b": b"b", "srv/": None,
         "srv/gone": b"x", "srv/kept": b"k"},
        {"opt/d/": None, "opt/d/.wh..wh..opq": b"", "opt/d/c": b"c", "srv/": None,
         "srv/.wh.gone": b""}])
    r = gsbx(runner, store, ["run", ref, "sh", "-c", "ls /opt/d; ls /srv"])
    assert (r.returncode, r.stdout) == (0, "c\nkept\n"), r.stderr


def test_pull_killed_mid_unpack_then_pulled_again(runner, store, image_files):
    """SIGKILL while a layer is being applied: no image is published, and
    the next pull removes the dead staging directory and succeeds."""
    import signal
    import time
    ref = f"oci-archive:{image_files['archive']}"
    cmd = [runner.cli, "pull", "-q", ref]
    if runner.mode == "rootless":
        cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
               "--clear-groups", "--"] + cmd
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/",
                         env=runner.env({"GPUSANDBOX_STORE": str(store)}))
    staged = False
    while p.poll() is None:
        tmp = store / "tmp"
        if tmp.exists() and any(n.startswith("image_") and (tmp / n / "rootfs" / "usr").exists()
                                for n in os.listdir(tmp)):
            p.send_signal(signal.SIGKILL)
            staged = True
            break
        time.sleep(0.001)
    p.wait()
    if not staged:
        pytest.skip("the pull finished before a staging directory was seen")
    assert os.listdir(store / "images") == []
    assert any(n.startswith("image_") for n in os.listdir(store / "tmp"))
    r = gsbx(runner, store, ["pull", "-q", ref])
    assert r.returncode == 0, r.stderr
    assert os.listdir(store / "images") == [image_files["digest"][7:]]
    assert os.listdir(store / "tmp") == []


def test_inspect_and_images_escape_image_strings(root_runner, shared_tmp, image_files):
    """Config strings reach the terminal escaped: an image cannot write
    terminal control sequences through inspect or images."""
    os.chown(shared_tmp, 0, 0)
    store = shared_tmp / "store"
    ref = _layout(shared_tmp / "lay", image_files["base"], User="a\x1b]0;pwned\x07",
                  WorkingDir="/w\x1b[2J", Labels={"l": "\x1b[31mred"}, Env=["E=\x1b[1m"])
    r = gsbx(root_runner, store, ["pull", "-q", ref])
    assert r.returncode == 0, r.stderr
    for args in (["inspect", ref], ["inspect", "--json", ref], ["images"], ["images", "--json"]):
        r = gsbx(root_runner, store, args)
        assert r.returncode == 0 and "\x1b" not in r.stdout and "\x07" not in r.stdout, args


def test_rmi_and_prune_leave_an_image_in_use(runner, store, image_files):
    """While a sandbox runs from a store image, rmi refuses to remove it
    (changing nothing) and prune keeps it; once it ends, both work."""
    ref = f"oci:{image_files['layout']}:v1"
    cmd = [runner.cli, "run", ref, "echo up; read x"]
    if runner.mode == "rootless":
        cmd = ["setpriv", f"--reuid={runner.uid}", f"--regid={runner.gid}",
               "--clear-groups", "--"] + cmd
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd="/",
                         env=runner.env({"GPUSANDBOX_STORE": str(store)}))
    try:
        assert p.stdout.readline() == "up\n"
        r = gsbx(runner, store, ["rmi", ref])
        assert r.returncode == 125
        assert r.stderr.startswith("gpusandbox: error: image sha256:") and \
            "is in use by a running sandbox" in r.stderr, r.stderr
        assert [x["reference"] for x in json.loads(
            gsbx(runner, store, ["images", "--json"]).stdout)] == [ref]
    finally:
        p.communicate("\n", timeout=60)
    assert p.returncode == 0, p.stderr
    r = gsbx(runner, store, ["rmi", ref])
    assert r.returncode == 0, r.stderr
    assert os.listdir(store / "images") == []


def test_image_gpu_variables_never_widen_selection(runner, store, image_files, shared_tmp,
                                                   sim_host):
    """A store image's Env NVIDIA_VISIBLE_DEVICES=all is data for its
    command: the selection stays the caller's (--gpus 1: one GPU node)."""
    ref = _layout(shared_tmp / "lay", image_files["base"],
                  Env=["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=all",
                       "NVIDIA_DRIVER_CAPABILITIES=all", "CUDA_VISIBLE_DEVICES=0,1,2,3"])
    r = gsbx(runner, store, ["run", "--driver-root", sim_host.root, "--gpus", "1", ref,
                             "sh", "-c", "ls /dev | grep -E '^nvidia[0-9]+$'; "
                             "echo $NVIDIA_VISIBLE_DEVICES"])
    assert r.returncode == 0, r.stderr
    nodes, visible = r.stdout.split()
    # one node, and the GPU row (4) replaced the image's "all" with the selection
    assert nodes == "nvidia1" and visible.startswith("GPU-") and "," not in visible, r.stdout
