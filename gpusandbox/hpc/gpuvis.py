"""`run --gpu-visibility step`: a rank sees every GPU of its step on this node,
its own first (NCCL finds NVLink/P2P peers only among the GPUs it can open);
`task` (the default) leaves the rank's own selection alone.

The step's set comes from the caller's environment only: inside a Slurm GPU
step, the step's allocation on this node (SLURM_STEP_GPUS mapped through
gres.conf, or, under ConstrainDevices, the GPUs this task's device cgroup lets
it open, which per-task binding narrows to its own); outside Slurm, the
caller's NVIDIA_VISIBLE_DEVICES (what the job was given), the rank's own
GPUs being --gpus.  The order inside is the rank's own GPUs, then the others
in index order: NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES (GPU UUIDs,
which CUDA accepts) both list them so, and device 0 is the rank's own GPU.
"""
from ..errors import UsageError


def _step_gpus(environ, host):
    from .. import slurm
    if slurm.in_gpu_step(environ):
        gpus = sorted(host.gpus, key=lambda g: g.minor)
        order, known = slurm._gres_order(environ, gpus)
        verdict = {g.minor: slurm.probe_node(slurm._node_path(host, g)) for g in gpus}
        if any(v is False for v in verdict.values()):
            return [g for g in order if verdict.get(g.minor)]
        ids, _, source = slurm._allocation(environ)
        if ids is None:
            return []
        return slurm._pick(ids, order, local_first=False, what=source, known=known,
                           environ=environ)
    value = (environ.get("NVIDIA_VISIBLE_DEVICES") or "").strip()
    if not value or value.lower() in ("void", "none"):
        return []
    from ..gpu import select
    return select._select(value, "NVIDIA_VISIBLE_DEVICES", UsageError, (), host).gpus


def widen(sel, host, environ, notes):
    """The rank's Selection with the step's other GPUs added after its own."""
    from ..gpu.select import Selection, _visible
    if sel is None or sel.none:
        return sel
    own = list(sel.gpus)
    others = [g for g in sorted(_step_gpus(environ, host), key=lambda g: g.index)
              if g not in own and all(m.gpu is not g for m in sel.migs)]
    if not others:
        notes.append("--gpu-visibility step: no other GPU of the step on this node")
        return sel
    gpus = own + others
    out = Selection(gpus, list(sel.migs), sel.caps, False, _visible(gpus, sel.migs),
                    sel.source, sel.mig_config, sel.mig_monitor)
    notes.append(f"--gpu-visibility step: own {','.join(str(g.index) for g in own)}, then "
                 f"{','.join(str(g.index) for g in others)}")
    return out


def cuda_order(sel):
    """CUDA_VISIBLE_DEVICES that keeps the rank's own GPUs first, or None when
    a GPU's UUID is unknown (CUDA's default order then applies)."""
    if sel is None or sel.migs or not all(g.uuid for g in sel.gpus):
        return None
    return ",".join(g.uuid for g in sel.gpus)
