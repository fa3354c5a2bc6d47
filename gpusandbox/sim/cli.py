"""`gpusandbox sim create|destroy ...` (also `python -m gpusandbox.sim`)."""
import json

from .host import create, destroy
from .ids import DEFAULT_MODEL, GEFORCE_MODEL


def main(argv=None):
    """`gpusandbox sim create|destroy ...`; raises SandboxError for the CLI to print."""
    import argparse
    parser = argparse.ArgumentParser(prog="gpusandbox sim", description="A simulated GPU host for "
                                     "tests and demos on machines without a GPU.")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="write a simulated host into DIR (needs root once)")
    c.add_argument("dir", metavar="DIR")
    c.add_argument("--gpus", type=int, default=4)
    c.add_argument("--driver-version", default="550.54.15")
    c.add_argument("--cuda-version", default="12.4")
    c.add_argument("--model")
    c.add_argument("--brand", choices=("datacenter", "geforce"), default="datacenter")
    c.add_argument("--mig", metavar="GPU:GI:CI[:PROFILE],...", help="MIG devices to create")
    c.add_argument("--no-uvm", action="store_true", help="as if nvidia-uvm were not loaded")
    c.add_argument("--pad-ldcache", type=int, default=0, metavar="N",
                   help="add N small libraries to the loader cache")
    c.add_argument("--lib-version", help="version of the user-space libraries (default: the driver's)")
    c.add_argument("--json", action="store_true", help="print the description as JSON")
    d = sub.add_parser("destroy", help="remove a simulated host made by create")
    d.add_argument("dir", metavar="DIR")
    args = parser.parse_args(argv)
    if args.command == "destroy":
        destroy(args.dir)
        return 0
    info = create(args.dir, gpus=args.gpus, driver_version=args.driver_version,
                  cuda_version=args.cuda_version, mig=args.mig,
                  model=args.model or (GEFORCE_MODEL if args.brand == "geforce" else DEFAULT_MODEL),
                  uvm=not args.no_uvm, pad_ldcache=args.pad_ldcache, lib_version=args.lib_version)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    print(f"simulated GPU host in {info['root']}: {len(info['gpus'])} GPU(s), driver "
          f"{info['driver_version']}, CUDA {info['cuda_version']}")
    for g in info["gpus"]:
        print(f"  GPU {g['index']}  /dev/nvidia{g['minor']}  {g['bus_id']}  {g['model']}  {g['uuid']}")
        for m in g["mig"]:
            print(f"    MIG {m['profile']:<10} gi {m['gi']} ci {m['ci']}  {m['uuid']}")
    print(f"driver root: {info['root']}  dev root: {info['dev_root']}\n"
          f"try: {info['root']}/usr/bin/nvidia-smi -L")
    return 0
