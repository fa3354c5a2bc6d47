"""Entry point: picks the subcommand and imports only what it needs.

`run` is the hot path (job arrays, per-rank sandboxes): it must not pay for
argparse, json or attrs, which the report commands use freely."""
import os
import sys

USAGE = """usage: gpusandbox COMMAND [options]

commands:
  run [options] IMAGE [--] [CMD [ARG...]]    run CMD in IMAGE: a directory, a bundle or an image
                                              reference (see 'gpusandbox run --help')
  ps [-a] [--json]                            your named and detached sandboxes (docs/live.md)
  exec [-t] [-e K=V] [-w DIR] NAME CMD...     run CMD in the running sandbox NAME (--job J --rank R:
                                              a Slurm rank's)
  stop [-t SECONDS] NAME | kill [-s SIG] NAME  stop it (TERM, then KILL) | signal it
  logs [-f] NAME | wait NAME | rm [-f] NAME   a detached sandbox's output | its exit status |
                                              remove its record and log
  pull REF                                    pull an image into the store (docker://, oci:,
                                              oci-archive:, docker-archive:)
  images [--json]                             the images in the store
  rmi REF|DIGEST...                           remove images from the store
  prune                                       remove unreferenced images and blobs
  inspect REF... [--json]                     an image's names, platform, size, config and layers
  config [--show-origin] [--json]             the effective settings and where each came from
                                              (docs/config.md)
  info [--json]                               driver, CUDA ceiling, GPUs, isolation available here
  list [--gpus SEL] [--gpu-caps CAPS] [--gpu-memory N] [--gpu-compute P]
                                              host files a launch with these options would inject,
                                              and the GPU sharing tier it would use
  doctor [--gpus SEL] [IMAGE]                 check launcher, driver and image (DIR, FILE.sqsh, REF)
  doctor --mpi [IMAGE_DIR]                    in a Slurm step: what MPI/NCCL ranks share, transports
  cdi generate|list|check [options]           CDI specs: write one for this host's GPUs, list and
                                              check those in /etc/cdi, /var/run/cdi (docs/cdi.md)
  sim create DIR --gpus N [--hcas N]          write a simulated GPU host (driver root + dev root;
                                              --hcas: RDMA adapters and their PCI tree)
  hook STAGE | hook install [--dir DIR]       OCI hook: GPUs into a runc/crun/podman container
  oci-filter                                  podman hooks.d precreate filter (config.json in/out)
  runtime configure --runtime ENGINE          register gpusandbox-runtime with podman/docker/containerd
  mps up|down|status [--gpus SEL] [--exclusive]  the caller's MPS daemons (docs/sharing.md)
  slurm-oci run|state|kill|delete BUNDLE      the runtime of Slurm's oci.conf (srun --container)
  slurm install-plugin [--dir DIR]            build the SPANK plugin for srun --container-image
                                              (pyxis's options) and print plugstack.conf's line
  slurm containers [rm NAME...]               your named containers (srun --container-name)
  oci [--root DIR] COMMAND ...                the OCI runtime command line (runc's; docs/oci.md)
  completion bash|zsh                         print the shell completion script
  man [run] [-o DIR]                          print the man page gpusandbox(1) or gpusandbox-run(1)
  version                                     print the version
"""


# The other subcommands: (module, function), imported only when called.
_COMMANDS = {
    "info": ("gpusandbox.gpu.report", "main_info"),
    "config": ("gpusandbox.configcli", "main"),
    "ps": ("gpusandbox.live.cli", "main_ps"),
    "exec": ("gpusandbox.live.execcli", "main_exec"),
    "stop": ("gpusandbox.live.cli", "main_stop"),
    "kill": ("gpusandbox.live.cli", "main_kill"),
    "logs": ("gpusandbox.live.cli", "main_logs"),
    "wait": ("gpusandbox.live.cli", "main_wait"),
    "rm": ("gpusandbox.live.cli", "main_rm"),
    "list": ("gpusandbox.gpu.report", "main_list"),
    "doctor": ("gpusandbox.doctor", "main"),
    "cdi": ("gpusandbox.oci.cdi.cli", "main"),
    "sim": ("gpusandbox.sim.cli", "main"),
    "hook": ("gpusandbox.oci.hook", "main"),
    "oci-filter": ("gpusandbox.oci.filter", "main"),
    "runtime": ("gpusandbox.oci.runtimeconf", "main"),
    "mps": ("gpusandbox.gpu.mpscli", "main"),
    "slurm-oci": ("gpusandbox.hpc.slurmoci", "main"),
    "slurm": ("gpusandbox.hpc.spank", "main"),
    "pull": ("gpusandbox.image.cli", "main_pull"),
    "images": ("gpusandbox.image.cli", "main_images"),
    "rmi": ("gpusandbox.image.cli", "main_rmi"),
    "prune": ("gpusandbox.image.cli", "main_prune"),
    "inspect": ("gpusandbox.image.cli", "main_inspect"),
    "completion": ("gpusandbox.cliref", "main_completion"),
    "man": ("gpusandbox.cliref", "main_man"),
}


def _report_cmd(modname, func, argv, cmd):
    """Run a subcommand: whatever it raises that a user can cause ends as
    one line and an exit code, never a traceback: a SandboxError as it says,
    an OSError that escaped (one line with the real path, 125), SIGINT and
    SIGTERM (130, 143; the clean-ups ran while the exception unwound)."""
    import importlib
    from .errors import EXIT_LAUNCHER, SandboxError, interrupted, message, os_error, \
        quiet_signals
    try:
        mod = importlib.import_module(modname)
        return getattr(mod, func)(argv)
    except SandboxError as e:
        err = e
    except KeyboardInterrupt as e:
        quiet_signals()
        err = interrupted(e, cmd)
    except OSError as e:
        err = os_error(cmd, e)
        err.code = EXIT_LAUNCHER
    sys.stderr.write(message(err))
    return err.code


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    from .errors import catch_signals
    catch_signals()
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 125
    cmd, rest = argv[0], argv[1:]
    if cmd == "run":
        from .cli import run_and_exit
        run_and_exit(rest)
    if cmd == "exec":
        # As `run`: nothing is left to finalise once the process in the
        # sandbox has ended, so the interpreter's teardown (a few ms of
        # every exec, scripts/bench's live row) is skipped.
        code = _report_cmd(*_COMMANDS[cmd], rest, cmd)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if cmd in _COMMANDS:
        return _report_cmd(*_COMMANDS[cmd], rest, cmd)
    if cmd == "oci":
        from .oci.runtime.cli import main as oci_main
        return oci_main(rest)
    if cmd in ("version", "--version"):
        from . import __version__
        if rest and rest[0] in ("-h", "--help"):
            sys.stdout.write("usage: gpusandbox version\n\nPrint the version of gpusandbox.\n")
            return 0
        sys.stdout.write(f"gpusandbox {__version__}\n")
        return 0
    from .errors import printable
    from .suggest import unknown_command
    what = unknown_command(cmd, [*_COMMANDS, "run", "oci", "version", "help"])
    sys.stderr.write(f"gpusandbox: error: {printable(what)}\n"
                     "hint: run 'gpusandbox --help' for the list of commands\n")
    return 125


if __name__ == "__main__":
    sys.exit(main())
