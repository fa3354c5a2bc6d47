"""`gpusandbox run FILE.sqsh`: a squashfs image file mounted read-only, nosuid,
nodev under the private overlay, as root (kernel squashfs on an autoclear
loop device) and rootless (squashfuse in a user namespace of its own), and
nothing left behind, even when the launcher is killed with SIGKILL."""
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import REPO, host_mounts, kill_quietly, pids_with, wait_for
from .test_gpu_cli import smi_uuids


def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    st = os.stat(path)
    return h.hexdigest(), st.st_size, st.st_mtime_ns


@pytest.fixture(scope="session")
def fuse_usable():
    """/dev/fuse as every distribution's udev rule leaves it (0666): a
    container host without udev may have it 0600, which no rootless FUSE
    (squashfuse, fuse-overlayfs, enroot, Apptainer) can use."""
    st = os.stat("/dev/fuse")
    if st.st_mode & 0o666 != 0o666:
        os.chmod("/dev/fuse", 0o666)


@pytest.fixture(scope="session")
def sqsh_dir(cli, fuse_usable):
    """A world-readable directory holding img.sqsh, built with mksquashfs from
    a small rootfs whose /etc/environment sets GREETING."""
    d = Path(tempfile.mkdtemp(prefix="gsbx-test-sqsh-"))
    os.chmod(d, 0o755)
    root = d / "root"
    subprocess.run([str(REPO / "scripts" / "mkrootfs"), str(root), "--no-python"],
                   check=True, capture_output=True)
    with open(root / "etc" / "environment", "a") as f:
        f.write("GREETING=from-the-squashfs\n")
    (root / "etc" / "marker").write_text("inside the sqsh\n")
    subprocess.run(["mksquashfs", str(root), str(d / "img.sqsh"), "-noappend", "-quiet",
                    "-no-progress"], check=True, capture_output=True)
    os.chmod(d / "img.sqsh", 0o644)
    shutil.rmtree(root)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sqsh(sqsh_dir, shared_tmp):
    """A copy of its own for each test: the loop devices a test counts are
    then the ones its own launches made (tests run in parallel)."""
    path = shared_tmp / "img.sqsh"
    shutil.copyfile(sqsh_dir / "img.sqsh", path)
    path.chmod(0o644)
    return path


def loops_backed_by(path):
    """Loop devices whose backing file is `path` (sysfs, as losetup reads it)."""
    out = []
    for name in os.listdir("/sys/block"):
        try:
            with open(f"/sys/block/{name}/loop/backing_file") as f:
                if f.read().strip() == str(path):
                    out.append(name)
        except OSError:
            pass
    return out


