"""pyxis's srun options through the SPANK plugin (spank_gpusandbox.c), on the
real Slurm testbed (scripts/slurm-testbed, ConstrainDevices=yes) whose
plugstack.conf loads the plugin `gpusandbox slurm install-plugin` built.

The commands are written as a pyxis user writes them: no `gpusandbox run`."""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration import slurm_fixture as sf

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@pytest.fixture(scope="module")
def tb(cli, workdir_base):
    sim = workdir_base / "spank-sim"
    r = subprocess.run([sys.executable, "-m", "gpusandbox.sim", "create", str(sim), "--gpus", "4"],
                       cwd=sf.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout
    try:
        bed = sf.slurm_testbed(workdir_base / "spank", sim, constrain=True)
    except sf.TestbedUnavailable as e:
        pytest.skip(f"Slurm testbed unavailable: {e}")
    try:
        if not os.path.exists("/usr/include/slurm/spank.h"):    # as the testbed installs Slurm
            r = subprocess.run(["apt-get", "install", "-y", "-q", "libslurm-dev"],
                               env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               timeout=600)
            if r.returncode:
                pytest.skip(f"slurm/spank.h missing, apt-get install libslurm-dev failed: "
                            f"{r.stderr.strip()[-200:]}")
        r = subprocess.run([cli, "slurm", "install-plugin", "--dir",
                            str(workdir_base / "spank-plugin")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        line = r.stdout.strip()
        assert line.startswith("required /") and " task=/" in line, line
        with open(os.path.join(bed.state, "plugstack.conf"), "w") as f:
            f.write(line + "\n")
        bed.cli = cli
        yield bed
    finally:
        bed.stop()


def srun(tb, args, user=None, env=None):
    # The simulated driver root reaches the task like any exported variable.
    env = dict(env or {}, GPUSANDBOX_DRIVER_ROOT=tb.sim_dir)
    return tb.srun(args, user=user, env=env)


def njobs(tb):
    r = tb.run(["squeue", "-h", "-t", "all", "-o", "%i"])
    return len(r.stdout.split())


def settle(tb, timeout=30):
    """Wait until no job of the testbed is pending, running or completing: a
    killed srun's job otherwise lives on in slurmctld, whose messages to that
    srun's port can reach the next srun given the same port (it then fails
    with "received spurious message type" and no allocation)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = tb.run(["squeue", "-h", "-t", "PD,R,CG", "-o", "%i"])
        if r.returncode == 0 and not r.stdout.split():
            return
        time.sleep(0.2)


@pytest.mark.parametrize("opt, why", [
    ("--container-mounts=/a:b", "DST must be an absolute path"),
    ("--container-mounts=/a:/b:ro+rprivate", "unknown flag"),
    ("--container-workdir=rel", "must be an absolute path"),
    ("--container-env=1X", "not a variable name"),
    ("--container-unshare=pid", "unknown namespace"),
    ("--container-name=../x", "letters, digits"),
    ("--container-name=x:join", "FLAG after ':' must be auto, create, exec or no_exec"),
    ("--container-save=/tmp/x.tar", "must end in .sqsh or .squashfs"),
    ("--container-save=/tmp/x/", "the target is a directory"),
])
def test_bad_option_is_refused_before_allocation(tb, rootfs, opt, why):
    before = njobs(tb)
    r = srun(tb, [f"--container-image={rootfs}", opt, "true"])
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"srun: error: gpusandbox: {opt}: "), lines
    assert why in lines[0]
    assert njobs(tb) == before
    r = tb.run(["sbatch", f"--container-image={rootfs}", opt, "--wrap", "true"])
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert njobs(tb) == before


# (extra srun options, command, expected stdout); {data} is a host directory.
TABLE = [
    ([], ["sh", "-c", "head -1 /etc/os-release"],
     'PRETTY_NAME="gpusandbox demo image (Debian-style)"'),
    ([], ["sh", "-c", "touch /x 2>/dev/null && echo rw || echo ro"], "ro"),
    (["--container-writable"], ["sh", "-c", "touch /x && echo rw"], "rw"),
    (["--container-readonly"], ["sh", "-c", "touch /x 2>/dev/null && echo rw || echo ro"], "ro"),
    (["--container-workdir=/etc"], ["pwd"], "/etc"),
    (["--container-mounts={data}:/data:ro"],
     ["sh", "-c", "cat /data/f; touch /data/g 2>/dev/null || echo ro"], "hello\nro"),
    (["--container-mounts={data}"], ["sh", "-c", "cat {data}/f"], "hello"),
    (["--container-mounts=tmpfs:/scratch"], ["sh", "-c", "touch /scratch/x && echo ok"], "ok"),
    # the command is looked up on the image's PATH, not the node's
    (["--container-mounts={data}/bin:/usr/local/bin:ro"], ["only-in-image", "a"], "inside a"),
    (["--container-env=FOO"], ["sh", "-c", "echo $FOO"], "bar"),
    (["--container-unshare=net"], ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1"], "lo"),
    (["--container-remap-root"], ["id", "-u"], "0"),
    ([], ["sh", "-c",
          "echo $SLURM_PROCID/$SLURM_NTASKS; env | grep -c GPUSANDBOX_SPANK || true"],
     "0/1\n0"),
]


@pytest.mark.parametrize("mode", ["root", "user"])
def test_pyxis_commands(tb, rootfs, workdir_base, test_user, mode):
    user = test_user if mode == "user" else None
    data = workdir_base / f"spank-data-{mode}"
    data.mkdir(exist_ok=True)
    (data / "f").write_text("hello\n")
    (data / "bin").mkdir(exist_ok=True)
    (data / "bin" / "only-in-image").write_text('#!/bin/sh\necho inside "$@"\n')
    os.chmod(data / "bin" / "only-in-image", 0o755)
    bad = []
    for opts, cmd, want in TABLE:
        opts = [o.format(data=data) for o in opts]
        cmd = [c.format(data=data) for c in cmd]
        # Variables of the plugin's own that the user exported choose nothing:
        # the root stays read-only, the task is not a check.
        r = srun(tb, [f"--container-image={rootfs}", *opts, *cmd], user=user,
                 env={"FOO": "bar", "GPUSANDBOX_SPANK_WRITABLE": "1",
                      "GPUSANDBOX_SPANK_PREPARE": "1"})
        if (r.returncode, r.stdout.strip()) != (0, want):
            bad.append((opts, cmd, r.returncode, r.stdout, r.stderr))
    assert not bad, bad


@pytest.fixture(scope="module")
def sqsh(workdir_base):
    """A squashfs image (FILE.sqsh, pyxis's other image form), world-readable."""
    if not os.path.exists("/usr/bin/mksquashfs"):
        pytest.skip("mksquashfs is not installed")
    st = os.stat("/dev/fuse")           # rootless squashfuse, as on a distribution with udev
    if st.st_mode & 0o666 != 0o666:
        os.chmod("/dev/fuse", 0o666)
    root = workdir_base / "spank-sqsh-root"
    subprocess.run([os.path.join(sf.REPO, "scripts", "mkrootfs"), str(root), "--no-python"],
                   check=True, capture_output=True)
    (root / "etc" / "marker").write_text("inside the sqsh\n")
    img = workdir_base / "spank.sqsh"
    subprocess.run(["mksquashfs", str(root), str(img), "-noappend", "-quiet", "-no-progress"],
                   check=True, capture_output=True)
    os.chmod(img, 0o644)
    return img


@pytest.mark.parametrize("mode", ["root", "user"])
def test_squashfs_image(tb, sqsh, test_user, mode):
    r = srun(tb, ["-n2", f"--container-image={sqsh}", "cat", "/etc/marker"],
             user=test_user if mode == "user" else None)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "inside the sqsh\n" * 2


def test_gpus_per_task(tb, rootfs, test_user):
    r = srun(tb, ["-n2", "--gpus-per-task=1", "--label", f"--container-image={rootfs}",
                  "nvidia-smi", "-L"], user=test_user)
    assert r.returncode == 0, r.stderr
    per = {}
    for line in r.stdout.splitlines():
        label, _, rest = line.partition(": ")
        if "UUID:" in rest:
            per.setdefault(label.strip(), []).append(rest.split("UUID:")[1].strip(" )"))
    assert sorted(per) == ["0", "1"] and all(len(v) == 1 for v in per.values()), r.stdout
    assert per["0"] != per["1"]


def test_pty_reaches_the_command(tb, rootfs):
    """srun --pty (pyxis's `srun --pty bash`): the command gets a terminal."""
    line = (f"srun --quiet --pty --container-image={rootfs} sh -c 'tty; exit 5'")
    r = tb.run(["script", "-qec", line, "/dev/null"],
               env={"GPUSANDBOX_DRIVER_ROOT": tb.sim_dir})
    assert r.returncode == 5, r.stdout + r.stderr
    assert "/dev/pts/" in r.stdout and "not a tty" not in r.stdout, r.stdout


def test_exit_codes(tb, rootfs):
    r = srun(tb, [f"--container-image={rootfs}", "sh", "-c", "exit 3"])
    assert r.returncode == 3, r.stderr
    r = srun(tb, [f"--container-image={rootfs}", "sh", "-c", "kill -USR1 $$"])
    assert r.returncode == 128 + signal.SIGUSR1, r.stderr


@pytest.mark.parametrize("image", ["{base}/absent.sqsh", "localhost:1#no/such:1"])
def test_missing_image_fails_once_before_the_tasks(tb, workdir_base, image):
    """Checked once per node before any task is forked (the plugin's user_init):
    one line for the three tasks, and no task runs its command."""
    image = image.format(base=workdir_base)
    marker = workdir_base / "spank-ran"
    r = srun(tb, ["-n3", f"--container-image={image}", "touch", str(marker)])
    assert r.returncode == 125
    errs = [ln for ln in r.stderr.splitlines() if "gpusandbox: error:" in ln]
    assert len(errs) == 1, r.stderr
    # the enroot URI reached the registry it names (nothing listens there)
    assert errs[0].startswith("slurmstepd-") and ("absent.sqsh" in errs[0] or
                                                  "registry localhost:1" in errs[0]), errs
    assert not marker.exists()


def test_sbatch_runs_the_script_in_the_container(tb, rootfs, workdir_base):
    out = workdir_base / "spank-sbatch.out"
    script = ("#!/bin/sh\n#SBATCH --container-image=%s\n#SBATCH --container-workdir=/etc\n"
              "head -1 os-release\nexit 4\n" % rootfs)
    jobid = tb.sbatch(["-o", str(out)], script, env={"GPUSANDBOX_DRIVER_ROOT": tb.sim_dir})
    rec = tb.wait_done(jobid)
    assert out.read_text() == 'PRETTY_NAME="gpusandbox demo image (Debian-style)"\n'
    assert rec["ExitCode"] == "4:0"


def test_scancel_leaves_nothing(tb, rootfs, workdir_base):
    out = workdir_base / "spank-cancel"
    out.mkdir()
    os.chmod(out, 0o777)
    script = ("#!/bin/sh\nexec srun --container-image=%s --container-mounts=%s:/out "
              "sh -c 'echo ready > /out/ready; exec sleep 300'\n" % (rootfs, out))
    jobid = tb.sbatch(["-o", str(out / "log")], script,
                      env={"GPUSANDBOX_DRIVER_ROOT": tb.sim_dir})
    end = time.monotonic() + 60
    while not (out / "ready").exists():
        assert time.monotonic() < end, (out / "log").read_text() if (out / "log").exists() else ""
        time.sleep(0.1)
    time.sleep(0.3)
    pids = tb.listpids(jobid)
    assert pids
    tb.scancel(jobid)
    assert tb.wait_done(jobid)["JobState"] == "CANCELLED"
    end = time.monotonic() + 15
    while (any(os.path.exists(f"/proc/{p}") for p in pids) or tb.job_cgroups(jobid)) \
            and time.monotonic() < end:
        time.sleep(0.1)
    assert [p for p in pids if os.path.exists(f"/proc/{p}")] == []
    assert tb.job_cgroups(jobid) == []
    assert str(rootfs) not in open("/proc/self/mountinfo").read()


@pytest.mark.parametrize("mode", ["root", "user"])
def test_named_container_across_steps_and_jobs(tb, rootfs, workdir_base, test_user, mode):
    """--container-name keeps the container's writes for later steps (each srun
    from the login node is a job of its own, so this is across jobs too), a
    name without --container-image reuses it, a step that names it while
    another runs in it stops with one line, and `containers rm` removes it."""
    user = test_user if mode == "user" else None
    store = workdir_base / f"spank-containers-{mode}"
    store.mkdir()
    if user:
        os.chown(store, user.pw_uid, user.pw_gid)
    env = {"GPUSANDBOX_CONTAINERS": str(store)}
    r = srun(tb, [f"--container-image={rootfs}", "--container-name=work", "sh", "-c",
                  "echo kept > /state; cat /state"], user=user, env=env)
    assert (r.returncode, r.stdout) == (0, "kept\n"), r.stderr
    r = srun(tb, ["--container-name=work", "-n2", "cat", "/state"], user=user, env=env)
    assert (r.returncode, r.stdout) == (0, "kept\n" * 2), r.stderr
    # the image itself was not written
    assert not (rootfs / "state").exists()

    ready = store / "ready"
    p = tb.srun_bg(["--container-name=work", f"--container-mounts={store}:/out", "sh", "-c",
                    "touch /out/ready; sleep 30"], user=user,
                   env=dict(env, GPUSANDBOX_DRIVER_ROOT=tb.sim_dir))
    try:
        end = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < end and p.poll() is None, p.stderr.read() if p.poll() \
                is not None else "never ready"
            time.sleep(0.05)
        r = srun(tb, ["--container-name=work", "true"], user=user, env=env)
        assert r.returncode == 125
        errs = [ln for ln in r.stderr.splitlines() if "gpusandbox: error:" in ln]
        assert len(errs) == 1 and "in use by another step" in errs[0], r.stderr
    finally:
        p.kill()
        p.communicate(timeout=30)
        settle(tb)

    r = srun(tb, ["--container-name=absent", "true"], user=user, env=env)
    assert r.returncode == 125 and "no such container" in r.stderr, r.stderr
    cli = [tb.cli, "slurm", "containers"]
    r = tb.run(cli, user=user, env=env)
    assert r.stdout.split() == ["work"], r.stderr
    end = time.monotonic() + 20     # the killed srun's step ends in its own time
    while (r := tb.run(cli + ["rm", "work"], user=user, env=env)).returncode and \
            "in use" in r.stderr and time.monotonic() < end:
        time.sleep(0.2)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(store)) == ["ready"]


@pytest.mark.parametrize("mode", ["root", "user"])
def test_container_save_then_run(tb, sqsh, workdir_base, test_user, mode):
    """--container-save=PATH: after the node's last task, the container's final
    state as a squashfs file of the submitting user's, which
    --container-image=PATH and `gpusandbox run PATH` run; the step's own
    container is gone afterwards, and the image was not written."""
    user = test_user if mode == "user" else None
    out = workdir_base / f"spank-save-{mode}"
    out.mkdir()
    store = out / "containers"
    store.mkdir()
    if user:
        os.chown(out, user.pw_uid, user.pw_gid)
        os.chown(store, user.pw_uid, user.pw_gid)
    env = {"GPUSANDBOX_CONTAINERS": str(store)}
    saved = out / "saved.sqsh"
    r = srun(tb, ["-n2", f"--container-image={sqsh}", f"--container-save={saved}", "sh", "-c",
                  "echo $SLURM_PROCID >> /state; cat /etc/marker"], user=user, env=env)
    assert (r.returncode, r.stdout) == (0, "inside the sqsh\n" * 2), r.stderr
    st = os.stat(saved)
    assert st.st_uid == (user.pw_uid if user else 0)
    assert os.listdir(store) == [] and sorted(os.listdir(out)) == ["containers", "saved.sqsh"]
    r = srun(tb, [f"--container-image={saved}", "sh", "-c", "sort /state; cat /etc/marker"],
             user=user, env=env)
    assert (r.returncode, r.stdout) == (0, "0\n1\ninside the sqsh\n"), r.stderr
    r = tb.run([tb.cli, "run", str(saved), "sort", "/state"], user=user)
    assert (r.returncode, r.stdout) == (0, "0\n1\n"), r.stderr
    # a named container is saved with its writes, and kept
    r = srun(tb, [f"--container-image={sqsh}", "--container-name=keep",
                  f"--container-save={saved}", "sh", "-c", "echo named > /state"],
             user=user, env=env)
    assert r.returncode == 0, r.stderr
    r = srun(tb, [f"--container-image={saved}", "cat", "/state"], user=user, env=env)
    assert (r.returncode, r.stdout) == (0, "named\n"), r.stderr
    assert sorted(os.listdir(store)) == ["keep", "keep.lock", "keep.owner"]


def test_container_save_refuses_an_unwritable_path(tb, sqsh, workdir_base, test_user):
    """A target the submitting user cannot write fails the step with one line
    before any task runs, and nothing is left."""
    locked = workdir_base / "spank-save-locked"
    locked.mkdir(mode=0o755)                  # root's: the user cannot write it
    store = workdir_base / "spank-save-locked-store"
    store.mkdir()
    os.chown(store, test_user.pw_uid, test_user.pw_gid)
    marker = workdir_base / "spank-save-ran"
    r = srun(tb, ["-n2", f"--container-image={sqsh}", f"--container-save={locked}/x.sqsh",
                  "touch", str(marker)], user=test_user,
             env={"GPUSANDBOX_CONTAINERS": str(store)})
    assert r.returncode == 125
    errs = [ln for ln in r.stderr.splitlines() if "gpusandbox: error:" in ln]
    assert len(errs) == 1 and f"{locked} is not writable by uid {test_user.pw_uid}" in errs[0], \
        r.stderr
    assert not marker.exists() and os.listdir(locked) == [] and os.listdir(store) == []


def test_container_name_flags(tb, sqsh, workdir_base):
    """pyxis's NAME:FLAG: create refuses an existing NAME, exec wants a
    running container, no_exec and auto reuse it; each error one line."""
    store = workdir_base / "spank-flags"
    store.mkdir()
    env = {"GPUSANDBOX_CONTAINERS": str(store)}
    r = srun(tb, ["--container-name=f:exec", "true"], env=env)
    assert r.returncode == 125
    errs = [ln for ln in r.stderr.splitlines() if "gpusandbox: error:" in ln]
    assert len(errs) == 1 and "f:exec: the container is not running" in errs[0], r.stderr
    assert os.listdir(store) == []
    r = srun(tb, [f"--container-image={sqsh}", "--container-name=f:create", "sh", "-c",
                  "echo 1 > /n"], env=env)
    assert r.returncode == 0, r.stderr
    r = srun(tb, [f"--container-image={sqsh}", "--container-name=f:create", "true"], env=env)
    errs = [ln for ln in r.stderr.splitlines() if "gpusandbox: error:" in ln]
    assert r.returncode == 125 and len(errs) == 1 and \
        "f:create: the container already exists" in errs[0], r.stderr
    for flag in ("no_exec", "auto"):
        r = srun(tb, [f"--container-name=f:{flag}", "cat", "/n"], env=env)
        assert (r.returncode, r.stdout) == (0, "1\n"), r.stderr


def test_container_save_failing_at_the_end_keeps_the_old_file(tb, sqsh, workdir_base, test_user):
    """A save that fails after the tasks (here the task itself made the
    directory unwritable) says so in one line and leaves the previous file
    as it was, with no temporary beside it; the step's container is gone."""
    out = workdir_base / "spank-save-late"
    out.mkdir()
    store = workdir_base / "spank-save-late-store"
    store.mkdir()
    for d in (out, store):
        os.chown(d, test_user.pw_uid, test_user.pw_gid)
    saved = out / "s.sqsh"
    saved.write_text("old")
    os.chown(saved, test_user.pw_uid, test_user.pw_gid)
    r = srun(tb, [f"--container-image={sqsh}", f"--container-save={saved}",
                  f"--container-mounts={out}:/out", "chmod", "555", "/out"], user=test_user,
             env={"GPUSANDBOX_CONTAINERS": str(store)})
    # the step's status stays the command's (Slurm's task_exit cannot change it)
    assert r.returncode == 0 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("slurmstepd-") and \
        f"gpusandbox: error: --container-save: cannot write {saved}" in r.stderr, r.stderr
    os.chmod(out, 0o755)
    assert saved.read_text() == "old" and os.listdir(out) == ["s.sqsh"]
    assert os.listdir(store) == []


def test_sbatch_container_save(tb, sqsh, workdir_base):
    """#SBATCH --container-save: the batch script's container, saved at its end."""
    out = workdir_base / "spank-sbatch-save"
    out.mkdir()
    saved = out / "b.sqsh"
    script = ("#!/bin/sh\n#SBATCH --container-image=%s\n#SBATCH --container-save=%s\n"
              "echo batch > /state\n" % (sqsh, saved))
    jobid = tb.sbatch(["-o", str(out / "log")], script,
                      env={"GPUSANDBOX_DRIVER_ROOT": tb.sim_dir,
                           "GPUSANDBOX_CONTAINERS": str(out / "c")})
    rec = tb.wait_done(jobid)
    assert rec["ExitCode"] == "0:0", (out / "log").read_text()
    r = srun(tb, [f"--container-image={saved}", "cat", "/state"])
    assert (r.returncode, r.stdout) == (0, "batch\n"), r.stderr


@pytest.mark.parametrize("mode", ["root", "user"])
def test_join_a_running_named_container(tb, rootfs, workdir_base, test_user, attack_user, mode):
    """pyxis's join: while a step of the job runs in NAME, `srun --overlap
    --container-name=NAME:exec` (and a plain NAME) runs in that step's
    sandbox: its writable root, its pid namespace, the submitting user's
    identity; no_exec never joins; another user cannot."""
    user = test_user if mode == "user" else None
    store = workdir_base / f"spank-join-{mode}"
    store.mkdir()
    os.chmod(store, 0o700)
    if user:
        os.chown(store, user.pw_uid, user.pw_gid)
    env = {"GPUSANDBOX_CONTAINERS": str(store), "GPUSANDBOX_DRIVER_ROOT": tb.sim_dir}
    p = tb.srun_bg([f"--container-image={rootfs}", "--container-name=w",
                    f"--container-mounts={store}:/out", "sh", "-c",
                    "echo first > /inroot; readlink /proc/self/ns/pid > /out/ns; "
                    "echo $SLURM_JOB_ID > /out/job; exec sleep 120"], user=user, env=env)
    job = None
    try:
        end = time.monotonic() + 60
        while not (store / "job").exists() or not (store / "job").read_text().strip():
            assert time.monotonic() < end and p.poll() is None, \
                p.stderr.read() if p.poll() is not None else "never ready"
            time.sleep(0.1)
        job = (store / "job").read_text().strip()
        first_ns = (store / "ns").read_text().strip()
        cmd = ["sh", "-c", "cat /inroot; readlink /proc/self/ns/pid; id -u; "
               "echo $SLURM_STEP_ID; exit 7"]
        uid = str(user.pw_uid if user else 0)
        for flag in (":exec", ""):
            r = srun(tb, ["--overlap", "--jobid", job, "-n1", f"--container-name=w{flag}",
                          *cmd], user=user, env=env)
            assert r.returncode == 7, r.stderr
            out = r.stdout.split()
            assert out[:3] == ["first", first_ns, uid] and out[3] != "0", r.stdout
            assert "gpusandbox: error" not in r.stderr, r.stderr
        # The joining step's task stays what Slurm signals: scancel's TERM
        # reaches the joined command, whose status is the step's.
        j = tb.srun_bg(["--overlap", "--jobid", job, "-n1", "--container-name=w:exec", "sh",
                        "-c", "echo $SLURM_STEP_ID > /out/step; exec sleep 97"], user=user,
                       env=env)
        end = time.monotonic() + 60
        while not (store / "step").exists() or not (store / "step").read_text().strip():
            assert time.monotonic() < end and j.poll() is None, \
                j.stderr.read() if j.poll() is not None else "never joined"
            time.sleep(0.1)
        joined = f"{job}.{(store / 'step').read_text().strip()}"
        assert tb.run(["scancel", "--signal=TERM", joined], user=user).returncode == 0
        j.communicate(timeout=30)
        assert j.returncode == 128 + signal.SIGTERM, j.returncode

        def sleeping():
            out = []
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        out.append(f.read())
                except OSError:
                    pass
            return b"sleep\x0097\x00" in out
        end = time.monotonic() + 10
        while sleeping() and time.monotonic() < end:
            time.sleep(0.1)
        assert not sleeping()
        # Options that make a container are ignored, with one warning line.
        r = srun(tb, ["--overlap", "--jobid", job, "-n1", "--container-name=w",
                      f"--container-mounts={store}:/elsewhere", "sh", "-c",
                      "test -e /elsewhere || cat /inroot"], user=user, env=env)
        assert (r.returncode, r.stdout) == (0, "first\n"), r.stderr
        assert "ignoring --container-mounts" in r.stderr
        # A join saves nothing: refused before the tasks, one line.
        r = srun(tb, ["--overlap", "--jobid", job, "-n1", "--container-name=w",
                      f"--container-save={store}/j.sqsh", "true"], user=user, env=env)
        errs = [ln for ln in r.stderr.splitlines() if "gpusandbox: error:" in ln]
        assert r.returncode == 125 and len(errs) == 1 and "which this step would join" in \
            errs[0] and not (store / "j.sqsh").exists(), r.stderr
        # no_exec never joins: one writer, one line.
        r = srun(tb, ["--overlap", "--jobid", job, "-n1", "--container-name=w:no_exec",
                      "true"], user=user, env=env)
        errs = [ln for ln in r.stderr.splitlines() if "gpusandbox: error:" in ln]
        assert r.returncode == 125 and len(errs) == 1 and "in use by another step" in errs[0], \
            r.stderr
        # Another user: Slurm refuses a step in the job; in a job of their own,
        # the store is not theirs.
        r = srun(tb, ["--overlap", "--jobid", job, "-n1", "--container-name=w:exec", "id"],
                 user=attack_user, env=env)
        assert r.returncode != 0 and "uid=" not in r.stdout
        r = srun(tb, ["--container-name=w:exec", "id"], user=attack_user, env=env)
        errs = [ln for ln in r.stderr.splitlines() if "gpusandbox: error:" in ln]
        assert r.returncode == 125 and len(errs) == 1 and "uid=" not in r.stdout, r.stderr
    finally:
        if job:
            tb.scancel(job)
        p.kill()
        p.communicate(timeout=30)
        settle(tb)
