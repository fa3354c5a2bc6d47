"""`gpusandbox sim create|destroy ...` (also `python -m gpusandbox.sim`)."""
import json

from .host import create, destroy
from .ids import DEFAULT_MODEL, GEFORCE_MODEL


def parser():
    import argparse
    p = argparse.ArgumentParser(prog="gpusandbox sim", description="A simulated GPU host for "
                                "tests and demos on machines without a GPU.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="write a simulated host into DIR (needs root once)",
                       description="Write a simulated GPU host into DIR: proc files, real "
                       "195:N device nodes, stub libcuda/libnvidia-ml and an nvidia-smi, to "
                       "pass to run, info, doctor and the other commands as --driver-root DIR. "
                       "Needs root (device nodes); the result is world-readable.")
    c.add_argument("dir", metavar="DIR", help="where to write the host (made if missing)")
    c.add_argument("--gpus", type=int, default=4, metavar="N", help="number of GPUs (default 4)")
    c.add_argument("--driver-version", default="550.54.15", metavar="VERSION",
                   help="the driver version reported (default 550.54.15)")
    c.add_argument("--cuda-version", default="12.4", metavar="VERSION",
                   help="the CUDA version the driver supports (default 12.4)")
    c.add_argument("--model", help="the GPUs' product name")
    c.add_argument("--brand", choices=("datacenter", "geforce"), default="datacenter",
                   help="the default model's brand (default datacenter)")
    c.add_argument("--mig", metavar="GPU:GI:CI[:PROFILE],...", help="MIG devices to create")
    c.add_argument("--no-uvm", action="store_true", help="as if nvidia-uvm were not loaded")
    c.add_argument("--pad-ldcache", type=int, default=0, metavar="N",
                   help="add N small libraries to the loader cache")
    c.add_argument("--lib-version", metavar="VERSION",
                   help="version of the user-space libraries (default: the driver's)")
    c.add_argument("--hcas", type=int, default=0, metavar="N",
                   help="RDMA adapters mlx5_0..N-1, HCA k under GPU k's PCIe switch (default 0)")
    c.add_argument("--cxis", type=int, default=0, metavar="N",
                   help="HPE Slingshot NICs cxi0..N-1 (/dev/cxiN), NIC k under GPU k's PCIe switch")
    c.add_argument("--link", choices=("ib", "roce"), default="ib",
                   help="the HCAs' link layer: InfiniBand or Ethernet/RoCE (default ib)")
    c.add_argument("--gpudirect", action="store_true",
                   help="GPUDirect pieces: /dev/gdrdrv, /dev/nvidia-fs*, nvidia-peermem loaded")
    c.add_argument("--nvswitches", type=int, default=0, metavar="N",
                   help="NVSwitch nodes /dev/nvidia-nvswitch0..N-1 and nvidia-nvswitchctl")
    c.add_argument("--imex-channels", type=int, default=0, metavar="N",
                   help="IMEX channel nodes /dev/nvidia-caps-imex-channels/channel0..N-1")
    c.add_argument("--json", action="store_true", help="print the description as JSON")
    d = sub.add_parser("destroy", help="remove a simulated host made by create",
                       description="Remove a simulated GPU host that sim create wrote into DIR "
                       "(refused for a directory it did not write).")
    d.add_argument("dir", metavar="DIR", help="the host to remove")
    return p


def describe(info):
    """What `sim create` prints: the GPUs, the roots, and a sandbox to try."""
    import shlex
    lines = [f"simulated GPU host in {info['root']}: {len(info['gpus'])} GPU(s), driver "
             f"{info['driver_version']}, CUDA {info['cuda_version']}"]
    for g in info["gpus"]:
        lines.append(f"  GPU {g['index']}  /dev/nvidia{g['minor']}  {g['bus_id']}  {g['model']}  "
                     f"{g['uuid']}")
        for m in g["mig"]:
            lines.append(f"    MIG {m['profile']:<10} gi {m['gi']} ci {m['ci']}  {m['uuid']}")
    for h in info.get("fabric", {}).get("hcas", ()):
        lines.append(f"  HCA {h['name']}  /dev/infiniband/uverbs{h['uverbs']}  {h['bus_id']}  "
                     f"{h['link_layer']}  NUMA {h['numa']}"
                     + (f"  beside GPU {h['gpu']}" if h["gpu"] is not None else ""))
    for c in info.get("fabric", {}).get("cxis", ()):
        lines.append(f"  CXI {c['name']}  /dev/{c['name']}  {c['bus_id']}  Slingshot  "
                     f"NUMA {c['numa']}" + (f"  beside GPU {c['gpu']}" if c["gpu"] is not None
                                            else ""))
    lines.append(f"driver root: {info['root']}  dev root: {info['dev_root']}")
    roots = ["--driver-root", info["root"]]
    if info["dev_root"] != info["root"].rstrip("/") + "/dev":
        roots += ["--dev-root", info["dev_root"]]
    # `/` (the host's own userland) runs as it is, rootless or as root: no
    # image to build before the first try.
    try_cmd = shlex.join(["gpusandbox", "run", *roots, "--gpus", "0", "/", "nvidia-smi", "-L"])
    lines.append(f"try: {try_cmd}")
    lines.append("     (/ is this host's own userland, read-only; any image works in its place)")
    return lines


def main(argv=None):
    """`gpusandbox sim create|destroy ...`; raises SandboxError for the CLI to print."""
    args = parser().parse_args(argv)
    if args.command == "destroy":
        destroy(args.dir)
        return 0
    info = create(args.dir, gpus=args.gpus, driver_version=args.driver_version,
                  cuda_version=args.cuda_version, mig=args.mig,
                  model=args.model or (GEFORCE_MODEL if args.brand == "geforce" else DEFAULT_MODEL),
                  uvm=not args.no_uvm, pad_ldcache=args.pad_ldcache, lib_version=args.lib_version,
                  hcas=args.hcas, cxis=args.cxis, link=args.link, gpudirect=args.gpudirect,
                  nvswitches=args.nvswitches, imex_channels=args.imex_channels)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print("\n".join(describe(info)))
    return 0
