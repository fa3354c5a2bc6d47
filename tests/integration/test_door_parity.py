"""Door parity (issue 24): the same workload (parity_doors.py: an image, GPUs
0 and 1 of the simulated host, a bind, env, a user, each door's default
seccomp) launched through every door gives the same sandbox as `run DIR`,
aspect by aspect (parity_compare.py), root and rootless where the door runs
rootless here.  Every difference is either in ALLOWED below, with the
reason the door must differ, or a known bug of today's main in BUGS (a
strict xfail: the test fails once the bug is fixed, so the entry is
dropped with the fix).

The reference behaviour per door: `run` follows docker's rules; the OCI
doors (gpusandbox-oci under podman, exec, the wrapper, the filter, the
hook) follow runc's for what podman's config.json asks.
"""
import os
import re
import shutil
import tempfile

import pytest

from .parity_compare import ASPECTS, aspect_diffs
from .parity_doors import DOORS, World, report_of
from .registry_fixture import images, registry  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("podman") and shutil.which("conmon")),
                                 reason="podman and conmon are not installed (scripts/test)")]

PODMAN = {"podman-oci", "oci-exec", "podman-wrapper", "podman-filter", "podman-hook"}
RUNC = {"podman-wrapper", "podman-filter", "podman-hook"}
ANY = ("root", "rootless")
_DRIVER = r"(/usr/(lib|bin)/|/etc/OpenCL/|/var/run/nvidia-persistenced/|/run/nvidia-persistenced/)"

# (doors, modes, aspect, pattern of the difference, reason)
ALLOWED = [
    # -- env ---------------------------------------------------------------
    ({"run-docker"} | PODMAN, ANY, "env", r"^-(IMAGE_VAR|LANG) ",
     "run reads /etc/environment of an image without a config (a directory, a .sqsh); an "
     "image with a config (docker://) and every OCI door take the environment from the "
     "config alone, as docker and runc do"),
    ({"run-cdi"}, ANY, "env", r"^-NVIDIA_(VISIBLE_DEVICES|DRIVER_CAPABILITIES) ",
     "CDI devices are not an NVIDIA_VISIBLE_DEVICES request: the spec's containerEdits set "
     "no GPU variables (docs/cdi.md)"),
    (PODMAN, ANY, "env", r"^\+(HOSTNAME|TERM) ",
     "podman writes HOSTNAME and TERM into process.env; runc passes them on"),
    ({"podman-hook", "oci-exec"}, ANY, "env",
     r"^(~NVIDIA_VISIBLE_DEVICES \S+ -> 0,1|-NVIDIA_DRIVER_CAPABILITIES )",
     "the hook cannot change the process's environment (runc execs it as config.json says); "
     "podman builds exec's process.env from its own copy of the config, before the "
     "runtime's GPU rewrite"),
    ({"slurm-oci"}, ("root",), "env", r"^-PARITY ",
     "as root slurm-oci passes only the job's variables (SLURM_*, PMI*...) of the bundle "
     "(docs/slurm-testbed.md: the bundle is the user's data)"),
    # -- ids ---------------------------------------------------------------
    (PODMAN, ANY, "ids", r"^~groups \[\] -> \[\d+\]$",
     "podman lists the primary gid in process.user.additionalGids; run clears supplementary "
     "groups (documented for -u)"),
    # -- caps, no_new_privs (runc: what config.json asks) --------------------
    (PODMAN, ANY, "caps", r"^~CapBnd 0+ -> [0-9a-f]+$",
     "podman's config.json asks for a bounding set (its default caps) and runc keeps it; "
     "run drops every capability from the bounding set of a non-root command"),
    (PODMAN, ANY, "no_new_privs", r"^~NoNewPrivs 1 -> 0$",
     "podman's config.json sets noNewPrivileges false and runc honours it; run always sets it"),
    # -- process / network -------------------------------------------------
    (PODMAN, ANY, "process", r"^~hostname gpusandbox -> ",
     "--network host makes podman share the host's UTS namespace; run names its own"),
    # -- cgroup --------------------------------------------------------------
    (RUNC, ANY, "cgroup", r"^~\S* true -> false$",
     "runc on this cgroup v1 host makes no cgroup namespace (podman asks for none on v1)"),
    # -- /dev and the device filter ----------------------------------------
    (RUNC, ANY, "dev", r"^-core -> /proc/kcore$", "runc makes no /dev/core link"),
    ({"podman-hook"}, ("root",), "device-filter", r"^~nvidia[-a-z0-9]* ENXIO -> EPERM$",
     "the runtime applies the device cgroup before hooks run: a hook adds nodes, not rules "
     "(docs/hook.md: use the wrapper or the filter)"),
    # -- mounts ------------------------------------------------------------
    ({"run-cdi"}, ANY, "mounts",
     r"^(-/etc/ld\.so\.cache |-/proc/driver[ /]|\+/usr/lib/x86_64-linux-gnu/lib\S+\.so(\.\d+)? )",
     "a CDI spec's containerEdits are the whole injection (docs/cdi.md): its SONAME and .so "
     "links are mounts of their own, and it has no /proc/driver views and no loader-cache "
     "hook on this host (the toolkit's would run nvidia-cdi-hook)"),
    (PODMAN, ANY, "mounts", r"^~/ ",
     "podman hands a writable root.path (its --rootfs) that runc uses as it is; run's root "
     "is a read-only overlay of the image"),
    (PODMAN, ANY, "mounts", r"^~/data opts ",
     "podman's -v has no nosuid,nodev unless asked; run makes every -v nosuid,nodev"),
    (PODMAN, ANY, "mounts",
     r"^(\+/dev/mqueue|\+/etc/(hostname|hosts|resolv\.conf)|\+/run/\.containerenv|"
     r"[~+]/dev/shm|\+/sys/(dev/block|kernel|fs/cgroup/|firmware|devices)|\+/proc/)",
     "podman's config.json mounts (hosts, resolv.conf, hostname, .containerenv, mqueue, its "
     "/dev/shm) and masked paths"),
    (PODMAN, ANY, "mounts", r"^[-+]" + _DRIVER,
     "the OCI doors inject the driver where the edits of a written-through root put it "
     "(/run/gpusandbox, docs/runtime.md), run binds it into the read-only image's own paths"),
    (RUNC, ANY, "mounts",
     r"^([-~]/dev(/| )|[-~]/(tmp|run|sys|proc|etc/ld\.so\.cache)( |/)|\+/sys/fs/cgroup/|"
     r"-/sys/fs/cgroup#)",
     "runc builds /dev, /proc, /sys and the cgroup mounts as podman's config.json asks "
     "(its own /dev tmpfs and nodes, no private /tmp or /run, the v1 cgroup hierarchies)"),
    ({"podman-oci", "oci-exec"}, ("root",), "mounts", r"^~/sys/fs/cgroup type cgroup2 -> tmpfs$",
     "as root on a hybrid host the OCI runtime gives the container a leaf in every v1 "
     "hierarchy, as runc does, and shows runc's layout (a tmpfs of the v1 hierarchies, "
     "cgroup2 at unified); run makes its cgroup2 leaf alone unless a limit needs v1 "
     "(docs/oci.md, Resources and cgroups)"),
]

