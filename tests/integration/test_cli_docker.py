"""docker/podman spellings of `run` as a user types them, on the installed CLI,
as root and as an unprivileged user; the suggestions and refusals as one
line with the documented exit code."""
import os
import shlex
import subprocess

import pytest

from .conftest import host_mounts, tree_checksum
from .test_gpu_cli import smi_uuids


def sh(runner, rootfs, script, *opts, env=None):
    return runner.run([*opts, str(rootfs), "sh", "-c", script], env=env)


def one_error(r, code, line):
    """stderr is exactly `gpusandbox: error: LINE` and a hint line."""
    assert r.returncode == code, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == f"gpusandbox: error: {line}", r.stderr
    assert len(lines) == 2 and lines[1].startswith("hint: "), r.stderr
    return lines[1]


def mountinfo_line(out, path):
    """The mountinfo line of the mount at `path` inside, as (fields, fs, super options)."""
    for line in out.splitlines():
        pre, _, post = line.partition(" - ")
        f = pre.split()
        if len(f) > 5 and f[4] == path:
            return f, post.split()[0], post.split()[2]
    raise AssertionError(f"no mount at {path}:\n{out}")


def test_it_without_a_terminal_passes_stdin(runner, rootfs):
    r = runner.run(["-it", "--rm", str(rootfs), "sh", "-c", "read x; echo got-$x; tty || true"],
                   input="line\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["got-line", "not a tty"]


def test_ti_with_a_terminal_gets_a_pty(root_runner, rootfs):
    cmd = shlex.join(root_runner.argv(["-ti", "--rm", str(rootfs), "sh", "-c", "tty; echo ok"]))
    r = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True,
                       timeout=30, env=root_runner.env(), cwd="/")
    lines = r.stdout.replace("\r", "").splitlines()
    assert r.returncode == 0 and lines[0].startswith("/dev/pts/") and lines[1] == "ok", r.stdout


def test_mount_bind_and_v_with_one_path(runner, rootfs, shared_tmp):
    data, same = shared_tmp / "data", shared_tmp / "same"
    for d in (data, same):
        d.mkdir()
        os.chown(d, runner.uid, runner.gid)
    (data / "in.txt").write_text("from host\n")
    before = tree_checksum(rootfs)
    r = sh(runner, rootfs, "cat /data/in.txt; echo no > /data/x 2>/dev/null || echo ro-refused; "
           f"echo out > {same}/out.txt; cat /proc/self/mountinfo",
           "--mount", f"type=bind,source={data},target=/data,readonly",
           "-v", str(same))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:2] == ["from host", "ro-refused"]
    assert (same / "out.txt").read_text() == "out\n" and not (data / "x").exists()
    fields, _, _ = mountinfo_line(r.stdout, "/data")
    assert {"ro", "nosuid", "nodev"} <= set(fields[5].split(","))
    fields, _, _ = mountinfo_line(r.stdout, str(same))
    assert {"rw", "nosuid", "nodev"} <= set(fields[5].split(","))
    assert tree_checksum(rootfs) == before


def test_mount_tmpfs(runner, rootfs, shared_tmp):
    before, image = host_mounts(), tree_checksum(rootfs)
    r = sh(runner, rootfs,
           "stat -c %a /scratch; echo hi > /scratch/f && cat /scratch/f; "
           "dd if=/dev/zero of=/scratch/big bs=64k count=32 2>/dev/null || echo full; "
           "touch /etc/hidden/x 2>/dev/null || echo ro-refused; ls -A /etc/hidden | wc -l; "
           "cat /proc/self/mountinfo",
           "--mount", "type=tmpfs,dst=/scratch,tmpfs-size=1m,tmpfs-mode=1770",
           "--mount", "type=tmpfs,destination=/etc/hidden,ro")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[:5] == ["1770", "hi", "full", "ro-refused", "0"]
    fields, fs, opts = mountinfo_line(r.stdout, "/scratch")
    assert fs == "tmpfs" and {"rw", "nosuid", "nodev"} <= set(fields[5].split(","))
    assert "size=1024k" in opts.split(",")
    fields, fs, _ = mountinfo_line(r.stdout, "/etc/hidden")
    assert fs == "tmpfs" and "ro" in fields[5].split(",")
    assert host_mounts() == before and tree_checksum(rootfs) == image


