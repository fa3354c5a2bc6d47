"""What every doctor section shares: the check record, the roots the checks
read, the options, and a tolerant file reader."""
import attrs


PASS, WARN, FAIL = "pass", "warn", "fail"
# The PATH the launcher runs newuidmap/newgidmap with (gpusandbox.linux.idmap).
HELPER_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


@attrs.define
class Check:
    section: str
    name: str
    status: str
    detail: str
    fix: str = ""


@attrs.define
class Roots:
    """Where the checks read the kernel's and the system's files.  /sys is
    reached only through the mount points /proc/self/mountinfo names."""
    proc: str = "/proc"
    etc: str = "/etc"


@attrs.define
class Options:
    gpus: str = "all"
    driver_root: str = "/"
    dev_root: str = None
    image: str = None
    userns: str = "auto"
    roots: Roots = attrs.Factory(Roots)
    probes: bool = True       # the overlay probe and the sandbox runs
    mpi: bool = False         # --mpi: the MPI/NCCL section only (doctor/mpi.py)
    share: str = None         # --share for the MPI section (default: as `run` chooses)
    net: str = None           # --net the ranks will use


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None
