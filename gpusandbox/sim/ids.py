"""What the simulated GPUs are called: their UUIDs, MIG instances and the
nvidia-caps minors, as the driver and simcommon.c number them."""
import hashlib
import os
import re

from gpusandbox.errors import UsageError

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
GEFORCE_MODEL = "NVIDIA GeForce RTX 4090"


def gpu_uuid(root, index):
    """The GPU UUID of host GPU `index`: derived from the root, so reruns agree."""
    digest = hashlib.sha1(f"gpusandbox-sim:{os.path.realpath(root)}:{index}".encode()).digest()
    return "GPU-" + _dashed(digest[:16])


def mig_uuid(gpu, gi, ci):
    """MIG-<uuid> of instance gi/ci on GPU `gpu` (a GPU- UUID); simcommon.c agrees."""
    key = f"{gpu}/gi{gi}/ci{ci}".encode()
    return "MIG-" + _dashed(_fnv(key, 0xCBF29CE484222325).to_bytes(8, "big")
                            + _fnv(key, 0x84222325CBF29CE4).to_bytes(8, "big"))


def mig_minor(gpu, gi, ci=None):
    """The nvidia-caps minor of gpuN/giM/access (ci None) or gpuN/giM/ciK/access.

    nv-caps.c numbers one static table in order: fabric-mgmt 0, mig/config 1,
    mig/monitor 2, then per GPU (32) per GI (15) the GI entry and its 8 CIs.
    """
    base = 3 + gpu * 135 + gi * 9
    return base if ci is None else base + 1 + ci


def _fnv(data, h):
    mask = 0xFFFFFFFFFFFFFFFF
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & mask
    h = ((h ^ (h >> 33)) * 0xFF51AFD7ED558CCD) & mask
    h = ((h ^ (h >> 33)) * 0xC4CEB9FE1A85EC53) & mask
    return h ^ (h >> 33)


def _dashed(raw):
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def parse_mig(spec, gpus, model):
    """'0:1:0,0:2:0[:profile]' -> {gpu: {gi: profile}}, {gpu: [(gi, ci)]}."""
    instances, profiles = {}, {}
    for item in filter(None, (spec or "").split(",")):
        parts = item.strip().split(":")
        try:
            gpu, gi, ci = (int(p) for p in parts[:3])
            profile = parts[3] if len(parts) == 4 else None
            if len(parts) not in (3, 4) or not (0 <= gpu < gpus and 0 <= gi < 15 and 0 <= ci < 8) \
                    or (profile is not None and not re.match(r"^\d+g\.\d+gb(\+[a-z]+)?$", profile)):
                raise ValueError
        except ValueError:
            raise UsageError(f"bad --mig item {item!r}", "expected GPU:GI:CI[:PROFILE] with "
                             f"GPU < {gpus}, GI 0-14, CI 0-7, PROFILE like 3g.40gb",
                             hint="e.g. --mig 0:1:0,0:2:0") from None
        instances.setdefault(gpu, []).append((gi, ci))
        if profile:
            profiles.setdefault(gpu, {})[gi] = profile
    total = int(m.group(1)) if (m := re.search(r"(\d+)\s*GB", model, re.I)) else 80
    for gpu, pairs in instances.items():
        gis = sorted({gi for gi, _ in pairs})
        if len(gis) > 7 or len(pairs) > 7:
            raise UsageError(f"bad --mig for GPU {gpu}", "a GPU holds at most 7 MIG devices")
        slices = max(s for s in (1, 2, 3, 4, 7) if s * len(gis) <= 7)
        eighths = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}[slices]
        for gi in gis:
            profiles.setdefault(gpu, {}).setdefault(gi, f"{slices}g.{total * eighths // 8}gb")
        instances[gpu] = sorted(set(pairs))
    return instances, profiles
