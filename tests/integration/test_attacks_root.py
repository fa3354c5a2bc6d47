"""Attacks on how the launcher reaches the image's root and creates paths in
it: a swapper that exchanges rootfs/ (or IMAGE_DIR) with a symlink to a host
directory while launches run, `..` in container paths, a symlinked bundle
config.json, and --rw with GPUs leaving its traces in IMAGE_DIR."""
import json
import os
import secrets
import shutil
import subprocess
import sys
import time

import pytest

from .conftest import REPO, host_mounts, tree_checksum

# Exchanges two names in one directory as fast as it can (renameat2
# RENAME_EXCHANGE), as the image's owner would around each launch.
SWAPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
d, a, b = sys.argv[1], sys.argv[2].encode(), sys.argv[3].encode()
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
os.write(1, b"go\n")
while True:
    if libc.renameat2(fd, a, fd, b, 2) != 0:
        os._exit(3)
"""


NOBODY = 65534


def make_rootfs(path):
    subprocess.run([str(REPO / "scripts" / "mkrootfs"), str(path), "--no-python"],
                   check=True, capture_output=True)


@pytest.fixture
def evil_root(shared_tmp, runner):
    """A host directory the image's owner must never reach: a root filesystem
    (so a launch that took it as its root would run) holding a secret, inside
    a directory only the caller can enter (root-only for root; the rootless
    caller's private files)."""
    private = shared_tmp / "private"
    private.mkdir()
    host_root = private / "hostroot"
    make_rootfs(host_root)
    token = secrets.token_hex(8)
    (host_root / "SECRET").write_text(f"host secret {token}\n")
    os.chmod(host_root / "SECRET", 0o600)
    os.chmod(private, 0o700)
    if runner.mode == "rootless":
        subprocess.run(["chown", "-R", f"{runner.uid}:{runner.gid}", str(private)], check=True)
    return host_root, token


def _swap_setup(shared_tmp, evil, what):
    """(directory to swap in, real name, decoy name, IMAGE_DIR argument)."""
    top = shared_tmp / "attacker"
    top.mkdir()
    os.chmod(top, 0o755)
    if what == "rootfs":
        bundle = top / "bundle"
        bundle.mkdir()
        make_rootfs(bundle / "rootfs")
        (bundle / "config.json").write_text(json.dumps(
            {"ociVersion": "1.0.2", "process": {"cwd": "/", "env": ["PATH=/usr/bin:/bin"]},
             "root": {"path": "rootfs"}}))
        os.symlink(str(evil), bundle / "decoy")
        return bundle, "rootfs", "decoy", str(bundle)
    make_rootfs(top / "img")
    os.symlink(str(evil), top / "decoy")
    # The attacker is neither root nor the caller (whose own symlinks at
    # IMAGE_DIR are followed).
    os.lchown(top / "decoy", NOBODY, NOBODY)
    os.lchown(top, NOBODY, NOBODY)
    return top, "img", "decoy", str(top / "img")


@pytest.mark.parametrize("mode", ["overlay", "rw"])
@pytest.mark.parametrize("what", ["rootfs", "imagedir"])
def test_swap_race_never_reaches_host(runner, shared_tmp, evil_root, what, mode):
    evil, token = evil_root
    swap_dir, real, decoy, image = _swap_setup(shared_tmp, evil, what)
    if runner.mode == "rootless" and mode == "rw":
        subprocess.run(["chown", "-R", f"{runner.uid}:{runner.gid}", image], check=True)
    before_evil, before_mounts = tree_checksum(evil), host_mounts()
    args = (["--rw"] if mode == "rw" else []) + [
        image, "sh", "-c", "cat /SECRET 2>/dev/null; echo x > /tmp/w; "
        + ("echo pwned > /PWNED 2>/dev/null; " if mode == "rw" else "") + "echo done"]
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(swap_dir), real, decoy],
                               stdout=subprocess.PIPE)
    outcomes = {"ran": 0, "refused": 0}
    try:
        assert swapper.stdout.readline() == b"go\n"
        deadline = time.monotonic() + 40
        for _ in range(60):
            if time.monotonic() > deadline:
                break
            r = runner.run(args, timeout=60)
            assert token not in r.stdout + r.stderr, \
                f"a launch saw the host directory as its root ({what}, {mode})"
            assert "Traceback" not in r.stderr, r.stderr
            if r.returncode == 0:
                assert r.stdout.strip().endswith("done"), r.stdout
                outcomes["ran"] += 1
            else:
                assert r.returncode == 125, (r.returncode, r.stderr)
                assert r.stderr.startswith("gpusandbox: error: "), r.stderr
                outcomes["refused"] += 1
            assert swapper.poll() is None, "the swapper stopped"
    finally:
        swapper.kill()
        swapper.wait()
    assert tree_checksum(evil) == before_evil, "the host directory changed"
    assert not (evil / "PWNED").exists()
    assert host_mounts() == before_mounts
    # The race was real: launches both ran (contained) and were refused.
    assert outcomes["ran"] > 0 and outcomes["refused"] > 0, outcomes