# (doors, modes, aspect, pattern, the bug on today's main): strict xfails.
BUGS = [
]


def _match(table, door, mode, aspect, diff):
    for doors, modes, asp, pat, why in table:
        if door in doors and mode in modes and asp == aspect and re.search(pat, diff):
            return why
    return None


def _params():
    out = []
    for door, (_fn, modes, _why) in DOORS.items():
        if door == "run-dir":
            continue
        for mode in modes:
            for aspect in ASPECTS:
                bugs = [why for doors, ms, asp, _p, why in BUGS
                        if door in doors and mode in ms and asp == aspect]
                marks = [pytest.mark.xfail(strict=True, reason=bugs[0])] if bugs else []
                out.append(pytest.param(door, mode, aspect, marks=marks,
                                        id=f"{door}-{mode}-{aspect}"))
    return out


@pytest.fixture(scope="session")
def world(cli, sim_host, test_user, registry):  # noqa: F811 (fixture)
    top = tempfile.mkdtemp(prefix="gsbx-test-parity-", dir="/tmp")
    os.chmod(top, 0o755)
    w = World(top, sim_host, test_user, registry)
    try:
        w.build()
        w.reports = {}
        yield w
    finally:
        w.cleanup()
        shutil.rmtree(top, ignore_errors=True)


def report(world, door, mode):
    """One launch per door and mode per worker, its report kept."""
    key = (door, mode)
    if key not in world.reports:
        try:
            world.reports[key] = report_of(DOORS[door][0](world, mode))
        except AssertionError as e:
            world.reports[key] = e
    got = world.reports[key]
    if isinstance(got, AssertionError):
        pytest.fail(f"{door} ({mode}) did not run the probe: {got}", pytrace=False)
    return got


@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_reference_is_the_workload(world, mode):
    """`run DIR` gives what the workload asks for, so the doors are compared
    with a sandbox that is right: GPUs 0 and 1 past the device filter
    (ENXIO: no driver behind the simulated nodes), no other GPU, the bind,
    the env, the user, seccomp and no_new_privs."""
    r = report(world, "run-dir", mode)
    assert r["gpu"] == {n: "ENXIO" for n in ("nvidia-uvm", "nvidia-uvm-tools", "nvidia0",
                                             "nvidia1", "nvidiactl")}, r["gpu"]
    assert r["dev"]["nvidia0"] == "c 195:0" and "nvidia2" not in r["dev"]
    assert r["bind"] == {"read": "hello from the bind\n", "writable": True}
    assert (r["env"]["PARITY"], r["env"]["SLURM_JOB_NAME"]) == ("workload", "parity")
    uid = 4321 if mode == "root" else world.user.pw_uid
    assert (r["ids"]["uid"], r["ids"]["euid"]) == (uid, uid)
    assert r["status"]["Seccomp"] == "2" and r["status"]["NoNewPrivs"] == "1"
    assert r["status"]["CapEff"] == "0000000000000000"
    if mode == "root":
        assert r["env"]["HOME"] == "/home/parity"    # docker's rule: the image's passwd


@pytest.mark.parametrize("door,mode,aspect", _params())
def test_door_parity(world, door, mode, aspect):
    ref = report(world, "run-dir", mode)
    got = report(world, door, mode)
    diffs = aspect_diffs(aspect, ref, got)
    bugs = [d for d in diffs if _match(BUGS, door, mode, aspect, d)]
    unexplained = [d for d in diffs if not _match(ALLOWED, door, mode, aspect, d)
                   and d not in bugs]
    assert not unexplained, f"{door} ({mode}) differs from run DIR in {aspect}:\n" + \
        "\n".join(unexplained)
    assert not bugs, f"known bug(s) of {door} ({mode}) in {aspect}:\n" + "\n".join(bugs)


def test_every_door_is_compared():
    """A door added to parity_doors.DOORS is compared; a door that leaves a
    mode out says why."""
    for door, (_fn, modes, why) in DOORS.items():
        assert modes == ("root", "rootless") or why, door
    assert "run-dir" in DOORS       # the reference
