"""`gpusandbox slurm-oci run` run as root by a site (a wrapper, a root
job): the step bundle's environment is the job's, the user's own data, and
must steer nothing on the host side of the root launch (issue 23, a
suspected item)."""
import json
import subprocess

from .crossuser import ENV, Canaries


def test_slurm_oci_as_root_takes_no_host_setting_from_the_job(cli, test_user, shared_tmp,
                                                              rootfs):
    """Suspected item: a site that runs oci.conf's RunTimeRun as root gets
    the job's environment in the step bundle; a PMIx directory it names must
    not be bound into the root sandbox (here /root's canary), while the
    job's variables still reach the command."""
    c = Canaries.plant(str(shared_tmp), [test_user])
    try:
        d = c.dirs["root"]
        step = shared_tmp / "step"
        step.mkdir()
        (step / "config.json").write_text(json.dumps({
            "root": {"path": str(rootfs)},
            "process": {"args": ["sh", "-c", f"echo job=$SLURM_JOB_ID; cat {d}/secret 2>&1; "
                                 f"touch {d}/planted 2>&1; true"],
                        "env": ["PATH=/usr/bin:/bin", "SLURM_JOB_ID=4242",
                                f"PMIX_SERVER_TMPDIR={d}", "LD_PRELOAD=/nonexistent.so"]}}))
        r = subprocess.run([cli, "slurm-oci", "run", str(step)], capture_output=True, text=True,
                           timeout=60, env=ENV, cwd="/")
        assert r.returncode == 0, r.stderr
        assert "job=4242" in r.stdout.splitlines(), r.stdout
        c.check(r.stdout, r.stderr)
        assert ("gpusandbox: note: slurm-oci as root: PMIX_SERVER_TMPDIR of the job's "
                "environment not bound") in r.stderr, r.stderr
    finally:
        c.remove()
