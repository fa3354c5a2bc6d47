"""The host's MPI and rdma-core in a sandbox (issue 29, docs/fabric.md),
root and rootless.

The image carries its own MPICH-ABI build: a small libmpich.so.12 (version
12.1.0, one process and no peers) that says who it is, beside a hello world
compiled with Debian's mpicc.mpich.  With --mpi host the same program runs
on the host's MPICH 4 (libmpich.so.12.2.2) and its UCX, resolved by the
loader through the sandbox's regenerated cache, and two ranks started by
the host's mpiexec exchange a message.  An image built against Open MPI
(libmpi.so.40) is refused with the mismatch named."""
import os
import shutil
import subprocess
import tempfile

import pytest

MPICH = "/usr/lib/x86_64-linux-gnu/libmpich.so.12"
OPENMPI = "/usr/lib/x86_64-linux-gnu/libmpi.so.40"
HAVE_MPI = pytest.mark.skipif(
    not (os.path.exists(MPICH) and os.path.exists(OPENMPI) and shutil.which("mpicc.mpich")
         and shutil.which("mpicc.openmpi") and shutil.which("mpiexec.mpich")),
    reason="needs Debian's MPICH and Open MPI (scripts/test's package list: mpich, "
           "libmpich-dev, openmpi-bin, libopenmpi-dev)")
pytestmark = HAVE_MPI
PROVIDERS = "/usr/lib/x86_64-linux-gnu/libibverbs"

HELLO = r"""
#include <mpi.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv)
{
    int rank, size, len;
    char msg[64] = "", lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_library_version(lib, &len);
    printf("rank %d of %d: %.20s\n", rank, size, lib);
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
# Another MPICH-ABI build, as an image carries it: the MPICH ABI's integer
# handles, one process, and a version string of its own.
STUB = r"""
#include <string.h>
int MPI_Init(int *argc, char ***argv) { (void)argc; (void)argv; return 0; }
int MPI_Comm_rank(int comm, int *rank) { (void)comm; *rank = 0; return 0; }
int MPI_Comm_size(int comm, int *size) { (void)comm; *size = 1; return 0; }
int MPI_Get_library_version(char *v, int *len)
{ strcpy(v, "image's MPICH 12.1.0"); *len = (int)strlen(v); return 0; }
int MPI_Send(const void *b, int n, int t, int d, int tag, int c) { return 0; }
int MPI_Recv(void *b, int n, int t, int s, int tag, int c, void *st) { return 0; }
int MPI_Finalize(void) { return 0; }
"""
LIBDIR = "usr/lib/x86_64-linux-gnu"


def build_images(rootfs, base):
    """{"mpich": image dir, "openmpi": image dir} under base: copies of rootfs
    with /hello built by each MPI's mpicc, the MPICH one carrying its own stub
    libmpich.so.12.1.0, the Open MPI one a copy of the host's libmpi.so.40."""
    src = os.path.join(base, "src")
    os.mkdir(src)
    with open(os.path.join(src, "hello.c"), "w") as f:
        f.write(HELLO)
    with open(os.path.join(src, "stub.c"), "w") as f:
        f.write(STUB)
    out = {}
    for name, cc in (("mpich", "mpicc.mpich"), ("openmpi", "mpicc.openmpi")):
        img = os.path.join(base, name)
        subprocess.run(["cp", "-a", str(rootfs), img], check=True)
        subprocess.run([cc, os.path.join(src, "hello.c"), "-o", os.path.join(img, "hello")],
                       check=True, capture_output=True)
        out[name] = img
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libmpich.so.12",
                    os.path.join(src, "stub.c"), "-o",
                    os.path.join(out["mpich"], LIBDIR, "libmpich.so.12.1.0")], check=True)
    shutil.copy(os.path.realpath(OPENMPI), os.path.join(out["openmpi"], LIBDIR))
    for img in out.values():
        subprocess.run(["ldconfig", "-r", img], check=True)
    return out


@pytest.fixture(scope="module")
def images(rootfs):
    base = tempfile.mkdtemp(prefix="gsbx-test-mpi-")
    os.chmod(base, 0o755)
    yield build_images(rootfs, base)
    shutil.rmtree(base, ignore_errors=True)


