"""Creating and destroying a simulated host in DIR, refusing any directory
it did not make."""
import json
import os
import re
import shutil

from gpusandbox.errors import GpuError, UsageError

from .build import build
from .ids import DEFAULT_MODEL, gpu_uuid, mig_minor, mig_uuid, parse_mig
from .install import install, ldconfig, world_readable
from . import fabric
from .kernel import _node as node, write_dev, write_proc
from .layout import BUILD, CAPS_MAJOR, LIBDIR, MARKER, NVIDIA_MAJOR, UVM_MAJOR, write

_VERSION_RE = re.compile(r"^\d{2,4}(\.\d{1,4}){1,3}$")


def _check_target(root):
    if os.geteuid() != 0:
        raise GpuError(f"cannot create a simulated GPU host in {root}",
                       "the simulated host needs root for real device nodes (mknod)",
                       hint="run `gpusandbox sim create` as root once; the tree is then usable by everyone")
    probe = root
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if os.statvfs(probe).f_flag & os.ST_NODEV:
        raise GpuError(f"cannot create a simulated GPU host in {root}",
                       "its filesystem is mounted nodev, so its device nodes could never be opened",
                       hint="pick a directory on a filesystem mounted without nodev (e.g. under /var/tmp)")
    created = not os.path.exists(root)
    if created:
        os.makedirs(root, mode=0o755)
    elif os.path.isfile(os.path.join(root, MARKER)):
        _refuse_mounts_below(root)
        created = _marker_created(os.path.join(root, MARKER))
        _remove_contents(root, keep=BUILD)
    elif not os.path.isdir(root) or os.listdir(root):
        raise UsageError(f"cannot create a simulated GPU host in {root}",
                         "it exists and is not an empty directory or an earlier simulated host",
                         hint="pick a new or empty directory")
    os.chmod(root, 0o755)
    return created


def create(root, gpus=4, driver_version="550.54.15", cuda_version="12.4", model=DEFAULT_MODEL,
           mig=None, uvm=True, pad_ldcache=0, lib_version=None, hcas=0, link="ib",
           gpudirect=False, nvswitches=0, imex_channels=0, cxis=0):
    """Write a simulated host into `root`; return a JSON-able description of it."""
    root = os.path.abspath(root)
    lib_version = lib_version or driver_version
    for name, value in (("--driver-version", driver_version), ("--lib-version", lib_version)):
        if not _VERSION_RE.match(value):
            raise UsageError(f"bad {name} {value!r}", "expected a driver version such as 550.54.15")
    if not re.match(r"^\d+\.\d$", cuda_version):
        raise UsageError(f"bad --cuda-version {cuda_version!r}", "expected MAJOR.MINOR such as 12.4")
    if not 0 <= gpus <= 32:
        raise UsageError(f"bad --gpus {gpus}", "the driver handles 0 to 32 GPUs")
    if not 0 <= pad_ldcache <= 100000:
        raise UsageError(f"bad --pad-ldcache {pad_ldcache}", "expected 0 to 100000")
    instances, profiles = parse_mig(mig, gpus, model)
    fabric.check(hcas, link, nvswitches, imex_channels, cxis)
    created = _check_target(root)
    info = {"root": root, "dev_root": os.path.join(root, "dev"), "driver_version": driver_version,
            "lib_version": lib_version, "cuda_version": cuda_version,
            "cuda_driver_version": int(cuda_version.split(".")[0]) * 1000 + int(cuda_version.split(".")[1]) * 10,
            "majors": {"nvidia": NVIDIA_MAJOR, "nvidia-uvm": UVM_MAJOR if uvm else None,
                       "nvidia-caps": CAPS_MAJOR},
            "libdir": os.path.join(root, LIBDIR), "created_dir": created, "gpus": [],
            "fabric": fabric.describe(gpus, hcas, link, gpudirect, nvswitches,
                                      imex_channels, cxis)}
    write(os.path.join(root, MARKER), json.dumps({"created_dir": created}))
    try:
        for i in range(gpus):
            uuid = gpu_uuid(root, i)
            info["gpus"].append({
                "index": i, "minor": i, "model": model, "uuid": uuid, "bus_id": fabric.gpu_bdf(i),
                "mig": [{"gi": gi, "ci": ci, "profile": profiles[i][gi], "uuid": mig_uuid(uuid, gi, ci),
                         "gi_minor": mig_minor(i, gi), "ci_minor": mig_minor(i, gi, ci)}
                        for gi, ci in instances.get(i, [])]})
        built = build(root, lib_version, info["cuda_driver_version"], profiles)
        write_proc(root, info, uvm)
        write_dev(root, info, uvm)
        fabric.write_sys(root, gpus, info["fabric"])
        fabric.write_dev(root, info["fabric"], node)
        install(root, info, built, pad_ldcache)
        ldconfig(root)
        world_readable(root)
    except BaseException:
        destroy(root)
        raise
    write(os.path.join(root, MARKER), json.dumps(info, indent=1) + "\n")
    return info


def destroy(root):
    """Remove a simulated host made by create(); refuse any other directory."""
    root = os.path.abspath(root)
    marker = os.path.join(root, MARKER)
    if not os.path.isfile(marker) or os.path.islink(marker):
        raise UsageError(f"refusing to remove {root}", "it is not a simulated GPU host (no marker file)",
                         hint="only directories made by `gpusandbox sim create` can be destroyed")
    created = _marker_created(marker)
    _refuse_mounts_below(root)
    _end_programs_of(root)
    _remove_contents(root)
    if created:
        os.rmdir(root)


def _end_programs_of(root):
    """SIGKILL the processes running the simulated host's own programs (its
    MPS control daemons, started by `mps up` or a --gpu-memory launch of any
    user, outlive every launch): a host that is gone leaves none running.
    A program is the host's when its argv[0], or the script its interpreter
    runs (argv[1]), lies under root.  Others' processes need root; without
    it they are left (EPERM)."""
    import signal
    import time
    prefix = os.fsencode(root) + b"/"
    ours = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read(65536).split(b"\0")[:2]
        except OSError:
            continue
        if any(a.startswith(prefix) for a in argv):
            try:
                os.kill(int(d), signal.SIGKILL)
                ours.append(int(d))
            except OSError:
                pass
    deadline = time.monotonic() + 5
    while ours and time.monotonic() < deadline:
        ours = [p for p in ours if _alive(p)]
        time.sleep(0.02)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _marker_created(marker):
    try:
        with open(marker) as f:
            return bool(json.load(f).get("created_dir"))
    except (OSError, ValueError, AttributeError):
        return False


def _refuse_mounts_below(root):
    """shutil.rmtree would descend into a filesystem mounted below root and empty it."""
    with open("/proc/self/mountinfo") as f:
        below = [p for p in (_unescape(line.split()[4]) for line in f) if p.startswith(root + "/")]
    if below:
        raise GpuError(f"refusing to remove {root}", f"{below[0]} is mounted below it",
                       hint=f"unmount it first (umount {below[0]})")


def _unescape(field):
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _remove_contents(root, keep=None):
    for name in os.listdir(root):
        if name in (keep, MARKER):
            continue
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    os.unlink(os.path.join(root, MARKER))
