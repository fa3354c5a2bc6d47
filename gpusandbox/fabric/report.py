"""The fabric's part of `gpusandbox info` and `gpusandbox list` (gpu/report.py
calls these): what discovery sees, and what a launch would be given."""
from . import discover, inject, select


def _near(nic, host, gpus):
    near = []
    for g in gpus:
        path = discover.gpu_pci_path(host.sys_root, g.bus_id)
        if select.distance(path, discover.gpu_numa(path), nic) == 0:
            near.append(g.index)
    return near


def _hca(h, host, gpus):
    near = _near(h, host, gpus)
    return {"name": h.name, "bus_id": h.bus_id, "numa": h.numa, "link": h.link(),
            "ports": [{"port": p, "state": s} for p, s, _ in h.ports],
            "uverbs": h.uverbs.host_path if h.uverbs else None,
            "same_switch_gpus": near}


def _cxi(c, host, gpus):
    return {"name": c.name, "bus_id": c.bus_id, "numa": c.numa, "link_up": c.link_up,
            "node": c.node.host_path if c.node else None,
            "same_switch_gpus": _near(c, host, gpus)}


def info_data(host, gpus):
    """The `fabric` group of `info --json`."""
    return {
        "hcas": [_hca(h, host, gpus) for h in host.hcas],
        "cxis": [_cxi(c, host, gpus) for c in host.cxis],
        "rdma_cm": host.rdma_cm.host_path if host.rdma_cm else None,
        "gdrcopy": host.gdrdrv.host_path if host.gdrdrv else None,
        "gds_nodes": len(host.nvfs),
        "nvswitch_nodes": [n.host_path for n in host.nvswitch],
        "imex_channels": sorted(host.imex),
        "gpudirect_rdma": host.peermem,
        "problems": list(host.problems),
    }


def info_lines(data):
    out = []
    for h in data["hcas"]:
        ports = ",".join(f"{p['port']}:{p['state'].split(': ')[-1]}" for p in h["ports"])
        near = (f"  beside gpu {','.join(map(str, h['same_switch_gpus']))}"
                if h["same_switch_gpus"] else "")
        out.append(f"hca {h['name']}: {h['link'] or 'link unknown'}  bus {h['bus_id']}  "
                   f"numa {h['numa']}  ports {ports or 'none'}{near}")
    for c in data.get("cxis", ()):
        near = (f"  beside gpu {','.join(map(str, c['same_switch_gpus']))}"
                if c["same_switch_gpus"] else "")
        link = {True: "up", False: "down", None: "unknown"}[c["link_up"]]
        out.append(f"cxi {c['name']}: Slingshot  bus {c['bus_id']}  numa {c['numa']}  "
                   f"link {link}{near}")
    if not data["hcas"] and not data.get("cxis"):
        out.append("hca: none (/sys/class/infiniband is empty): NCCL and MPI use TCP")
    extras = [f"gdrcopy {'yes' if data['gdrcopy'] else 'no'}",
              f"gds nodes {data['gds_nodes']}", f"nvswitch nodes {len(data['nvswitch_nodes'])}",
              f"imex channels {len(data['imex_channels'])}",
              f"gpudirect rdma (nvidia-peermem) {'yes' if data['gpudirect_rdma'] else 'no'}"]
    out.append("fabric: " + ", ".join(extras))
    out += [f"problem: {p}" for p in data["problems"]]
    return out


def list_data(host, option, environ, gpus):
    """The `fabric` group of `list --json`: the HCAs a launch with these
    GPUs would get and why, the nodes, and the variables set."""
    req = select.from_caller(option, environ, bool(gpus))
    res = inject.build(req, host, gpus, environ)
    return {"request": req.hcas if isinstance(req.hcas, str) else ",".join(req.hcas),
            "source": req.source,
            "hcas": [{"name": h.name, "why": why} for h, why in res.hcas],
            "cxis": [{"name": c.name, "why": why} for c, why in res.cxis],
            "devices": [n.host_path for n in res.edits.device_nodes],
            "env": dict(res.edits.env), "warnings": res.warnings}
