"""`gpusandbox mps up|down|status`: the caller's MPS daemons, one per GPU.

up starts them (run --gpu-memory/--gpu-compute also does, on demand) and can
set the daemon's defaults, which every later server of that daemon gets and
which a sandbox's own limit can only lower; --exclusive (root) also puts the
GPU in EXCLUSIVE_PROCESS and down restores the mode it found."""
import json
import os
import subprocess
import sys

from gpusandbox.errors import GpuError, UsageError


def parser():
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise UsageError("gpusandbox mps", message, hint="see gpusandbox mps --help")

    p = Parser(prog="gpusandbox mps", description="The caller's MPS daemons, one per GPU: "
               "up starts them (and can set their defaults), down stops them, status shows "
               "them (docs/sharing.md).")
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--gpus", default="all", metavar="SEL", help="GPUs (default all)")
    p.add_argument("--exclusive", action="store_true",
                   help="up: set EXCLUSIVE_PROCESS (root); down restores the previous mode")
    p.add_argument("--strict", action="store_true", help="up: refuse launches whose memory "
                   "ceilings sum over the GPU's memory")
    p.add_argument("--gpu-memory", metavar="SIZE",
                   help="up: the daemon's default pinned memory limit")
    p.add_argument("--gpu-compute", metavar="PCT",
                   help="up: the daemon's default active thread percentage")
    p.add_argument("--driver-root", default=None, metavar="DIR",
                   help="root of the NVIDIA driver files (default: the driver-root setting, /)")
    p.add_argument("--dev-root", metavar="DIR", help="where the /dev/nvidia* nodes are "
                   "(default: <driver root>/dev)")
    p.add_argument("--json", action="store_true", help="one object per GPU, for tools")
    return p


def _daemons(a):
    from . import discover, select
    from .mps import Daemon
    host = discover.discover(a.driver_root, a.dev_root)
    sel = select.resolve(a.gpus, "compute", {}, host)
    if sel is None or sel.migs or not sel.gpus:
        raise UsageError(f"mps --gpus {a.gpus}", "select whole GPUs", "e.g. --gpus 0")
    return host, [Daemon(host, g) for g in sel.gpus]


