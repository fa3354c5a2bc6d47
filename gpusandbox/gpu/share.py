"""One GPU, several sandboxes: --gpu-memory and --gpu-compute through MPS.

Enforcement tiers, the strongest available named (docs/sharing.md):
  1. MPS, GPU in the DEFAULT compute mode: per-process ceilings applied by the
     client's own libcuda; a process that bypasses MPS (unsets its
     CUDA_MPS_* variables, loads another libcuda) gets the whole GPU.  A guard
     against accidents, not against a hostile tenant.
  2. MPS, GPU in EXCLUSIVE_PROCESS (`gpusandbox mps up --exclusive`, root):
     only the MPS server holds a context, so compute without MPS fails closed.
     The ceilings are still the client's own libcuda's.
  3. driver memory limits on the sandbox's cgroup (the kernel's dmem
     controller with a driver that charges it): detected and reported, never
     used, because no machine here can show it enforcing.
  4. MIG instances: the hard partition (--gpus with a MIG device).

`run --gpu-memory/--gpu-compute` starts the caller's daemon for that GPU when
none runs (it then outlives the launch; `gpusandbox mps down` stops it), so
a plain `run` needs no preparation; `mps up` exists to set the daemon's
defaults and the exclusive mode ahead of time.
"""
import os
import subprocess

from gpusandbox.errors import GpuError, UsageError
from gpusandbox.linux import cgfs

PIPE_INSIDE = "/run/nvidia-mps"
RW_IPC = ("rw", "nosuid", "nodev", "noexec")
# The pipe directory is read-only inside (gpu/inject.py MPS_IPC): a sandbox
# that could unlink `control` and bind its own socket there would serve every
# other sandbox's client and receive the host's `mps down`.
RO_IPC = ("ro", "nosuid", "nodev", "noexec")


def parse_memory(text):
    """MiB of a --gpu-memory value: 8G, 8GiB, 512M, 1.5G (binary units)."""
    t = (text or "").strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"G": 1024, "M": 1, "T": 1024 * 1024}.get(t[-1:])
    num = t[:-1]
    try:
        mib = int(float(num) * mult) if mult and num and num.replace(".", "", 1).isdigit() else 0
    except ValueError:
        mib = 0
    if mib <= 0 or mib > 64 << 20:
        raise UsageError(f"invalid --gpu-memory {text!r}", "expected a size such as 8G or 512M",
                         "example: --gpu-memory 8G")
    return mib


def parse_compute(text):
    """Percent of a --gpu-compute value: 30% or 30, 1 to 100."""
    t = (text or "").strip().removesuffix("%")
    if not t.isdigit() or not 1 <= int(t) <= 100:
        raise UsageError(f"invalid --gpu-compute {text!r}", "expected a percentage from 1 to 100",
                         "example: --gpu-compute 30%")
    return int(t)


def _cgroup2_root():
    try:
        return cgfs.cgroup2_mount() or "/sys/fs/cgroup"
    except OSError:
        return "/sys/fs/cgroup"


def dmem_status(cgroot=None):
    """(available: bool, why): tier 3 as this host offers it."""
    cgroot = cgroot or _cgroup2_root()
    try:
        with open(os.path.join(cgroot, "cgroup.controllers")) as f:
            ctrls = f.read().split()
    except OSError:
        return False, "no cgroup v2 hierarchy at " + cgroot
    if "dmem" not in ctrls:
        return False, (f"the cgroup2 hierarchy at {cgroot} offers no dmem controller (kernel "
                       f"{os.uname().release}; it needs CONFIG_CGROUP_DMEM, Linux 6.14+, and a "
                       "driver that charges it)")
    try:
        with open(os.path.join(cgroot, "dmem.capacity")) as f:
            regions = [ln for ln in f.read().splitlines() if ln.startswith("nvidia")]
    except OSError:
        regions = []
    if not regions:
        return False, "the dmem controller lists no NVIDIA region (the driver does not charge it)"
    return False, ("the dmem controller lists NVIDIA memory, but gpusandbox does not set "
                   "dmem limits: not yet verified on such a driver")