# --- `..` in container paths ------------------------------------------------------

@pytest.fixture
def victim(shared_tmp):
    """A host directory anyone may write into: a walk that climbs out of the
    image would create its entries here, as the caller."""
    d = shared_tmp / "victim"
    d.mkdir()
    os.chmod(d, 0o777)
    return d


def climb(host_path):
    return "../" * 30 + str(host_path).lstrip("/")


def _check_contained(r, victim, before_mounts):
    assert list(victim.iterdir()) == [], f"created on the host: {list(victim.iterdir())}"
    assert host_mounts() == before_mounts
    assert "Traceback" not in r.stderr
    if r.returncode != 0:
        assert r.returncode == 125, (r.returncode, r.stderr)
        lines = [ln for ln in r.stderr.splitlines() if not ln.startswith("hint: ")]
        assert len(lines) == 1 and lines[0].startswith("gpusandbox: error: "), r.stderr


def _own(runner, root):
    if runner.mode == "rootless":
        subprocess.run(["chown", "-R", f"{runner.uid}:{runner.gid}", str(root)], check=True)


@pytest.mark.parametrize("mode", ["overlay", "rw"])
def test_bundle_cwd_with_dotdot_stays_inside(runner, shared_tmp, victim, mode):
    bundle = shared_tmp / "bundle"
    bundle.mkdir()
    make_rootfs(bundle / "rootfs")
    cwd = "/tmp/a/" + climb(victim / "made" / "dir")
    (bundle / "config.json").write_text(json.dumps({"process": {"cwd": cwd}}))
    _own(runner, bundle)
    before = host_mounts()
    r = runner.run((["--rw"] if mode == "rw" else []) + [str(bundle), "pwd"])
    _check_contained(r, victim, before)
    # Lexically normalised as runc does: `..` above / stays at /.
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(victim / "made" / "dir")


@pytest.mark.parametrize("mode", ["overlay", "rw"])
def test_workdir_option_with_dotdot_stays_inside(runner, small_rootfs, victim, mode):
    _own(runner, small_rootfs)
    before = host_mounts()
    r = runner.run((["--rw"] if mode == "rw" else []) +
                   ["-w", "/tmp/x/" + climb(victim / "w"), str(small_rootfs), "pwd"])
    _check_contained(r, victim, before)
    assert r.returncode == 0 and r.stdout.strip() == str(victim / "w"), r.stderr


@pytest.mark.parametrize("mode", ["overlay", "rw"])
def test_bind_destination_symlink_climbing_out(runner, small_rootfs, shared_tmp, victim, mode):
    src = shared_tmp / "src"
    src.mkdir()
    os.chmod(src, 0o755)
    (small_rootfs / "mnt").mkdir(exist_ok=True)
    os.symlink("nx/" + climb(victim / "bind"), small_rootfs / "mnt" / "dst")
    _own(runner, small_rootfs)
    before = host_mounts()
    r = runner.run((["--rw"] if mode == "rw" else []) +
                   ["-v", f"{src}:/mnt/dst/sub", str(small_rootfs), "true"])
    _check_contained(r, victim, before)
    assert r.returncode == 125, r.stderr


