"""`gpusandbox info` and `gpusandbox list`: what the GPU layer sees and would inject.

Off the launch path, so argparse and json are fine here.  Other layers add
lines to `info` through INFO_EXTRA: callables taking the GpuHost and
returning [(label, value)] pairs, printed as "label: value" (and as JSON keys
with --json), e.g. the lead's ("device isolation", "bpf (cgroup v2)").
"""
import os
import sys

from gpusandbox.errors import SandboxError

INFO_EXTRA = []


def register_info_lines(fn):
    INFO_EXTRA.append(fn)
    return fn


def _fail(e):
    from gpusandbox.errors import message
    sys.stderr.write(message(e))
    return e.code


_DESCRIPTIONS = {
    "info": "The host's NVIDIA driver (version, CUDA ceiling, GPUs, MIG devices) and the "
            "isolation a sandbox gets here (device filter, namespaces, GPU sharing tiers).",
    "list": "Every host path a launch with these options would inject (device nodes, "
            "libraries, binaries, firmware, configuration, IPC sockets) and the GPU sharing "
            "tier it would use, without launching anything.",
}


def _parser(prog, with_selection):
    import argparse
    from gpusandbox.errors import UsageError

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise UsageError(f"gpusandbox {prog}", message,
                             hint=f"see gpusandbox {prog} --help")

    p = Parser(prog=f"gpusandbox {prog}", description=_DESCRIPTIONS[prog])
    p.add_argument("--driver-root", default=None, metavar="DIR",
                   help="root of the NVIDIA driver files (default: the driver-root setting, /)")
    p.add_argument("--dev-root", default=None, metavar="DIR", help="where the /dev/nvidia* "
                   "nodes are (default: <driver root>/dev)")
    p.add_argument("--json", action="store_true", help="print JSON")
    if with_selection:
        p.add_argument("--gpus", default=None, metavar="SEL", help="all, none, auto or a list (default: "
                       "NVIDIA_VISIBLE_DEVICES, else all)")
        p.add_argument("--gpu-caps", default=None, metavar="CAPS", help="driver capabilities "
                       "(default: NVIDIA_DRIVER_CAPABILITIES, else utility,compute)")
        p.add_argument("--gpu-memory", default=None, metavar="SIZE", help="the sharing tier a launch with "
                       "this per-process memory ceiling would use")
        p.add_argument("--gpu-compute", default=None, metavar="PCT", help="the sharing tier a launch with "
                       "this SM percentage would use")
        p.add_argument("--fabric", default=None, metavar="auto|all|none|HCA,...",
                       help="the RDMA adapters a launch with this --fabric would get (docs/fabric.md)")
    return p


def _roots(args):
    """--driver-root/--dev-root, else the settings' (docs/config.md)."""
    from gpusandbox import settings
    args.driver_root, args.dev_root = settings.driver_roots(None, args.driver_root,
                                                            args.dev_root)
    return args


def info_data(host):
    from gpusandbox.gpu import ceiling
    cuda = ceiling.driver_cuda_version(host)
    data = {
        "driver_root": host.driver_root,
        "driver_version": host.version,
        "cuda_version": f"{cuda[0]}.{cuda[1]}" if cuda else None,
        "gpus": [{"index": g.index, "minor": g.minor, "model": g.model, "uuid": g.uuid,
                  "bus_id": g.bus_id} for g in host.gpus],
        "mig_devices": [{"gpu": m.gpu.index, "gi": m.gi, "ci": m.ci,
                         "gi_cap_minor": m.gi_node.minor, "ci_cap_minor": m.ci_node.minor}
                        for m in host.migs],
        "problems": list(host.problems),
    }
    for fn in INFO_EXTRA:
        for label, value in fn(host):
            data[label] = value
    return data


def _print_info(data):
    print(f"driver version: {data['driver_version']}")
    print(f"cuda version: {data['cuda_version'] or 'unknown (libcuda did not answer)'}")
    for g in data["gpus"]:
        print(f"gpu {g['index']}: {g['model']}  {g['uuid'] or '(uuid hidden)'}  "
              f"bus {g['bus_id']}  minor {g['minor']}")
    for m in data["mig_devices"]:
        print(f"  mig {m['gpu']}:{m['gi']}:{m['ci']}  caps {m['gi_cap_minor']},{m['ci_cap_minor']}")
    if "fabric" in data:
        from gpusandbox.fabric.report import info_lines
        for line in info_lines(data["fabric"]):
            print(line)
    fixed = {"driver_root", "driver_version", "cuda_version", "gpus", "mig_devices", "problems",
             "fabric"}
    for key, value in data.items():
        if key not in fixed:
            print(f"{key}: {value}")
    for p in data["problems"]:
        print(f"problem: {p}")


