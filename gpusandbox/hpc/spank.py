"""`gpusandbox slurm install-plugin`: build the SPANK plugin (pyxis's
`--container-image` options for srun, salloc and sbatch; spank_gpusandbox.c)
against this node's Slurm headers, write its task program next to it, and
print the plugstack.conf line.

The plugin must be built against the Slurm release that loads it (slurmstepd
refuses another: "Incompatible plugin version"), so it is compiled here, on
the cluster, from the C source shipped in the package, with the headers of
libslurm-dev (Debian) or slurm-devel.  Run it once per Slurm upgrade; both the
login and the compute nodes load the plugin, so DIR must be on a filesystem
they all see (the default, next to this installation, is when the venv is)."""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from ..errors import UsageError

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spank_gpusandbox.c")
PLUGIN = "spank_gpusandbox.so"
TASK = "gpusandbox-spank-task"
CFLAGS = ["-std=gnu99", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror"]

HELP = """usage: gpusandbox slurm install-plugin [--dir DIR] [--include DIR] [--cc CC]
                                      [--execute-entrypoint]

Build the SPANK plugin that gives srun, salloc and sbatch pyxis's options
(--container-image, --container-mounts, ...; docs/slurm.md) and print the line
to add to plugstack.conf on every node.
"""


def default_dir():
    return os.path.join(sys.prefix, "lib", "gpusandbox", "slurm")


def _parser():
    p = argparse.ArgumentParser(prog="gpusandbox slurm", description=HELP.split("\n\n", 1)[1])
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    i = sub.add_parser("install-plugin", help="build the SPANK plugin, print plugstack.conf's line",
                       description="compile spank_gpusandbox.so against slurm/spank.h, write "
                                   "its task program beside it, print the plugstack.conf line")
    i.add_argument("--dir", default=None,
                   help="where to write the plugin and its task program (default: "
                        "<prefix>/lib/gpusandbox/slurm of this installation)")
    i.add_argument("--include", default="/usr/include",
                   help="the directory holding slurm/spank.h (default /usr/include)")
    i.add_argument("--cc", default=os.environ.get("CC", "cc"), help="the C compiler (default cc)")
    i.add_argument("--execute-entrypoint", action="store_true",
                   help="run the image's entrypoint unless --no-container-entrypoint "
                        "(pyxis's execute_entrypoint=1; default: not run)")
    c = sub.add_parser("containers", help="list or remove your named containers "
                       "(--container-name)",
                       description="list the caller's named containers (srun "
                                   "--container-name), or remove them with rm NAME...")
    c.add_argument("op", nargs="?", choices=["list", "rm"], default="list",
                   help="list (default) or rm")
    c.add_argument("names", nargs="*", metavar="NAME", help="the containers to remove")
    return p


def _containers(a):
    from . import spankname
    env = os.environ
    if a.op == "list":
        if a.names:
            raise UsageError("containers list takes no NAME", hint="gpusandbox slurm containers")
        for n in spankname.names(env):
            sys.stdout.write(n + "\n")
        return 0
    if not a.names:
        raise UsageError("containers rm: name the containers to remove",
                         hint="gpusandbox slurm containers rm NAME...")
    for n in a.names:
        spankname.remove(env, n)
    return 0


def _atomic_write(path, data, mode):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            os.fchmod(f.fileno(), mode)
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def task_program():
    """The task program's text: this interpreter, this installation's package."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return (f"#!{sys.executable} -I\n"
            "# gpusandbox's SPANK task program (gpusandbox slurm install-plugin)\n"
            "import sys\n"
            f"sys.path.insert(0, {root!r})\n"
            "from gpusandbox.hpc.spanktask import main\n"
            "sys.exit(main())\n")


def build(dest, include, cc, execute_entrypoint=False):
    """Compile the plugin into dest, write the task program; the plugstack line."""
    header = os.path.join(include, "slurm", "spank.h")
    if not os.path.isfile(header):
        raise UsageError(f"install-plugin: {header} not found",
                         hint="install Slurm's headers (Debian: apt-get install libslurm-dev; "
                              "RHEL: slurm-devel) or give --include DIR")
    if not shutil.which(cc):
        raise UsageError(f"install-plugin: no C compiler {cc!r}",
                         hint="install gcc (apt-get install gcc) or give --cc")
    os.makedirs(dest, mode=0o755, exist_ok=True)
    out = os.path.join(dest, PLUGIN)
    tmp = os.path.join(dest, f".{PLUGIN}.{os.getpid()}")
    r = subprocess.run([cc, *CFLAGS, f"-I{include}", "-o", tmp, SOURCE],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        if os.path.exists(tmp):
            os.unlink(tmp)
        last = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
        raise UsageError(f"install-plugin: {cc} failed to build {PLUGIN}", why=last,
                         hint=f"build it by hand: {cc} {' '.join(CFLAGS)} -I{include} "
                              f"-o {out} {SOURCE}")
    os.chmod(tmp, 0o755)
    os.rename(tmp, out)
    task = os.path.join(dest, TASK)
    _atomic_write(task, task_program().encode(), 0o755)
    line = f"required {out} task={task}"
    if execute_entrypoint:
        line += " execute_entrypoint=1"
    return line


def main(argv):
    p = _parser()
    a = p.parse_args(argv)
    if a.cmd == "containers":
        return _containers(a)
    if a.cmd != "install-plugin":
        p.print_help()
        return 2 if argv else 0
    line = build(os.path.abspath(a.dir or default_dir()), a.include, a.cc, a.execute_entrypoint)
    sys.stderr.write("add this line to plugstack.conf (next to slurm.conf) on the login "
                     "and compute nodes:\n")
    sys.stdout.write(line + "\n")
    return 0
