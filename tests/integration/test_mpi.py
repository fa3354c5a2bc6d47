"""A real MPI program launched by srun, one sandbox per rank (Open MPI over PMIx).

    OMPI_MCA_btl=self,tcp srun --mpi=pmix -n 2 gpusandbox run IMAGE /hello

Each rank is its own sandbox, so the ranks reach each other only the way two
hosts would: PMIx wire-up through the slurmstepd server's socket directory
(PMIX_SERVER_TMPDIR, bound at the same path by the launcher) and TCP on the
shared network namespace.  Open MPI's shared-memory BTL (vader) cannot work
between sandboxes: every sandboxed command is pid 2 in its own pid namespace,
and opal's shmem attach takes "creator pid == getpid()" to mean "my own
segment" and reuses the peer's pointer (a segfault in mca_btl_vader_sendi).
Hence btl self,tcp, passed through as an OMPI_* job variable.

The image is a base rootfs (scripts/mkrootfs) plus the program, the Open MPI
and PMIx runtime (libraries, MCA components, help and parameter files) and
their shared-library closure, copied from the host: nothing of the host's /usr
is bound in.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.integration import slurm_fixture as sf

pytestmark = pytest.mark.slurm

MPICC = "mpicc.openmpi"
# What Slurm's mpi/pmix_v4 plugin dlopens (libpmix-dev); slurmd must find it when it starts.
LIBPMIX = "/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so"
# Files Open MPI and PMIx open at run time besides the linked libraries.
RUNTIME_TREES = ("/usr/lib/x86_64-linux-gnu/openmpi", "/usr/lib/x86_64-linux-gnu/pmix2",
                 "/usr/share/openmpi", "/usr/share/pmix", "/etc/openmpi")
PKGS = "openmpi-bin libopenmpi-dev"

HELLO = r"""
#include <mpi.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    int rank, size;
    char msg[64] = "";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    printf("rank %d of %d\n", rank, size);
    fflush(stdout);
    if (rank == 1) {
        snprintf(msg, sizeof msg, "greetings from rank %d of %d", rank, size);
        MPI_Send(msg, (int)strlen(msg) + 1, MPI_CHAR, 0, 7, MPI_COMM_WORLD);
    } else if (rank == 0 && size > 1) {
        MPI_Recv(msg, sizeof msg, MPI_CHAR, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        printf("rank 0 received: %s\n", msg);
    }
    MPI_Finalize();
    return 0;
}
"""


def _libs_of(path):
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    return [tok for line in out.splitlines() for tok in line.split() if tok.startswith("/")]


def _copy_in(src, root):
    """Copy host file `src` to the same path under `root`, keeping a symlinked
    name as a symlink to the copied target."""
    real = os.path.realpath(src)
    dst, dst_real = root + src, root + real
    os.makedirs(os.path.dirname(dst_real), exist_ok=True)
    if not os.path.lexists(dst_real):
        shutil.copy2(real, dst_real)
    if src != real and not os.path.lexists(dst):
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.symlink(real, dst)


def build_image(root, program):
    """mkrootfs base + /hello + the MPI runtime and its library closure."""
    subprocess.run([os.path.join(sf.REPO, "scripts", "mkrootfs"), root, "--no-python"],
                   check=True, capture_output=True)
    shutil.copy2(program, os.path.join(root, "hello"))
    elves = [program]
    for tree in RUNTIME_TREES:
        for dirpath, _, names in os.walk(tree):
            for name in names:
                path = os.path.join(dirpath, name)
                if name.endswith(".a") or name.endswith(".la"):
                    continue
                _copy_in(path, root)
                if ".so" in name and not os.path.islink(path):
                    elves.append(path)
    seen = set()
    for elf in elves:
        for lib in _libs_of(elf):
            if lib not in seen:
                seen.add(lib)
                _copy_in(lib, root)
    subprocess.run(["ldconfig", "-r", root], check=True)


def mpi_testbed(cli, base, image, plugin="pmix", **testbed):
    """The Slurm testbed on a one-GPU simulated host made under `base`, for
    ranks of `image` started by `cli`; skips where Slurm or its mpi/`plugin`
    is missing.  The caller stops it."""
    sim = os.path.join(base, "sim")
    r = subprocess.run([sys.executable, "-m", "gpusandbox.sim", "create", sim,
                        "--gpus", "1"], cwd=sf.REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    try:
        bed = sf.slurm_testbed(base, sim, constrain=False, **testbed)
    except sf.TestbedUnavailable as e:
        pytest.skip(f"Slurm testbed unavailable: {e}")
    plugins = bed.run(["srun", "--mpi=list"], timeout=20)
    if plugin not in plugins.stdout + plugins.stderr:
        bed.stop()
        pytest.skip(f"this Slurm has no mpi/{plugin} plugin (srun --mpi=list)")
    bed.cli, bed.image = cli, image
    return bed


# --- fixtures ------------------------------------------------------------------

@pytest.fixture(scope="module")
def mpi_bed(cli, workdir_base):
    """Testbed, simulated GPU host and MPI image in one world-readable temp dir."""
    missing = [what for what, ok in ((MPICC, shutil.which(MPICC)),
                                     (LIBPMIX, os.path.exists(LIBPMIX))) if not ok]
    if missing:
        pytest.skip(f"Open MPI/PMIx not installed ({', '.join(missing)} missing): "
                    f"apt-get install -y --no-install-recommends {PKGS}")
    base = tempfile.mkdtemp(prefix="mpi-", dir=workdir_base)
    os.chmod(base, 0o755)
    bed = None
    try:
        src = os.path.join(base, "hello.c")
        with open(src, "w") as f:
            f.write(HELLO)
        prog = os.path.join(base, "hello")
        r = subprocess.run([MPICC, "-O2", "-o", prog, src], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        image = os.path.join(base, "image")
        build_image(image, prog)
        bed = mpi_testbed(cli, base, image)
        yield bed
    finally:
        if bed is not None:
            bed.stop()
        shutil.rmtree(base, ignore_errors=True)


# --- tests ---------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["root", "rootless"])
def test_mpi_hello_world_across_two_sandboxed_ranks(mpi_bed, mode, test_user):
    user = test_user if mode == "rootless" else None
    # Ranks talk TCP (btl tcp): a root command gets a private network namespace
    # per sandbox unless --net host; rootless ones share the host's by default.
    net = ["--net", "host"] if mode == "root" else []
    r = mpi_bed.srun(["--mpi=pmix", "--ntasks=2", "--label",
                      mpi_bed.cli, "run", *net, mpi_bed.image, "/hello"],
                     env={"OMPI_MCA_btl": "self,tcp"}, user=user, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "0: rank 0 of 2" in lines, r.stdout
    assert "1: rank 1 of 2" in lines, r.stdout
    assert "0: rank 0 received: greetings from rank 1 of 2" in lines, r.stdout
