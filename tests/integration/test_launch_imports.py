"""The launch path stays lean (issue 24, "A lean launch path"): the modules a
real rootless `gpusandbox run --gpus 0,1` on the simulated host imports,
counted with `python -X importtime` as scripts/bench's profile counts them,
beyond those the same interpreter imports for `-c pass`.  Both processes
write to the same stderr (the sandbox's init is a fork of the launcher), so
a module each of them imports counts twice, as it costs twice.

The assertions are on the module set and its size, never on time: the time
is scripts/bench's (docs/bench.md, "A lean launch path")."""
import subprocess

from .conftest import VENV

PYTHON = str(VENV / "bin" / "python3")

# Issue 24's target is 35, which LIMIT now is: a module added to the launch
# path fails here until another is taken off (docs/bench.md).
LIMIT = 35

# Each of these is heavy or compiles at import, and the launch does not need
# it: whatever would pull one in must import it where it is used.
NOT_ON_THE_PATH = {
    "json", "re", "subprocess", "argparse", "enum", "signal", "socket", "tempfile",
    "shutil", "hashlib", "threading", "typing", "dataclasses", "functools", "collections",
    "pwd", "fcntl", "termios",
    "select",                        # no terminal, no start to report: the launcher takes
                                     # its signals with sigwaitinfo (stages/parent._supervise)
    "ctypes", "struct",              # linux/sys.py's types are _ctypes', its structs _struct's
    "gpusandbox.linux.idmap",        # a one-id map is written by linux/sys.write_single:
                                     # idmap.py is for full maps (plan.py loads it then)
    "gpusandbox.__main__",           # bin/gpusandbox calls cli.run_and_exit itself
    "gpusandbox.linux.net",          # only with a private network (root's default)
    "gpusandbox.mountopt",           # no -v or --mount
    "gpusandbox.profile",            # no --profile
    "gpusandbox.image",              # IMAGE is a directory
    "gpusandbox.hpc",                # no Slurm, no pod
    "gpusandbox.oci",                # not an OCI door
    "gpusandbox.gpu.share",          # no --gpu-memory / --gpu-compute
    "gpusandbox.gpu.ceiling",        # the image names no CUDA requirement
    "gpusandbox.linux.reaper",       # rootless: no cgroup leaf to reap
    "gpusandbox.linux.bpfdev",       # rootless: no device filter
    "gpusandbox.linux.cgempty",      # rootless: no leaf to empty
    "gpusandbox.linux.cgroup",       # rootless, no limits, the caller's cgroup not
    "gpusandbox.linux.cgfs",         # delegated: no leaf to make (linux.cgplace decides
                                     # and holds the handle; stages/parent.py asks it first)
    "gpusandbox.linux.cgroupres",    # no --memory, --pids-limit, --cpus: no limits
    "gpusandbox.linux.cgroupv1",     # no limits: no v1 leaf
    "gpusandbox.linux.seccompbpf",   # the shipped program (linux.seccomp loads the
                                     # compiler only on a miss)
    "zlib",                          # the kept program's check is linux.seccomp._sum
    "gpusandbox.settings",           # nothing configured and --driver-root given: no
                                     # key to read (settingswhere.configured)
    "gpusandbox.siterun",            # no site or user file, no GPUSANDBOX_* variable
    "gpusandbox.conffile",           # (settingswhere.configured): every key its default
    "gpusandbox.sitehooks",          # and no site hooks directory
    "gpusandbox.fabric.discover",    # no --fabric and no fabric variable, and the
    "gpusandbox.fabric.select",      # host has no fabric adapter (plandev.has_adapters):
    "gpusandbox.fabric.inject",      # the default request gives nothing, no /sys view
    "gpusandbox.fabric.sysview",     # either
    "gpusandbox.gpu.require",        # the image asks for nothing (gpu/__init__.requirements)
    "gpusandbox.stages.ocisetup",    # no hooks, sysctls, domain name, OCI life
                                     # (LaunchPlan.container_settings)
    "gpusandbox.planfabric",         # folded into plandev
    "gpusandbox.fabric",             # its caller variables and adapter classes are
                                     # gpusandbox.gpu's (FABRIC_CALLER_VARS, _NIC_CLASSES)
    "gpusandbox.gpu.compat",         # the image has no /usr/local/cuda/compat
                                     # (gpu.compat_absent decides as compat.decide would)
    "gpusandbox.netdefault",         # folded into plan (resolve_net)
    "gpusandbox.rundir",             # the MPS pipe directory's check is linux/host's
                                     # trusted_dir; the launch finds no runtime directory
}


def _imports(argv, user):
    p = subprocess.run(["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                        "--clear-groups", "--", PYTHON, "-X", "importtime", *argv],
                       capture_output=True, text=True, timeout=60, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/"})
    names = [line.rsplit("|", 1)[1].strip() for line in p.stderr.splitlines()
             if line.startswith("import time:") and line.count("|") == 2]
    return p, names[1:]    # the first row is the table's header


def test_a_rootless_gpu_launch_imports_no_more_than_the_limit(cli, test_user, sim_host,
                                                              small_rootfs):
    p, startup = _imports(["-c", "pass"], test_user)
    assert p.returncode == 0 and "encodings" in startup, p.stderr
    p, launch = _imports([cli, "run", "--driver-root", sim_host.root, "--gpus", "0,1",
                          str(small_rootfs), "/bin/true"], test_user)
    assert p.returncode == 0, p.stderr
    beyond = [m for m in launch if m not in set(startup)]
    # The launch did the work the count is about: GPUs selected and injected,
    # in a sandbox with its own init.
    for m in ("gpusandbox.gpu.select", "gpusandbox.gpu.inject", "gpusandbox.stages.init"):
        assert m in beyond, beyond
    loaded = {".".join(m.split(".")[:i]) for m in beyond for i in (1, 2, 3)}
    assert sorted(loaded & NOT_ON_THE_PATH) == []
    assert len(beyond) <= LIMIT, f"{len(beyond)} modules: {beyond}"
