"""podman 4.3 + conmon with --runtime gpusandbox-oci, as root and as the
unprivileged test user (its own HOME, XDG_RUNTIME_DIR and image store):
run --rm exit codes, run -d + exec + logs + stop (the workload's status),
kill, run -it through a pty, and nothing left after rm -f."""
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import MODES, VENV

OCI = str(VENV / "bin" / "gpusandbox-oci")
# One name per test process: xdist workers share root's image store, and a
# worker's `rmi -f` at teardown would remove another's running containers.
IMAGE = f"localhost/gsbx-oci-test-{os.getpid()}:1"
# podman's default nofile/nproc limits exceed this host's hard limits (runc
# refuses them too); rootless podman here has no slirp4netns.
RUN = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--network", "none"]

pytestmark = pytest.mark.skipif(not shutil.which("podman") or not shutil.which("conmon"),
                                reason="podman and conmon are not installed")


class Podman:
    def __init__(self, mode, user, home):
        self.mode, self.user, self.home = mode, user, home

    def argv(self, args):
        cmd = ["podman", "--runtime", OCI] + list(args)
        if self.mode == "root":
            # A store of its own under /tmp/gsbx-test-podman-*: the overlay
            # mounts root podman makes there are not the host's for the
            # tests beside (conftest.host_mounts), and none outlive the module.
            cmd[1:1] = ["--root", f"{self.home}/storage", "--runroot", f"{self.home}/rr",
                        "--tmpdir", f"{self.home}/tmp"]
        if self.mode == "rootless":
            cmd = ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                   "--clear-groups", "--", "env", "-i", "PATH=/usr/bin:/bin:/usr/sbin:/sbin",
                   f"HOME={self.home}", f"XDG_RUNTIME_DIR={self.home}/run"] + cmd
        return cmd

    def __call__(self, *args, timeout=60):
        return subprocess.run(self.argv(args), capture_output=True, text=True, timeout=timeout,
                              cwd="/", stdin=subprocess.DEVNULL)

    @property
    def state_root(self):
        return Path("/run/gpusandbox-oci" if self.mode == "root"
                    else f"{self.home}/run/gpusandbox-oci")


@pytest.fixture(scope="module", params=MODES)
def podman(request, cli, rootfs, test_user):
    home = Path(tempfile.mkdtemp(prefix="gsbx-test-podman-oci-", dir="/tmp"))
    os.chmod(home, 0o755)
    (home / "run").mkdir(mode=0o700)
    for p in (home, home / "run"):
        os.chown(p, test_user.pw_uid, test_user.pw_gid)
    tar = home / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tar), "."], check=True)
    pm = Podman(request.param, test_user, home)
    r = pm("import", str(tar), IMAGE, timeout=120)
    assert r.returncode == 0, r.stderr
    yield pm
    pm("rmi", "-f", IMAGE)
    pm("system", "reset", "--force", timeout=120)
    shutil.rmtree(home, ignore_errors=True)


def test_run_exec_stop_kill_rm(podman):
    # podman's seccomp profile is installed (mode 2); no_new_privs stays off,
    # as podman's config asks.
    r = podman("run", "--rm", *RUN, IMAGE, "sh", "-c", "echo hi $container "
               "$(grep -c '^Seccomp:.2' /proc/self/status)$(grep -c '^NoNewPrivs:.0' "
               "/proc/self/status); exit 7")
    assert (r.returncode, r.stdout) == (7, "hi podman 11\n"), r.stderr
    name = f"gsbx-oci-{os.getpid()}"
    r = podman("run", "-d", "--name", name, *RUN, IMAGE, "sh", "-c",
               "echo up; trap 'echo term; exit 5' TERM; while :; do sleep 0.1; done")
    assert r.returncode == 0, r.stderr
    cid = r.stdout.strip()
    try:
        st = json.loads((podman.state_root / cid / "state.json").read_text())
        r = podman("exec", name, "sh", "-c", "echo in-exec $$; exit 4")
        assert (r.returncode, r.stdout.split()[0]) == (4, "in-exec"), r.stderr
        r = podman("stop", "-t", "20", name)
        assert r.returncode == 0, r.stderr
        r = podman("inspect", "--format", "{{.State.ExitCode}}", name)
        assert r.stdout.strip() == "5"
        assert podman("logs", name).stdout.split() == ["up", "term"]
        r = podman("start", name)
        assert r.returncode == 0, r.stderr
        r = podman("kill", name)
        assert r.returncode == 0, r.stderr
        r = podman("wait", name)
        assert r.stdout.strip() == "137"
    finally:
        r = podman("rm", "-f", name)
    assert r.returncode == 0, r.stderr
    assert not (podman.state_root / cid).exists()
    if st.get("cgroup"):
        assert not os.path.exists(st["cgroup"])
    assert not os.path.exists(f"/proc/{st['pid']}") or \
        Path(f"/proc/{st['pid']}/comm").read_text().strip() != "gpusandbox-init"


def test_run_it_through_a_pty(podman):
    """-it: conmon gets the pty master over the console socket."""
    cmd = " ".join(podman.argv(["run", "--rm", "-it", *RUN, IMAGE, "sh", "-c",
                                "tty; exit 3"]))
    # script's input stays open (a pipe this test holds), as a user's
    # terminal does: at EOF on its input script ends the session's input,
    # and podman's attach can then race the workload's first output.
    keep_r, keep_w = os.pipe()
    try:
        r = subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True,
                           text=True, timeout=60, stdin=keep_r, cwd="/")
    finally:
        os.close(keep_r)
        os.close(keep_w)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "/dev/pts/0" in r.stdout