def main_info(argv):
    try:
        args = _roots(_parser("info", False).parse_args(argv))
        from gpusandbox.gpu import discover
        host = discover.discover(args.driver_root, args.dev_root)
        data = info_data(host)
        from gpusandbox.fabric import discover as fdiscover, report as freport
        data["fabric"] = freport.info_data(fdiscover.discover(args.driver_root, args.dev_root),
                                           host.gpus)
    except SandboxError as e:
        return _fail(e)
    if args.json:
        import json
        print(json.dumps(data, indent=2))
    else:
        _print_info(data)
    return 0


def list_data(host, sel):
    from gpusandbox.gpu import inject
    inj = inject.plan(host, sel)
    return {
        "selection": sel.visible,
        "capabilities": list(sel.caps),
        "devices": [n.host_path for n in inj.nodes],
        "libraries": [lib.host_path for lib in inj.libs],
        "binaries": [p for _n, p in inj.bins],
        "firmware": list(inj.firmware),
        "configs": [hp for _c, hp, _o in inj.configs],
        "ipc": [hp for _c, hp, _o in inj.ipc],
        "proc": [hp for _c, hp, _o in inj.proc],
        "missing": [{"capability": m.cap, "piece": m.piece, "fix": m.fix} for m in inj.missing],
        "skipped": list(inj.skipped),
        "warning": inject.warning(inj),
    }


def main_list(argv):
    try:
        args = _roots(_parser("list", True).parse_args(argv))
        from gpusandbox.gpu import discover, select
        host = discover.discover(args.driver_root, args.dev_root)
        env = dict(os.environ)
        gpus = args.gpus
        if gpus is None and select.resolve(None, args.gpu_caps, env, host) is None:
            gpus = "all"   # nothing asked for: show what --gpus all would inject
        sel = select.resolve(gpus, args.gpu_caps, env, host)
        if sel is None:
            print("no GPU support requested (void): nothing is injected")
            return 0
        data = list_data(host, sel)
        from gpusandbox.gpu.share import launch_line
        data["sharing"] = launch_line(host, sel, args.gpu_memory, args.gpu_compute)
        from gpusandbox.fabric import discover as fdiscover, report as freport
        data["fabric"] = freport.list_data(fdiscover.discover(args.driver_root, args.dev_root),
                                           args.fabric, env, sel.node_gpus())
    except SandboxError as e:
        return _fail(e)
    if data["warning"]:
        print(f"gpusandbox: {data['warning']}", file=sys.stderr)
    if args.json:
        import json
        print(json.dumps(data, indent=2))
        return 0
    print(f"selection: {data['selection']}  capabilities: {','.join(data['capabilities'])}")
    for group in ("devices", "libraries", "binaries", "firmware", "configs", "ipc", "proc"):
        print(f"{group}:")
        for path in data[group]:
            print(f"  {path}")
    for line in data["skipped"]:
        print(f"skipped: {line}")
    print(f"sharing: {data['sharing']}")
    fab = data["fabric"]
    print(f"fabric: {fab['request']} ({fab['source']})")
    for h in fab["hcas"]:
        print(f"  {h['name']}: {h['why']}")
    for path in fab["devices"]:
        print(f"  {path}")
    for key, value in fab["env"].items():
        print(f"  {key}={value}")
    for w in fab["warnings"]:
        print(f"gpusandbox: {w}", file=sys.stderr)
    return 0


@register_info_lines
def _isolation(host):
    """How a launch by this caller keeps GPUs apart (issue: never pretend)."""
    from gpusandbox.linux import cgroup
    st = cgroup.status()
    if st.get("bpf_filter"):
        how = f"cgroup BPF device filter (cgroup2 at {st['cgroup2']}) + bind-mounted nodes"
    elif st.get("v1_devices") and os.geteuid() == 0:
        how = "cgroup v1 devices controller + bind-mounted nodes"
    else:
        why = st.get("bpf_why") or st.get("error") or "no cgroup device filter available"
        how = (f"bind-mounted nodes only ({why}); under Slurm the job's own device "
               "cgroup still applies")
    return [("device isolation", how),
            ("cgroup delegated", "yes" if st.get("delegated") else "no")]


def _sharing_lines(host):
    from gpusandbox.gpu.share import info_lines
    return info_lines(host)


register_info_lines(_sharing_lines)