def test_gpus_device_and_count(runner, sim_host, rootfs):
    uuids = [g["uuid"] for g in sim_host.gpus]
    for opt, want in (('"device=1,3"', [1, 3]), ("device=2", [2]), ("count=2", [0, 1]),
                      ("count=all", [0, 1, 2, 3])):
        r = runner.run(["--driver-root", sim_host.root, "--gpus", opt, str(rootfs),
                        "nvidia-smi", "-L"])
        assert r.returncode == 0 and r.stderr == "", (opt, r.stderr)
        assert smi_uuids(r.stdout) == [uuids[i] for i in want], opt


def test_gpus_bare_number_is_an_index_with_a_note(root_runner, sim_host, rootfs):
    r = root_runner.run(["--driver-root", sim_host.root, "--gpus", "2", str(rootfs),
                         "nvidia-smi", "-L"])
    assert r.returncode == 0, r.stderr
    assert smi_uuids(r.stdout) == [sim_host.gpus[2]["uuid"]]
    assert r.stderr == ("gpusandbox: note: --gpus 2 is the GPU with index 2, not docker's "
                        "count: for 2 GPUs use --gpus count=2 (--gpus device=2 selects the "
                        "index without this note)\n")
    # An index the host lacks: one error line, whose hint gives docker's meaning.
    r = root_runner.run(["--driver-root", sim_host.root, "--gpus", "4", str(rootfs), "true"])
    hint = one_error(r, 125, "--gpus '4': unknown device '4'")
    assert hint.endswith("; for 4 GPUs (docker's meaning) use --gpus count=4"), hint


@pytest.mark.parametrize("sel,line", [
    ("0,0", "invalid --gpus '0,0': '0' is named twice"),
    ("1,{uuid1}", "invalid --gpus '1,{uuid1}': '{uuid1}' names GPU 1 again"),
    ("count=5", "--gpus count=5: this host has 4 GPUs"),
    ("all,capabilities=utility", "invalid --gpus 'all,capabilities=utility': "
                                 "capabilities are a separate option here"),
])
def test_gpus_refusals(runner, sim_host, rootfs, sel, line):
    uuid1 = sim_host.gpus[1]["uuid"]
    before = host_mounts()
    r = runner.run(["--driver-root", sim_host.root, "--gpus", sel.format(uuid1=uuid1),
                    str(rootfs), "true"])
    one_error(r, 125, line.format(uuid1=uuid1))
    assert host_mounts() == before


def test_driver_binary_without_gpus_says_no_gpu_was_selected(runner, sim_host, rootfs):
    r = runner.run(["--driver-root", sim_host.root, str(rootfs), "nvidia-smi", "-L"])
    hint = one_error(r, 127, "command not found in the image: nvidia-smi: no GPU was "
                     "selected, so the driver's nvidia-smi was not injected")
    assert "--gpus" in hint
    # Any other missing command keeps the PATH hint.
    r = runner.run([str(rootfs), "no-such-tool"])
    assert "check the image's PATH" in one_error(r, 127, "command not found in the image: "
                                                 "no-such-tool")


def test_run_honours_the_driver_root_variable(runner, sim_host, rootfs):
    env = {"GPUSANDBOX_DRIVER_ROOT": sim_host.root}
    r = runner.run(["--gpus", "device=3", str(rootfs), "nvidia-smi", "-L"], env=env)
    assert r.returncode == 0, r.stderr
    assert smi_uuids(r.stdout) == [sim_host.gpus[3]["uuid"]]
    # --driver-root wins over the variable.
    r = runner.run(["--driver-root", sim_host.root, "--gpus", "device=0", str(rootfs),
                    "nvidia-smi", "-L"], env={"GPUSANDBOX_DRIVER_ROOT": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    assert smi_uuids(r.stdout) == [sim_host.gpus[0]["uuid"]]


def test_suggestions_and_usage(cli, root_runner, rootfs):
    env = root_runner.env()
    r = subprocess.run([cli, "pul"], capture_output=True, text=True, env=env)
    one_error(r, 125, "unknown command: pul; did you mean pull?")
    r = root_runner.run(["--gpu", "0", str(rootfs), "true"])
    one_error(r, 125, "unknown option '--gpu'; did you mean --gpus?")
    r = root_runner.run(["-p", "80:80", str(rootfs), "true"])
    one_error(r, 125, "unknown option '-p': there is no port mapping")
    r = subprocess.run([cli, "run"], capture_output=True, text=True, env=env)
    hint = one_error(r, 125, "missing IMAGE")
    help_text = subprocess.run([cli, "run", "--help"], capture_output=True, text=True,
                               env=env).stdout
    assert hint.startswith("hint: " + help_text.splitlines()[0] + " ")
    assert "IMAGE [--] [CMD [ARG...]]" in hint