def live(pid):
    """Whether pid is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def children(pid, comm):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read()
            except OSError:
                continue
            name = fields[fields.index("(") + 1:fields.rindex(")")]
            if name == comm and int(fields.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def one_error_line(r):
    lines = r.stderr.splitlines()
    assert r.returncode == 125, r.stderr
    assert lines and lines[0].startswith("gpusandbox: error: "), r.stderr
    assert all(ln.startswith("hint: ") for ln in lines[1:]), r.stderr
    return lines[0]


def test_command_runs_in_the_image_with_its_environment(runner, sqsh):
    before = host_mounts()
    r = runner.run([str(sqsh), "sh", "-c",
                    "echo $GREETING; cat /etc/marker; grep ' / / ' /proc/self/mountinfo"])
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[:2] == ["from-the-squashfs", "inside the sqsh"], r.stdout
    assert " - overlay " in out[2], r.stdout
    assert host_mounts() == before
    assert wait_for(lambda: not loops_backed_by(sqsh)), loops_backed_by(sqsh)


@pytest.mark.parametrize("route", ["kernel", "fuse"])
def test_the_image_mount_is_read_only_nosuid_nodev(cli, sqsh, route):
    """The squashfs mount itself, as each route makes it (detached: only its
    fd shows it): read-only, nosuid, nodev, whatever the image holds."""
    from gpusandbox.image import squash as squashfs, squashfuse
    fd = squashfs.open_file(str(sqsh))
    pid = None
    try:
        if route == "kernel":
            class Plan:
                class spec:
                    rootfs_mode = "ro"
                userns = "host"
                squash = None
            _, mnt = squashfs.mount_image(str(sqsh), Plan)
        else:
            pid, mnt = squashfuse.mount(str(sqsh), fd)
        flags = os.fstatvfs(mnt).f_flag
        with open(os.open("etc/marker", os.O_RDONLY, dir_fd=mnt)) as f:
            assert f.read() == "inside the sqsh\n"
        os.close(mnt)
    finally:
        os.close(fd)
        if pid:
            squashfuse.stop(pid)
    assert flags & os.ST_RDONLY and flags & os.ST_NOSUID and flags & os.ST_NODEV, flags
    assert wait_for(lambda: not loops_backed_by(sqsh))


def test_image_file_unchanged_and_writes_stay_private(runner, sqsh):
    before = _digest(sqsh)
    r = runner.run(["--writable-tmpfs", str(sqsh), "sh", "-c",
                    "echo changed > /etc/marker && echo new > /etc/new && cat /etc/marker /etc/new"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["changed", "new"]
    r = runner.run([str(sqsh), "sh", "-c", "cat /etc/marker; test -e /etc/new || echo absent"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["inside", "the", "sqsh", "absent"]
    assert _digest(sqsh) == before


def test_rw_is_refused(runner, sqsh):
    r = runner.run(["--rw", str(sqsh), "true"])
    line = one_error_line(r)
    assert "--rw" in line and "read-only" in line, r.stderr
    assert not loops_backed_by(sqsh)


def test_a_file_that_is_not_squashfs_is_refused(runner, shared_tmp):
    bad = shared_tmp / "bad.sqsh"
    bad.write_bytes(b"PK\x03\x04" + b"\0" * 8192)
    bad.chmod(0o644)
    line = one_error_line(runner.run([str(bad), "true"]))
    assert "not a squashfs file" in line, line
    assert not loops_backed_by(bad)


def test_a_corrupt_squashfs_is_refused_and_leaves_nothing(runner, sqsh, shared_tmp):
    """The superblock is right, the tables it points to (at the end of the
    file) are not: the kernel (root) or squashfuse (rootless) refuses it; one
    line, no loop device, no squashfuse left."""
    data = sqsh.read_bytes()
    bad = shared_tmp / "corrupt.sqsh"
    bad.write_bytes(data[:-8192] + b"\xff" * 8192)
    bad.chmod(0o644)
    r = runner.run([str(bad), "true"])
    line = one_error_line(r)
    assert "cannot mount the squashfs image" in line, r.stderr
    assert not loops_backed_by(bad)
    assert wait_for(lambda: not [p for p in pids_with("squashfuse") if live(p)
                                 and os.stat(f"/proc/{p}").st_uid == runner.uid])


def test_a_symlink_in_place_of_the_file_is_refused(runner, sqsh, shared_tmp):
    link = shared_tmp / "link.sqsh"
    link.symlink_to(sqsh)
    line = one_error_line(runner.run([str(link), "true"]))
    assert "symlink" in line, line


def test_kill_9_of_the_launcher_leaves_nothing(runner, sqsh):
    before = host_mounts()
    marker = "7391"
    proc = runner.popen([str(sqsh), "sleep", marker])
    try:
        assert wait_for(lambda: any(os.readlink(f"/proc/{p}/exe").endswith("sleep")
                                    for p in pids_with(marker) if live(p)))
        if runner.mode == "root":
            # What must go: the loop device backing the image.
            held = loops_backed_by(sqsh)
            assert len(held) == 1, held
            helpers = []
        else:
            helpers = children(proc.pid, "squashfuse")
            assert len(helpers) == 1 and live(helpers[0]), helpers
            assert not loops_backed_by(sqsh)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        kill_quietly(proc)
    assert wait_for(lambda: not [p for p in pids_with(marker) if live(p)])
    assert wait_for(lambda: not any(live(p) for p in helpers)), helpers
    assert wait_for(lambda: not loops_backed_by(sqsh)), loops_backed_by(sqsh)
    assert host_mounts() == before


def test_gpu_injection_works_on_a_squashfs_image(runner, sim_host, sqsh):
    r = runner.run(["--driver-root", sim_host.root, "--gpus", "0", str(sqsh),
                    "sh", "-c", "nvidia-smi -L"])
    assert r.returncode == 0, r.stderr
    assert smi_uuids(r.stdout) == [sim_host.gpus[0]["uuid"]]


def test_a_relative_path_is_the_file_not_a_store_name(runner, sqsh):
    """`run img.sqsh` from its directory: a relative name that exists as a
    .sqsh file is the squashfs image, not NAME[:TAG] of the store."""
    rel = str(sqsh).lstrip("/")          # the runner runs from /
    r = runner.run([rel, "sh", "-c", "echo $GREETING"])
    assert (r.returncode, r.stdout) == (0, "from-the-squashfs\n"), r.stderr


def test_ctrl_c_reaches_the_command_not_the_image_server(rootless_runner, sqsh):
    """A keyboard SIGINT goes to the launcher's process group; the launcher
    forwards it to the command, which may go on working in its image.  So
    squashfuse, which serves that image, must not be in that group."""
    script = ("trap 'sleep 2; ls -R /usr /etc > /dev/null && echo still-served; exit 0' INT; "
              "echo ready; sleep 30 & wait")
    proc = rootless_runner.popen([str(sqsh), "sh", "-c", script], start_new_session=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        kill_quietly(proc)
    assert "still-served" in out, err