# With the default overlay the GPU mount points are made in the overlay's
# upper layer, a detached tmpfs whose `..` stays put; --rw creates them in
# the image itself, where a climb reaches the host.
@pytest.mark.parametrize("mode", ["rw"])
def test_gpu_libdir_symlink_climbing_out(runner, small_rootfs, sim_host, victim, mode):
    libdir = small_rootfs / "usr" / "lib" / "x86_64-linux-gnu"
    # Keep the image's own libraries reachable under another name.
    shutil.move(str(libdir), str(small_rootfs / "usr" / "lib" / "real-gnu"))
    loader = small_rootfs / "usr" / "lib64" / "ld-linux-x86-64.so.2"
    loader.unlink()
    os.symlink("/usr/lib/real-gnu/ld-linux-x86-64.so.2", loader)
    os.symlink("nx/" + climb(victim / "lib"), libdir)
    _own(runner, small_rootfs)
    before = host_mounts()
    r = runner.run((["--rw"] if mode == "rw" else []) + [
        "--driver-root", str(sim_host), "--gpus", "0", "-e", "LD_LIBRARY_PATH=/usr/lib/real-gnu",
        str(small_rootfs), "true"])
    _check_contained(r, victim, before)


# --- a symlinked config.json -------------------------------------------------------

def test_bundle_config_symlink_is_no_oracle(runner, shared_tmp):
    """Following config.json would tell the bundle's owner whether a
    root-only host path exists: the launch is refused the same way for a
    target that exists and one that does not."""
    secret_dir = shared_tmp / "rootonly"
    secret_dir.mkdir()
    (secret_dir / "present.json").write_text("{}")
    os.chmod(secret_dir, 0o700)
    bundle = shared_tmp / "bundle"
    bundle.mkdir()
    make_rootfs(bundle / "rootfs")
    seen = []
    for name in ("present.json", "absent.json"):
        cfg = bundle / "config.json"
        if cfg.is_symlink():
            cfg.unlink()
        os.symlink(str(secret_dir / name), cfg)
        r = runner.run([str(bundle), "true"])
        assert "Traceback" not in r.stderr
        assert r.returncode == 125, (name, r.returncode, r.stderr)
        assert "config.json is a symlink" in r.stderr, r.stderr
        seen.append(r.stderr)
    assert seen[0] == seen[1]


# --- --rw with GPUs leaves IMAGE_DIR as the command left it -----------------------

def snapshot(root):
    """{relative path: (mode, size, mtime, content or link target)} of a tree."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            st = os.lstat(p)
            extra = None
            if os.path.islink(p):
                extra = os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as f:
                    extra = f.read()
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, extra)
    return out


def test_rw_gpu_run_changes_only_what_the_command_wrote(runner, small_rootfs, sim_host):
    libdir = small_rootfs / "usr" / "lib" / "x86_64-linux-gnu"
    # An image file named like a driver library link: it must survive.
    (libdir / "libcuda.so.1").write_text("the image's own file\n")
    _own(runner, small_rootfs)
    before = snapshot(small_rootfs)
    r = runner.run(["--rw", "--driver-root", str(sim_host), "--gpus", "0", str(small_rootfs),
                    "sh", "-c", "nvidia-smi -L && echo hello > /written.txt"])
    assert r.returncode == 0, r.stderr
    assert "GPU 0:" in r.stdout, r.stdout
    after = snapshot(small_rootfs)
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    assert changed == {"written.txt"}, sorted(changed)
    assert (small_rootfs / "written.txt").read_text() == "hello\n"


# --- IMAGE_DIR given as a symlink --------------------------------------------------

def test_image_dir_symlink_followed_only_when_trusted(runner, small_rootfs, shared_tmp):
    """The caller's own (or root's) symlink at IMAGE_DIR is followed; one
    owned by anyone else is refused, since its owner could swap it in."""
    mine = shared_tmp / "mine"
    os.symlink(str(small_rootfs), mine)
    os.lchown(mine, runner.uid, runner.gid)
    r = runner.run([str(mine), "true"])
    assert r.returncode == 0, r.stderr
    theirs = shared_tmp / "theirs"
    os.symlink(str(small_rootfs), theirs)
    os.lchown(theirs, NOBODY, NOBODY)
    r = runner.run([str(theirs), "true"])
    assert r.returncode == 125, r.stderr
    assert "is a symlink owned by uid" in r.stderr and len(r.stderr.splitlines()) == 2, r.stderr
