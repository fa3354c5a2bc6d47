"""`doctor --mpi`, the fabric part: which RDMA adapters this rank gets and
why, how far they sit from its GPUs, GPUDirect RDMA and IMEX, and the
transport NCCL and UCX will pick, said loudly when a job spanning nodes
falls back to TCP sockets (it runs, 10-50x slower, and nobody is told)."""
import os

from .common import FAIL, PASS, WARN, Check

S = "mpi"


def _rank_gpus(opts, env):
    """The GPUs a `run` here would give this rank (as plandev chooses them), or []."""
    from gpusandbox.errors import SandboxError
    if not (env.get("NVIDIA_VISIBLE_DEVICES") or env.get("SLURM_JOB_ID")):
        return [], "no GPU asked for (no NVIDIA_VISIBLE_DEVICES, not in a Slurm job)"
    try:
        from gpusandbox.gpu import discover, request, select
        host = discover.discover(opts.driver_root, opts.dev_root, environ=env)
        sel = select.for_request(request.from_caller(None, None, [], env), host, env)
    except SandboxError as e:
        return [], e.line()
    gpus = sel.node_gpus() if sel is not None else []
    return gpus, f"GPU(s) {','.join(str(g.index) for g in gpus) or 'none'}"


def check_fabric(opts, env):
    from gpusandbox.errors import SandboxError
    from gpusandbox.fabric import discover, inject, select
    out = []
    host = discover.discover(opts.driver_root, opts.dev_root)
    gpus, which = _rank_gpus(opts, env)
    try:
        nodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
    except ValueError:
        nodes = 1
    try:
        req = select.from_caller(None, env, bool(gpus))
        res = inject.build(req, host, gpus, env)
    except SandboxError as e:
        return [Check(S, "RDMA adapters", FAIL, e.line(), e.hint or "")]
    if res.hcas or res.cxis:
        out.append(Check(S, "RDMA adapters", PASS, f"{which}: " + "; ".join(
            f"{h.name} ({h.link() or 'link unknown'}): {why}"
            for h, why in res.hcas + res.cxis)))
    else:
        why = ("this host has none (/sys/class/infiniband is empty)" if not host.hcas else
               f"none given ({which}; {req.source}: "
               f"{req.hcas if isinstance(req.hcas, str) else ','.join(req.hcas)})")
        tcp = "NCCL and MPI between nodes use TCP sockets (10-50x slower)"
        out.append(Check(S, "RDMA adapters", FAIL if nodes > 1 else WARN, f"{why}: {tcp}" +
                         (f" in this {nodes}-node job" if nodes > 1 else ""),
                         "pass --fabric auto (or run where HCAs are)" if host.hcas else
                         "load the HCA drivers (mlx5_ib, ib_uverbs), or run on nodes with HCAs"))
    for g in gpus:
        path = discover.gpu_pci_path(host.sys_root, g.bus_id)
        numa = discover.gpu_numa(path)
        dist = sorted((select.distance(path, numa, h), h.name) for h, _ in res.hcas)
        if dist:
            level, name = dist[0]
            out.append(Check(S, f"GPU {g.index} to HCA", PASS if level <= 1 else WARN,
                             f"{name}: {select.LEVELS[level]}",
                             "" if level <= 1 else "GPUDirect RDMA is slow or off across the "
                             "CPU interconnect: pick HCAs beside the GPUs (--fabric auto)"))
    if res.hcas and gpus:
        out.append(Check(S, "GPUDirect RDMA", PASS if host.peermem else WARN,
                         "nvidia-peermem loaded" if host.peermem else
                         "nvidia-peermem is not loaded: NCCL stages GPU data through host memory",
                         "" if host.peermem else "modprobe nvidia-peermem"))
    if host.imex or env.get("NVIDIA_IMEX_CHANNELS"):
        got = [n.path for n in res.edits.device_nodes if "imex" in n.path]
        out.append(Check(S, "IMEX channels", PASS if got or not env.get("NVIDIA_IMEX_CHANNELS")
                         else WARN, f"host has {len(host.imex)}; this rank gets "
                         f"{', '.join(os.path.basename(p) for p in got) or 'none'}",
                         "" if got else "NVIDIA_IMEX_CHANNELS=N gives channel N (multi-node NVLink)"))
    nccl = env.get("NCCL_IB_HCA") or res.edits.env.get("NCCL_IB_HCA")
    ucx = env.get("UCX_NET_DEVICES") or res.edits.env.get("UCX_NET_DEVICES")
    if res.hcas:
        ib = any(h.link() == "InfiniBand" for h, _ in res.hcas)
        out.append(Check(S, "transport (NCCL, UCX)", PASS,
                         f"NCCL: IB{'' if ib else ' (RoCE)'} verbs on {nccl}; UCX: "
                         f"{'rc/ud/dc' if ib else 'rc/ud over RoCE'} on {ucx}"))
    elif res.cxis:
        fi = env.get("FI_CXI_DEVICE_NAME") or res.edits.env.get("FI_CXI_DEVICE_NAME")
        out.append(Check(S, "transport (NCCL, UCX)", PASS,
                         f"libfabric: cxi on {fi} (MPI over OFI; NCCL through its OFI plugin)"))
    else:
        out.append(Check(S, "transport (NCCL, UCX)", FAIL if nodes > 1 else WARN,
                         "NCCL: Socket (TCP); UCX: tcp" + (" between nodes" if nodes > 1 else ""),
                         "" if nodes <= 1 else "this multi-node job has no RDMA path"))
    return out
