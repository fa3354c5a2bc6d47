"""The SPANK plugin's task program: pyxis's options -> `gpusandbox run` argv."""
import os

import pytest

from gpusandbox.hpc import spanktask as st

BASE = {"GPUSANDBOX_SPANK_IMAGE": "/img", "GPUSANDBOX_SPANK_ENTRYPOINT": "0"}


@pytest.mark.parametrize("image, want", [
    ("nvcr.io#nvidia/pytorch:24.05-py3", "docker://nvcr.io/nvidia/pytorch:24.05-py3"),
    ("docker://nvcr.io#nvidia/pytorch:24.05-py3", "docker://nvcr.io/nvidia/pytorch:24.05-py3"),
    ("alice@localhost:5000#team/app:1", "docker://localhost:5000/team/app:1"),
    ("docker://ubuntu:22.04", "docker://ubuntu:22.04"),
    ("ubuntu@sha256:" + "a" * 64, "docker://ubuntu@sha256:" + "a" * 64),
    ("reg.example#img@sha256:" + "b" * 64, "docker://reg.example/img@sha256:" + "b" * 64),
    ("ubuntu:22.04", "docker://ubuntu:22.04"),
    ("ghcr.io/org/app:2", "docker://ghcr.io/org/app:2"),
    ("oci:/srv/layout:v1", "oci:/srv/layout:v1"),
    ("docker-archive:/srv/app.tar", "docker-archive:/srv/app.tar"),
    ("/shared/images/pytorch.sqsh", "/shared/images/pytorch.sqsh"),
    ("./app.sqsh", "./app.sqsh"),
])
def test_image_ref(image, want):
    assert st.image_ref(image) == want


@pytest.mark.parametrize("image", ["dockerd://ubuntu", "reg#", "#img"])
def test_image_ref_refused(image):
    with pytest.raises(st.Refused):
        st.image_ref(image)


@pytest.mark.parametrize("value, want", [
    ("/data:/data", ["-v", "/data:/data:rw"]),
    ("/data", ["-v", "/data:/data:rw"]),
    ("/data:/in:ro", ["-v", "/data:/in:ro"]),
    ("/data:/in:ro+rslave+nosuid", ["-v", "/data:/in:ro"]),
    ("/data:/in:ro+rw", ["-v", "/data:/in:rw"]),
    ("./x:/x", ["-v", "/job/x:/x:rw"]),
    ("a,/b:/c:ro", ["-v", "/job/a:/job/a:rw", "-v", "/b:/c:ro"]),
    ("tmpfs:/scratch", ["--mount", "type=tmpfs,dst=/scratch"]),
])
def test_mounts(value, want):
    assert st.mount_args(value, "/job") == want


@pytest.mark.parametrize("value", ["/a:/b:rprivate", "tmpfs", "umount:/x"])
def test_mounts_refused(value):
    with pytest.raises(st.Refused):
        st.mount_args(value, "/job")


def run(extra, argv0="python", args=("t.py",), env=None):
    e = dict(BASE, **extra, **(env or {}))
    return st.run_argv(e, argv0, list(args), "/job", "node1")


def test_defaults_no_entrypoint_node_hostname_host_net(tmp_path):
    got = run({"GPUSANDBOX_SPANK_IMAGE": "nvcr.io#nvidia/cuda:12"})
    assert got == ["--net", "host", "--hostname", "node1", "--entrypoint", "",
                   "docker://nvcr.io/nvidia/cuda:12", "--", "python", "t.py"]
    # a directory has no entrypoint to drop
    got = run({"GPUSANDBOX_SPANK_IMAGE": str(tmp_path)})
    assert "--entrypoint" not in got and got[-4:] == [str(tmp_path), "--", "python", "t.py"]


def test_every_option():
    got = run({"GPUSANDBOX_SPANK_MOUNTS": "/d:/d:ro", "GPUSANDBOX_SPANK_WORKDIR": "/w",
               "GPUSANDBOX_SPANK_ENV": "A,B", "GPUSANDBOX_SPANK_UNSHARE": "net,uts",
               "GPUSANDBOX_SPANK_MOUNT_HOME": "1", "GPUSANDBOX_SPANK_REMAP_ROOT": "1",
               "GPUSANDBOX_SPANK_WRITABLE": "1", "GPUSANDBOX_SPANK_ENTRYPOINT": "1",
               "HOME": "/home/u"})
    assert got == ["-v", "/d:/d:ro", "-v", "/home/u:/home/u:rw", "-w", "/w", "-e", "A",
                   "-e", "B", "--net", "none", "--hostname", "node1", "--root",
                   "--writable-tmpfs", "/img", "--", "python", "t.py"]


def test_off_forms_and_pod_keeps_hostname():
    got = run({"GPUSANDBOX_SPANK_MOUNT_HOME": "0", "GPUSANDBOX_SPANK_REMAP_ROOT": "0",
               "GPUSANDBOX_SPANK_WRITABLE": "0", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0",
               "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2"})
    assert got == ["--net", "host", "--entrypoint", "", "/img", "--", "python", "t.py"]


def test_batch_script_is_bound():
    got = run({"GPUSANDBOX_SPANK_BATCH": "1"}, argv0="/spool/job7/slurm_script", args=())
    assert "/spool/job7/slurm_script:/spool/job7/slurm_script:ro" in got


def test_main_refuses_without_the_plugin(capsys, monkeypatch):
    for k in list(os.environ):
        if k.startswith(st.PREFIX):
            monkeypatch.delenv(k)
    assert st.main(["x"]) == 125
    err = capsys.readouterr().err
    assert err.startswith("gpusandbox: error: GPUSANDBOX_SPANK_ARGV0 is not set")


def test_terminal_asks_for_one():
    e = dict(BASE)
    assert "-t" in st.run_argv(e, "bash", [], "/job", "n", tty=True)
    assert "-t" not in st.run_argv(e, "bash", [], "/job", "n", tty=False)


def test_named_container_runs_read_write_without_the_image():
    e = {"GPUSANDBOX_SPANK_NAME": "work", "GPUSANDBOX_SPANK_WRITABLE": "1"}
    got = st.run_argv(e, "sh", [], "/job", "n", container="/c/work")
    assert got == ["--rw", "--net", "host", "--hostname", "n", "/c/work", "--", "sh"]