def test_host_mpich_replaces_the_images_build(runner, images):
    r = runner.run([images["mpich"], "/hello"])
    assert (r.returncode, r.stdout) == (0, "rank 0 of 1: image's MPICH 12.1.0\n"), r.stderr
    r = runner.run(["--mpi", "host", "--verbose", images["mpich"], "/hello"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("rank 0 of 1: MPICH Version:"), r.stdout
    assert ("gpusandbox: mpi: the image's libmpich.so.12 is the host's "
            f"{os.path.realpath(MPICH)}") in r.stderr
    # What the image lacks of the host MPI's closure comes from the host, said once each.
    assert "gpusandbox: --mpi host: libucp.so.0 is the host's" in r.stderr
    # UCX's transports are plugins beside libucs: its IB transport comes with it (and
    # the host's libibverbs it needs brings the providers).
    r = runner.run(["--mpi", "host", "-e", "UCX_LOG_LEVEL=debug", images["mpich"], "/hello"])
    assert r.returncode == 0, r.stderr
    assert "ucs library path: /run/gpusandbox/fabric/lib/libucs.so.0" in r.stdout + r.stderr
    assert "loading modules for uct_ib" in r.stdout + r.stderr


def test_two_ranks_through_the_host_mpi(runner, images):
    """The host's mpiexec starts two sandboxes; PMI reaches each through its
    inherited PMI_FD, and the pod (--share node) gives them one /dev/shm."""
    cmd = runner.argv(["--share", "node", "--net", "host", "--mpi", "host", images["mpich"],
                       "/hello"])
    cut = cmd.index(runner.cli)
    cmd = cmd[:cut] + ["mpiexec.mpich", "-n", "2"] + cmd[cut:]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/",
                       env=runner.env({"GPUSANDBOX_POD": f"fabric-mpi-{runner.mode}"}))
    assert r.returncode == 0, r.stderr
    lines = sorted(r.stdout.splitlines())
    assert len(lines) == 3, r.stdout
    assert lines[0].startswith("rank 0 of 2: MPICH Version:"), r.stdout
    assert lines[1] == "rank 0 received: greetings from rank 1 of 2", r.stdout
    assert lines[2].startswith("rank 1 of 2: MPICH Version:"), r.stdout


def test_open_mpi_image_is_refused(runner, images):
    r = runner.run(["--mpi", "host", images["openmpi"], "/hello"])
    assert r.returncode == 125 and r.stdout == ""
    assert r.stderr.splitlines()[0] == (
        "gpusandbox: error: --mpi host: the image's libmpi.so.40 is not ABI-compatible with the "
        "host's libmpich.so.12: SONAME major 40 (image) != 12 (host) (the image carries Open "
        "MPI, not the MPICH ABI)"), r.stderr


def test_strict_compatibility_names_both_versions(runner, images):
    r = runner.run(["--mpi", "host", images["mpich"], "/hello"],
                   env={"GPUSANDBOX_MPI_COMPAT": "strict"})
    assert r.returncode == 125
    assert r.stderr.splitlines()[0].startswith(
        "gpusandbox: error: --mpi host (strict): the image's libmpich.so.12 is 12.1.0, the "
        "host's libmpich.so.12 12.2.2"), r.stderr


@pytest.mark.skipif(not os.path.isdir(PROVIDERS), reason="needs the host's rdma-core "
                    "(ibverbs-providers, librdmacm1 in scripts/test's package list)")
def test_host_verbs_libraries_resolve_in_the_sandbox(runner, images):
    """--fabric-libs host: the image has no rdma-core; the loader finds the
    host's libibverbs and librdmacm, and the provider directory is the host's."""
    probe = ("import ctypes\n"
             "for n in ('libibverbs.so.1', 'librdmacm.so.1', 'libmlx5.so.1'):\n"
             "    ctypes.CDLL(n)\n"
             "print(sorted({l.split()[-1] for l in open('/proc/self/maps')\n"
             "              if 'libibverbs' in l or 'librdmacm' in l}))\n")
    r = runner.run([images["mpich"], "python3", "-c", probe])
    assert r.returncode != 0 and "libibverbs.so.1: cannot open shared object file" in r.stderr
    r = runner.run(["--fabric-libs", "host", images["mpich"], "sh", "-c",
                    "ls /usr/lib/x86_64-linux-gnu/libibverbs | grep -c rdmav; python3 -c \"$0\"",
                    probe])
    assert r.returncode == 0, r.stderr
    count, maps = r.stdout.splitlines()
    assert int(count) == len([n for n in os.listdir(PROVIDERS)
                              if n.endswith(".so")])
    assert all(p.startswith("/run/gpusandbox/fabric/lib/") for p in eval(maps)), maps


LIST_VERBS = ("import ctypes\n"
              "l = ctypes.CDLL('libibverbs.so.1')\n"
              "n = ctypes.c_int()\n"
              "l.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)\n"
              "l.ibv_get_device_name.restype = ctypes.c_char_p\n"
              "l.ibv_get_device_name.argtypes = [ctypes.c_void_p]\n"
              "devs = l.ibv_get_device_list(ctypes.byref(n))\n"
              "print(' '.join(l.ibv_get_device_name(devs[i]).decode() for i in range(n.value)))\n")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(PROVIDERS), reason="needs the host's rdma-core")
def test_host_libibverbs_lists_only_the_tasks_hca(runner, images, cli):
    """The host's libibverbs in the sandbox, reading the simulated host's
    sysfs (SYSFS_PATH: this kernel has no RDMA netlink to ask), lists the
    HCA beside the task's GPU and none of the seven others: it skips a
    device whose /dev/infiniband/uverbsN the sandbox lacks, so what it
    lists is what the launcher really put there."""
    base = tempfile.mkdtemp(prefix="gsbx-test-verbs-", dir="/tmp")
    os.chmod(base, 0o755)
    root = os.path.join(base, "host")
    try:
        r = subprocess.run([cli, "sim", "create", root, "--gpus", "8", "--hcas", "8"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        r = runner.run(["--driver-root", root, "--gpus", "device=6", "--fabric-libs", "host",
                        "-v", f"{root}/sys:/simsys:ro", "-e", "SYSFS_PATH=/simsys",
                        images["mpich"], "python3", "-c", LIST_VERBS])
        assert (r.returncode, r.stdout) == (0, "mlx5_6\n"), r.stderr
    finally:
        subprocess.run([cli, "sim", "destroy", root], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