def _smi_mode(host, gpu, mode=None):
    """Read (mode None) or set the compute mode with nvidia-smi."""
    from .share import compute_mode
    if mode is None:
        return compute_mode(host, gpu)
    smi = host.bins.get("nvidia-smi")
    res = subprocess.run([smi or "nvidia-smi", "-i", gpu.uuid or str(gpu.index), "-c", mode],
                         capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    if res.returncode != 0:
        raise GpuError(f"nvidia-smi -c {mode} on GPU {gpu.index} failed",
                       ((res.stdout + res.stderr).strip().splitlines() or [None])[-1])


def readback_ok(want_mib=None, shown=None, want_pct=None, shown_pct=None):
    """Whether the daemon's answer matches what was set; its readback is
    lossy (>= 1 GiB shown as floor(MiB/1024)G, 25 as 25.0)."""
    from .share import parse_memory
    if want_mib is not None:
        try:
            got = parse_memory(shown)
        except UsageError:
            return False
        return got <= want_mib < got + (1024 if got >= 1024 else 1)
    try:
        return abs(float(shown_pct) - want_pct) < 0.5
    except (TypeError, ValueError):
        return False


def _up(host, d, a):
    from .share import check_gpu, parse_compute, parse_memory
    mib = parse_memory(a.gpu_memory) if a.gpu_memory else None
    pct = parse_compute(a.gpu_compute) if a.gpu_compute else None
    if a.exclusive and os.geteuid() != 0:
        raise UsageError("mps up --exclusive needs root", "the compute mode is a setting of "
                         "the whole GPU", "run it as root, or drop --exclusive")

    class _Sel:
        migs, none, gpus, caps, visible = [], False, [d.gpu], ("compute",), str(d.gpu.index)

    class _Spec:
        user = None
    _, mode = check_gpu(host, _Sel, _Spec)
    state = {}
    if a.exclusive:
        if mode is None:
            raise GpuError(f"mps up --exclusive on GPU {d.gpu.index}",
                           "nvidia-smi did not report the compute mode to restore later")
        # A second `up --exclusive` finds the mode the first one set: the
        # mode to restore stays the one found before any of them.
        state["previous_mode"] = d.read_state().get("previous_mode") or mode
        if mode != "Exclusive_Process":
            _smi_mode(host, d.gpu, "EXCLUSIVE_PROCESS")
    started = d.start()
    d.write_state(strict=a.strict, **state)
    out = {"gpu": d.gpu.index, "started": started, "pid": _pid(d),
           "strict": a.strict}
    if a.exclusive:
        out["mode_was"] = mode
        out["previous_mode"] = state["previous_mode"]
    if mib is not None:
        out["memory"] = _set_default(
            d, "MPS memory limit", f"{mib}M", "device_pinned_mem_limit 0",
            lambda shown: readback_ok(want_mib=mib, shown=shown))
    if pct is not None:
        out["compute"] = _set_default(
            d, "MPS thread percentage", pct, "active_thread_percentage",
            lambda shown: readback_ok(want_pct=pct, shown_pct=shown))
    return out


def _set_default(d, what, value, name, ok):
    """Set the daemon's default `name` to `value` and read it back; the
    value it shows, refused unless ok(shown)."""
    d.command(f"set_default_{name} {value}")
    shown = d.command(f"get_default_{name}")
    if not ok(shown):
        raise GpuError(f"{what} on GPU {d.gpu.index}",
                       f"set {value}, the daemon reads back {shown!r}")
    return shown


def _pid(d):
    """The daemon's pid for the sentence that names it (None: its pid file
    is not one to trust; stop() and status() say why)."""
    try:
        return d.pid()
    except GpuError:
        return None


def _down(host, d):
    pid = _pid(d)
    stopped = d.stop()
    prev = d.read_state().get("previous_mode")
    if prev and prev != "Exclusive_Process":
        _smi_mode(host, d.gpu, prev.upper())
    d.remove()
    return {"gpu": d.gpu.index, "stopped": stopped, "pid": pid if stopped else None,
            "restored_mode": prev}


def up_lines(r):
    """What `mps up` did on one GPU, in sentences."""
    pid = f" (pid {r['pid']})" if r.get("pid") else ""
    lines = [f"GPU {r['gpu']}: MPS daemon " + (f"started{pid}" if r["started"]
                                               else f"already running{pid}")]
    if "previous_mode" in r:
        if r["mode_was"] == "Exclusive_Process":
            lines.append("  compute mode already Exclusive_Process")
        else:
            lines.append(f"  compute mode set to Exclusive_Process (was {r['mode_was']}; "
                         "'gpusandbox mps down' restores it)")
    if r["strict"]:
        lines.append("  strict: a launch whose --gpu-memory would take the running "
                     "sandboxes' ceilings over the GPU's memory is refused")
    if "memory" in r:
        lines.append(f"  default memory limit per CUDA process: {r['memory']}")
    if "compute" in r:
        lines.append(f"  default share of SMs per CUDA process: {r['compute']}%")
    return lines


def down_lines(r):
    """What `mps down` did on one GPU, in sentences."""
    if r["stopped"]:
        pid = f" (pid {r['pid']})" if r.get("pid") else ""
        line = f"GPU {r['gpu']}: MPS daemon{pid} stopped"
    else:
        line = f"GPU {r['gpu']}: no MPS daemon of yours was running"
    prev = r["restored_mode"]
    if prev == "Exclusive_Process":
        line += "; compute mode left at Exclusive_Process, as 'mps up --exclusive' found it"
    elif prev:
        line += f"; compute mode restored to {prev}"
    return [line]


def status_lines(r):
    """One GPU's daemon, as `mps status` shows it."""
    if r["running"]:
        lines = [f"GPU {r['gpu']}: MPS daemon running (pid {r['pid']}); pipe {r['pipe']}"]
    elif r.get("error"):
        lines = [f"GPU {r['gpu']}: MPS daemon state unknown: {r['error']}"]
    else:
        lines = [f"GPU {r['gpu']}: no MPS daemon of yours is running"]
    if r["running"] and r.get("strict"):
        lines.append("  strict: launches over the GPU's memory are refused")
    if r["running"] and r.get("previous_mode"):
        lines.append(f"  compute mode set by 'mps up --exclusive' (was {r['previous_mode']}; "
                     "'gpusandbox mps down' restores it)")
    if r["tier"]:
        lines.append(f"  {r['tier']}")
    lines.append(f"  tier 3 (driver memory limits) unavailable: {r['dmem']}")
    return lines


def main(argv):
    from gpusandbox import settings
    a = parser().parse_args(argv)
    a.driver_root, a.dev_root = settings.driver_roots(None, a.driver_root, a.dev_root)
    host, daemons = _daemons(a)
    rows = []
    for d in daemons:
        if a.action == "up":
            rows.append(_up(host, d, a))
        elif a.action == "down":
            rows.append(_down(host, d))
        else:
            from .share import dmem_status, tier_line
            st = d.status()
            st["tier"] = tier_line(_smi_mode(host, d.gpu)) if st["running"] else None
            st["dmem"] = dmem_status()[1]
            rows.append(st)
    if a.json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return 0
    lines = {"up": up_lines, "down": down_lines, "status": status_lines}[a.action]
    for r in rows:
        sys.stdout.write("".join(ln + "\n" for ln in lines(r)))
    return 0
