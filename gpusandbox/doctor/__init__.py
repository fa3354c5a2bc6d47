"""`gpusandbox doctor`: find which layer of a GPU launch is broken, and say how to fix it.

GPU container failures come from three layers that users cannot tell apart
from the error they see: the runtime's own prerequisites (user namespaces,
cgroups, overlayfs), the host driver (module, device nodes, libraries of the
running version), and the CUDA release the image needs against what the
driver supports.  Each check below prints PASS, WARN or FAIL with the fix,
in that order, then a three-step verification runs a real sandbox.

Every /proc, /sys and /etc path the checks read comes from a Roots object,
so tests point them at a temporary tree (e.g. a sysctl file reading 0)
instead of changing the machine.

Exit status: 0 when nothing failed (warnings allowed), 1 when a check
failed, 125 for a usage error.  Report-only code: attrs and json are fine.
"""
import os
import sys

import attrs

from gpusandbox.errors import SandboxError, UsageError

from .common import FAIL, HELPER_PATH, PASS, WARN, Check, Options, Roots, _read  # noqa: F401
from .driver import (_driver_version, _lib_mismatch, _lib_versions, check_driver,  # noqa: F401
                     check_pieces, gpu_listing)
from .image import _libc, _stat_in, check_image, load_image  # noqa: F401
from .launcher import (_bpf_caps, _id_helper_ok, _rmtree, check_cgroups, check_overlay,  # noqa: F401
                       check_subids, check_userns, probe_overlay)
from .verify import _framework, _sandbox, check_verify  # noqa: F401


def run_checks(opts, euid=None):
    from gpusandbox.gpu import select
    euid = os.geteuid() if euid is None else euid
    if opts.mpi:
        from .mpi import check_mpi
        return check_mpi(opts)
    out = [check_userns(opts.roots, euid)]
    if opts.userns == "subids":
        import pwd
        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = str(os.getuid())
        out += check_subids(opts.roots, user, os.getuid(), helpers=euid != 0)
    out += check_cgroups(opts.roots, euid)
    if opts.probes:
        out.append(check_overlay(euid))
    from .settings import check_settings
    out += check_settings(os.environ, f"{opts.roots.etc}/gpusandbox/oci.conf")
    from .config import check_config
    out += check_config(os.environ, opts.roots.etc)
    checks, host, ceiling = check_driver(opts)
    out += checks
    sel = None
    if host is not None:
        try:
            sel = select.resolve(opts.gpus, None, {}, host)
        except SandboxError as e:
            out.append(Check("driver", "GPU selection", FAIL, e.line(), e.hint or ""))
    from .share import check_share
    out += check_share(opts, host, sel)
    facts = None
    if opts.image:
        checks, facts = check_image(opts, host, ceiling, sel)
        out += checks
    out += check_verify(opts, host, sel, facts)
    return out


def render(checks):
    lines, section = [], None
    for c in checks:
        if c.section != section:
            section = c.section
            lines.append(f"{section}:")
        line = f"  {c.status.upper():4}  {c.name:<28} {c.detail}"
        if c.fix and c.status != PASS:
            line += f"  (fix: {c.fix})"
        lines.append(line)
    counts = {s: sum(c.status == s for c in checks) for s in (PASS, WARN, FAIL)}
    lines.append(f"{counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed")
    return "\n".join(lines) + "\n"


def to_json(checks):
    import json
    counts = {s: sum(c.status == s for c in checks) for s in (PASS, WARN, FAIL)}
    return json.dumps({"ok": counts[FAIL] == 0, "summary": counts,
                       "checks": [attrs.asdict(c) for c in checks]}, indent=2) + "\n"


def _parser():
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise UsageError(f"doctor: {message}", hint="run 'gpusandbox doctor --help'")

    p = Parser(prog="gpusandbox doctor", description="Check the launcher's prerequisites, the "
               "host driver and (given IMAGE_DIR, FILE.sqsh or a store image) the image, then run a test sandbox.",
               epilog="Exit status: 0 nothing failed (warnings allowed), 1 a check failed, "
                      "125 usage error.")
    p.add_argument("--gpus", default="all", metavar="SEL", help="GPUs to verify (default: all)")
    p.add_argument("--driver-root", default=None, metavar="DIR",
                   help="where the host driver lives (default: the driver-root setting, /)")
    p.add_argument("--dev-root", default=None, metavar="DIR", help="where its device nodes live")
    p.add_argument("--userns", default="auto", choices=("auto", "single", "subids", "host"),
                   help="check the prerequisites of this user-namespace mode")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--mpi", action="store_true", help="inside a Slurm step: what MPI/NCCL ranks "
                   "launched here share, and which transports work between them (with "
                   "IMAGE_DIR: one probe rank in the step's pod)")
    p.add_argument("--share", choices=("node", "none"), default=None,
                   help="with --mpi: the --share the ranks use (default: as run chooses)")
    p.add_argument("--net", choices=("host", "none"), default=None,
                   help="with --mpi: the --net the ranks use")
    p.add_argument("image", nargs="?", metavar="IMAGE",
                   help="image to check and test: a rootfs directory, an OCI bundle, a "
                        "squashfs file FILE.sqsh (mounted read-only as run mounts it) or an "
                        "image in the store, NAME[:TAG] or docker://REF (never pulled; "
                        "GPUSANDBOX_STORE and GPUSANDBOX_SITE_STORE as for run)")
    return p


def _image_arg(text):
    """A path made absolute; an image reference (run's rule) kept as given."""
    if not text:
        return None
    from .storeimage import is_store_ref, resolve
    if not is_store_ref(text):
        return os.path.abspath(text)
    resolve(text)       # not in the store: one error line with the hint to pull, exit 125
    return text


def main(argv, roots=None):
    """`gpusandbox doctor ARGV`; roots replaces /proc, /sys and /etc (tests)."""
    try:
        a = _parser().parse_args(argv)
        from gpusandbox import settings
        a.driver_root, a.dev_root = settings.driver_roots(None, a.driver_root, a.dev_root)
        opts = Options(gpus=a.gpus, driver_root=os.path.abspath(a.driver_root),
                       dev_root=os.path.abspath(a.dev_root) if a.dev_root else None,
                       image=_image_arg(a.image), userns=a.userns,
                       roots=roots or Roots(), mpi=a.mpi, share=a.share, net=a.net)
        checks = run_checks(opts)
    except SandboxError as e:
        from gpusandbox.errors import message
        sys.stderr.write(message(e))
        return e.code
    sys.stdout.write(to_json(checks) if a.json else render(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0