def gpu_facts(host, gpu):
    """{"mode": compute mode as nvidia-smi names it, "total": memory in MiB},
    None where nvidia-smi does not tell (an older one lacks compute_mode)."""
    smi = host.bins.get("nvidia-smi")
    for fields in (("memory.total", "compute_mode"), ("memory.total",)):
        if not smi:
            break
        try:
            res = subprocess.run([smi, "--query-gpu=uuid," + ",".join(fields),
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=20, env={"PATH": "/usr/bin:/bin"}, cwd="/")
        except (OSError, subprocess.TimeoutExpired):
            break
        if res.returncode != 0:
            continue
        for line in res.stdout.splitlines():
            cols = [c.strip() for c in line.split(",")]
            if len(cols) == 1 + len(fields) and cols[0] == gpu.uuid:
                got = dict(zip(fields, cols[1:]))
                total = got["memory.total"]
                return {"mode": parse_mode(got.get("compute_mode")),
                        "total": int(total) if total.isdigit() else None}
    return {"mode": None, "total": None}


def compute_mode(host, gpu):
    """The GPU's compute mode as nvidia-smi names it, or None when unknown."""
    return gpu_facts(host, gpu)["mode"]


def parse_mode(text):
    v = (text or "").strip().splitlines()[:1]
    v = v[0].strip().replace(" ", "_").upper() if v else ""
    return {"DEFAULT": "Default", "EXCLUSIVE_PROCESS": "Exclusive_Process",
            "PROHIBITED": "Prohibited", "EXCLUSIVE_THREAD": "Exclusive_Thread"}.get(v)


def tier_line(mode):
    if mode == "Exclusive_Process":
        return ("tier 2, MPS with the GPU in EXCLUSIVE_PROCESS: compute outside MPS fails; the "
                "ceilings are applied by each process's own libcuda")
    what = "DEFAULT" if mode == "Default" else "DEFAULT (assumed: nvidia-smi did not report it)"
    return (f"tier 1, MPS with the GPU in {what} compute mode: per-process ceilings applied "
            "by each process's own libcuda; a process that bypasses MPS gets the whole GPU "
            "(a guard against accidents, not against a hostile tenant)")


def launch_line(host, sel, memory=None, compute=None):
    """What `gpusandbox list` says of sharing for a launch with these options:
    the tier that would enforce the limits and what it does not guarantee.
    Raises the launch's own refusals (exit 125)."""
    if memory is None and compute is None:
        if sel.migs:
            return ("tier 4, MIG device(s): a hard partition of memory and SMs, enforced by "
                    "the GPU")
        return ("no limits asked (--gpu-memory/--gpu-compute): sandboxes that see the same "
                "GPU share its memory and SMs with nothing between them")
    mib = parse_memory(memory) if memory is not None else None
    pct = parse_compute(compute) if compute is not None else None

    class _Spec:
        user = None
    gpu, mode = check_gpu(host, sel, _Spec)
    limits = ", ".join(x for x in (f"{mib} MiB" if mib else "", f"{pct}% of SMs" if pct else "")
                       if x)
    return (f"{limits} per CUDA process on GPU {gpu.index}: {tier_line(mode)}; tier 3 "
            f"(driver memory limits) unavailable: {dmem_status()[1]}")


def check_gpu(host, sel, spec):
    """The one GPU the limits apply to, and its compute mode; raises the
    refusals (exit 125) for what MPS cannot do here."""
    from .inject import effective_caps
    from .require import gpu_arch
    if sel.migs:
        raise GpuError("--gpu-memory/--gpu-compute with a MIG device",
                       "a MIG instance is already a hard partition of its own memory and SMs",
                       hint="drop the limits, or select a whole GPU")
    if sel.none or len(sel.gpus) != 1:
        raise UsageError("--gpu-memory/--gpu-compute need exactly one GPU",
                         f"{len(sel.gpus)} selected ({sel.visible})",
                         "select one, e.g. --gpus 0 (several GPUs per sandbox are not supported yet)")
    if "compute" not in effective_caps(sel.caps):
        raise UsageError("--gpu-memory/--gpu-compute need the compute capability",
                         f"--gpu-caps is {','.join(sel.caps)}", "add compute to --gpu-caps")
    gpu = sel.gpus[0]
    arch = gpu_arch(gpu.model)
    if arch is not None and tuple(map(int, arch.split("."))) < (7, 0):
        raise GpuError(f"MPS limits on GPU {gpu.index} ({gpu.model})",
                       f"compute capability {arch} is below 7.0 (Volta), where MPS has no "
                       "memory or compute ceilings", hint="use a Volta or newer GPU, or MIG")
    if any(m.gpu.index == gpu.index for m in host.migs):
        raise GpuError(f"MPS limits on GPU {gpu.index}", "MIG is enabled on it",
                       hint="select one of its MIG devices instead (the hard partition)")
    if spec.user is not None and spec.user[0] != 0:
        raise UsageError("--gpu-memory/--gpu-compute with --user",
                         "the MPS daemon serves the caller's uid; a command running as "
                         f"uid {spec.user[0]} would be refused by it",
                         "run as that user without --user")
    mode = compute_mode(host, gpu)
    if mode == "Prohibited":
        raise GpuError(f"MPS limits on GPU {gpu.index}", "its compute mode is PROHIBITED",
                       hint="nvidia-smi -i N -c DEFAULT (root) to allow compute")
    others = other_servers(host, gpu)
    if others:
        pid, uid = others[0]
        raise GpuError(f"MPS limits on GPU {gpu.index}", f"an MPS server of another user "
                       f"(uid {uid}, pid {pid}) runs on it",
                       hint="an MPS server serves one user: wait until that user's daemon "
                            "stops ('gpusandbox mps down' as that user), or use another GPU")
    return gpu, mode


def other_servers(host, gpu):
    """[(pid, uid)] of the MPS servers of other users on this GPU, as
    nvidia-smi lists them among its compute processes; [] where it does not
    tell (an older nvidia-smi, a pid namespace that hides them)."""
    smi = host.bins.get("nvidia-smi")
    if not smi:
        return []
    try:
        res = subprocess.run([smi, "--query-compute-apps=pid,gpu_uuid,process_name",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    except (OSError, subprocess.TimeoutExpired):
        return []
    out = []
    for line in res.stdout.splitlines() if res.returncode == 0 else ():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) != 3 or not cols[0].isdigit() or cols[1] != gpu.uuid or \
                os.path.basename(cols[2]) != "nvidia-cuda-mps-server":
            continue
        try:
            uid = os.stat(f"/proc/{cols[0]}").st_uid
        except OSError:
            continue
        if uid != os.geteuid():
            out.append((int(cols[0]), uid))
    return out


def apply(plan, spec, host, sel, edits, host_env):
    """Start (or reuse) the caller's MPS daemon on the selected GPU and wire
    the sandbox to it: its pipe directory at PIPE_INSIDE with the privileged
    socket masked, its /dev/shm, and the CUDA_MPS_* variables, which override
    the image's and the user's own."""
    from . import mps
    from gpusandbox.edits import File, Mount
    mib = parse_memory(spec.gpu_memory) if spec.gpu_memory is not None else None
    pct = parse_compute(spec.gpu_compute) if spec.gpu_compute is not None else None
    gpu, mode = check_gpu(host, sel, spec)
    daemon = mps.Daemon(host, gpu, host_env)
    started = daemon.start()
    if mib is not None:
        daemon.lease(mib, lambda: gpu_facts(host, gpu)["total"])
    mps_ipc = host.ipc.get("mps")
    if mps_ipc:
        edits.mounts[:] = [m for m in edits.mounts if m.host_path != mps_ipc[1]]
    edits.mounts.append(Mount(daemon.pipe, PIPE_INSIDE, RO_IPC, kind="dir"))
    edits.mounts.append(Mount(daemon.shm, "/dev/shm", RW_IPC, kind="dir"))
    # Admin commands (quit, limits) go through control_privileged: an empty
    # read-only file stands over it inside.
    edits.files.append(File(PIPE_INSIDE + "/control_privileged", b"", 0o444))
    env = {"CUDA_MPS_PIPE_DIRECTORY": PIPE_INSIDE}
    if mib is not None:
        # The sandbox sees its one GPU as ordinal 0; an entry naming a GPU
        # it cannot see would drop every pinned limit.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mib}M"
    if pct is not None:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
    plan.forced_env = env
    limits = ", ".join(x for x in (f"{mib} MiB" if mib else "", f"{pct}% of SMs" if pct else "")
                       if x)
    plan.notes.append(f"gpu sharing: {limits} per CUDA process on GPU {gpu.index} through the "
                      f"MPS daemon in {daemon.dir} ({'started now; it stays until gpusandbox mps down' if started else 'already running'})")
    plan.notes.append("gpu sharing: " + tier_line(mode))
    plan.notes.append("gpu sharing: tier 3 (driver memory limits) unavailable: "
                      + dmem_status()[1])
    return daemon


def final_env(env, forced):
    """The sandbox's environment with the launcher's CUDA_MPS_* variables in
    force: every other CUDA_MPS_* (the image's, -e, --env-file) removed."""
    for key in [k for k in env if k.startswith("CUDA_MPS_") and k not in forced]:
        del env[key]
    env.update(forced)
    return env


def info_lines(host):
    """[(label, value)] for `gpusandbox info` and doctor: the sharing tiers
    this host offers and the forward-compatibility eligibility of its GPUs."""
    from . import mps
    from .require import gpu_brand, is_datacenter
    has_mps = mps.CTL in host.bins and "nvidia-cuda-mps-server" in host.bins
    running = []
    for g in host.gpus:
        try:
            pid = mps.Daemon(host, g).pid()
        except GpuError as e:
            pid = e.line()
        if pid is not None:
            running.append(f"gpu {g.index} ({pid})")
    tiers = ["MPS (tiers 1-2): " + (
        "available: --gpu-memory/--gpu-compute use tier 1 (tier 2 once 'gpusandbox mps up "
        "--exclusive' set EXCLUSIVE_PROCESS), ceilings applied by each process's own libcuda: "
        "a guard against accidents, not against a hostile tenant" if has_mps else
        "unavailable: the driver root has no MPS binaries"),
             "driver memory limits (tier 3): unavailable: " + dmem_status()[1],
             f"MIG (tier 4): {len(host.migs)} MIG device(s)"]
    brands = sorted({gpu_brand(g.model) or "unknown" for g in host.gpus})
    dc = [b for b in brands if is_datacenter(b)]
    fwd = ("usable on this host's data-center GPUs (--cuda-compat auto)" if dc and len(dc) == len(brands)
           else "not supported on " + ", ".join(b for b in brands if not is_datacenter(b))
           + " GPUs (CUDA error 804); same-major images may still run (minor-version "
           "compatibility, --no-require)" if brands else "no GPUs")
    return [("gpu sharing", "; ".join(tiers)),
            ("mps daemons", ", ".join(running) if running else "none of this user's running"),
            ("forward compatibility", fwd)]
