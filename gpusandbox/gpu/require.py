"""The image's GPU requirements, checked against the host before launch.

An image states what it needs in NVIDIA_REQUIRE_* variables (the grammar of
NVIDIA's container stack: space = OR, comma = AND, operators = != < <= > >=,
keys cuda/driver/arch compare dotted numbers, brand compares names).  Older
images carry only CUDA_VERSION=X.Y.Z, which means cuda>=X.Y; images with
neither still carry a CUDA runtime whose version is the real floor.  When the
host driver cannot serve that CUDA release, the job would fail minutes later
with "CUDA driver version is insufficient for CUDA runtime version"; refusing
before the launch turns that into one line with the two ways out.

Evaluation is three-valued: a constraint on a fact the host cannot tell (a
GPU model missing from the table below, no readable CUDA ceiling) is
"unknown", which lets the launch go ahead with a warning, the way NVIDIA's
stack passes constraints it cannot evaluate.

On the launch path: imports only os and our own small modules; json is
loaded only when a toolkit version.json has to be read.
"""
import os

from gpusandbox.errors import GpuError
from gpusandbox import number, short
from gpusandbox.gpu import disabled, requirements  # noqa: F401 - what the image asks (the package's)


# Two-character operators first so that "<=" is not read as "<".
_OPS = ("<=", ">=", "!=", "<", ">", "=")
_OP_CHARS = "<>=!"
_VERSION_KEYS = ("cuda", "driver", "arch")
_NAME_KEYS = ("brand",)

# First Linux x86_64 driver of each CUDA release (the GA row of "CUDA Toolkit
# and Corresponding Driver Versions" in the CUDA toolkit release notes).
MIN_DRIVER = {
    (9, 0): "384.81", (9, 1): "390.46", (9, 2): "396.26",
    (10, 0): "410.48", (10, 1): "418.39", (10, 2): "440.33",
    (11, 0): "450.36.06", (11, 1): "455.23", (11, 2): "460.27.03",
    (11, 3): "465.19.01", (11, 4): "470.42.01", (11, 5): "495.29.05",
    (11, 6): "510.39.01", (11, 7): "515.43.04", (11, 8): "520.61.05",
    (12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03",
    (12, 3): "545.23.06", (12, 4): "550.54.14", (12, 5): "555.42.02",
    (12, 6): "560.28.03", (12, 8): "570.26", (12, 9): "575.51.03",
    (13, 0): "580.65.06", (13, 1): "590.44.01", (13, 2): "595.45.04",
}

# Compute capability by model-name token.  /proc/driver/nvidia/gpus/*/
# information names the model ("NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-
# 16GB") but not the architecture, so the common parts are listed here.
_ARCH_BY_TOKEN = {
    "K80": "3.7", "K40": "3.5", "K40M": "3.5", "K20": "3.5",
    "M60": "5.2", "M40": "5.2", "M10": "5.0", "M4": "5.2",
    "P100": "6.0", "P40": "6.1", "P4": "6.1", "P6": "6.1",
    "V100": "7.0", "V100S": "7.0", "TITAN V": "7.0",
    "T4": "7.5", "T4G": "7.5", "T400": "7.5", "T600": "7.5", "T1000": "7.5",
    "A100": "8.0", "A800": "8.0", "A30": "8.0",
    "A10": "8.6", "A10G": "8.6", "A16": "8.6", "A2": "8.6", "A40": "8.6",
    "A2000": "8.6", "A4000": "8.6", "A4500": "8.6", "A5000": "8.6",
    "A5500": "8.6", "A6000": "8.6",
    "L4": "8.9", "L40": "8.9", "L40S": "8.9", "L20": "8.9",
    "H100": "9.0", "H200": "9.0", "H800": "9.0", "H20": "9.0", "GH200": "9.0",
    "B100": "10.0", "B200": "10.0", "GB200": "10.0",
    "B300": "10.3", "GB300": "10.3",
}
# GeForce/TITAN/Quadro RTX numbering: the series (first two digits of the
# four-digit number) fixes the architecture.
_ARCH_BY_SERIES = {"9": "5.2", "10": "6.1", "16": "7.5", "20": "7.5",
                   "30": "8.6", "40": "8.9", "50": "12.0"}
_ARCH_WORKSTATION = {"RTX 4000": "7.5", "RTX 5000": "7.5", "RTX 6000": "7.5",
                     "RTX 8000": "7.5", "TITAN RTX": "7.5", "TITAN XP": "6.1"}
# The brands (gpu_brand, lower case) of data-center GPUs.
DATACENTER_BRANDS = ("tesla", "nvidia")

# A fact that satisfies every constraint on it: arch and brand when no GPU
# is selected (nothing in the sandbox can disagree with them).
ANY = "*"




# --- the grammar ------------------------------------------------------------

def _version(text, what):
    parts = text.split(".")
    nums = [number(p) for p in parts]
    if not text or len(parts) > 8 or None in nums:
        raise GpuError(f"invalid version {short(text)} in {short(what, 120)}",
                       hint="versions are dotted numbers such as 12.4 or 550.54.15")
    while len(nums) > 1 and nums[-1] == 0:  # 12.4 == 12.4.0
        nums.pop()
    return tuple(nums)


def parse_constraint(expr, source="constraint"):
    """Parse one constraint expression into OR-of-AND form.

    Returns a list of alternatives, each a list of (key, op, value) atoms,
    keys lower-cased.  Raises GpuError naming `source` on a malformed atom."""
    alternatives = []
    for alt in expr.split():
        atoms = []
        for atom in alt.split(","):
            if not atom:
                continue
            atoms.append(_parse_atom(atom, expr, source))
        if atoms:
            alternatives.append(atoms)
    return alternatives


def _parse_atom(atom, expr, source):
    i = 0
    while i < len(atom) and atom[i] not in _OP_CHARS:
        i += 1
    j = i
    while j < len(atom) and atom[j] in _OP_CHARS:
        j += 1
    key, op, value = atom[:i].strip().lower(), atom[i:j], atom[j:].strip()
    where = f"{source}={expr}" if len(expr) <= 200 else f"{source}"
    hint = ("a constraint is KEY OP VALUE with KEY cuda, driver, arch or brand "
            "and OP one of = != < <= > >=; space separates alternatives, "
            "comma joins conditions")
    if not key or op not in _OPS or not value:
        raise GpuError(f"invalid requirement {short(atom)} in {where}", hint=hint)
    if key in _VERSION_KEYS:
        _version(value, where)
    elif key in _NAME_KEYS:
        if op not in ("=", "!="):
            raise GpuError(f"invalid requirement {short(atom)} in {where}",
                           why="brand compares names with = or != only", hint=hint)
    else:
        raise GpuError(f"invalid requirement {short(atom)} in {where}",
                       why=f"unknown key {short(key)}", hint=hint)
    return key, op, value


def _compare(key, have, op, want):
    """True/False, or None when the host fact is unknown."""
    if have is None:
        return None
    if have == ANY:
        return True
    if key in _NAME_KEYS:
        same = have.lower() == want.lower()
        return same if op == "=" else not same
    a, b = _version(have, f"host {key}"), _version(want, key)
    return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b,
            ">": a > b, ">=": a >= b}[op]


def evaluate(constraint, facts):
    """Evaluate a constraint (text or parse_constraint() output) on facts.

    facts maps cuda/driver/arch/brand to a string, None when unknown, or ANY.
    Kleene logic: AND is False if any atom is False, else None if any is
    unknown; OR is True if any alternative is True, else None if any is
    unknown.  Returns True, False or None."""
    alts = parse_constraint(constraint) if isinstance(constraint, str) else constraint
    verdict = False if alts else True
    for atoms in alts:
        alt = True
        for key, op, value in atoms:
            r = _compare(key, facts.get(key), op, value)
            if r is False:
                alt = False
                break
            if r is None:
                alt = None
        if alt is True:
            return True
        if alt is None:
            verdict = None
    return verdict


# --- what the image asks for -------------------------------------------------

# --- what the host offers ------------------------------------------------------

def _model_tokens(model):
    words = model.upper().replace("-", " ").replace("_", " ").split()
    return [w for w in words if w not in ("NVIDIA", "TESLA", "GEFORCE", "QUADRO")]


def gpu_arch(model):
    """Compute capability "major.minor" for a model name, or None if unknown."""
    if not model:
        return None
    up = " ".join(model.upper().replace("-", " ").split())
    for name, arch in _ARCH_WORKSTATION.items():
        if name in up and "ADA" not in up and "BLACKWELL" not in up:
            return arch
    words = _model_tokens(model)
    if "ADA" in words:           # RTX 6000 Ada Generation, RTX 4000 SFF Ada
        return "8.9"
    if "BLACKWELL" in words:     # RTX PRO 6000 Blackwell
        return "12.0"
    for i, w in enumerate(words):
        if w in _ARCH_BY_TOKEN:
            return _ARCH_BY_TOKEN[w]
        if i + 1 < len(words) and f"{w} {words[i + 1]}" in _ARCH_BY_TOKEN:
            return _ARCH_BY_TOKEN[f"{w} {words[i + 1]}"]
        if w in ("RTX", "GTX") and i + 1 < len(words) and words[i + 1].isdigit():
            num = words[i + 1]
            series = num[:1] if len(num) == 3 else num[:2]
            return _ARCH_BY_SERIES.get(series)
    return None


def gpu_brand(model):
    """NVML-style brand name for a model name, or None if unknown."""
    if not model:
        return None
    up = " ".join(model.upper().split())
    if up.startswith("TESLA"):
        return "Tesla"
    if "QUADRO RTX" in up:
        return "QuadroRTX"
    if "QUADRO" in up:
        return "Quadro"
    if "GEFORCE" in up:
        return "GeForce"
    if "TITAN" in up:
        return "Titan"
    if up.startswith("NVS"):
        return "NVS"
    if up.startswith("NVIDIA RTX"):
        return "NvidiaRTX"
    if up.startswith("NVIDIA ") and gpu_arch(model) is not None:
        return "Nvidia"
    return None


def is_datacenter(brand):
    """Whether a brand (gpu_brand) is a data-center GPU's, the only kind CUDA
    forward compatibility supports (compat.py); None when it is unknown."""
    return None if not brand else brand.lower() in DATACENTER_BRANDS


def host_facts(host, gpus=None, ceiling=None):
    """Facts per GPU: a list of dicts (one per GPU, or one with no GPU facts
    when none is selected, in which case arch/brand constraints hold: there is
    no device to disagree with them)."""
    cuda = f"{ceiling[0]}.{ceiling[1]}" if ceiling else None
    driver = getattr(host, "version", None)
    base = {"cuda": cuda, "driver": driver}
    devices = list(getattr(host, "gpus", []) if gpus is None else gpus)
    if not devices:
        return [dict(base, arch=ANY, brand=ANY, gpu=None)]
    out = []
    for g in devices:
        model = getattr(g, "model", None)
        arch = getattr(g, "arch", None) or gpu_arch(model)
        brand = getattr(g, "brand", None) or gpu_brand(model)
        out.append(dict(base, arch=arch, brand=brand, gpu=g))
    return out


# --- the check -------------------------------------------------------------------

def min_driver_for(version):
    """(release, driver) of the first CUDA release >= version with a known
    minimum driver, or None."""
    want = _version(version, "cuda")[:2]
    for rel in sorted(MIN_DRIVER):
        if rel >= want:
            return rel, MIN_DRIVER[rel]
    return None


def check(image_env, image_root, host, ceiling=None, environ=None, *, gpus=None,
          no_require=False, compat=None, reqs=None):
    """Refuse a launch whose image needs more than the host offers.

    image_env: the image's variables (dict); image_root: its root directory
    (the launcher's held fd, or a path), read only through read_in_root/openat2
    (None: do not look at files).
    ceiling: (major, minor) of the CUDA release the host driver supports, or
    a callable returning it or None (unknown); None asks the host's libcuda
    through gpusandbox.gpu.ceiling.  Either way it is computed only when a
    constraint mentions cuda, so images without one never pay for the helper.
    image_env: the sandbox's variables from the image, --env-file and -e (the
    environment table's rows 3, 5 and 6; the GPU rows are ours and the host
    rows the caller's): NVIDIA_REQUIRE_*, CUDA_VERSION, NVIDIA_DISABLE_REQUIRE.
    environ: the caller's environment (NVIDIA_DISABLE_REQUIRE), default os.environ.
    gpus: the selected GPUs (Selection.node_gpus()); default all of host.gpus.
    compat: the launch's gpu.compat.Decision, or None (not known): CUDA
    images' `brand=...,driver>=N,driver<N+1` terms hold only through the
    image's forward-compatibility libraries, so with a Decision that does not
    use them such a term no longer carries an image the host's CUDA is too old for.
    reqs: requirements(image_env, image_root) when the caller has them already.
    Returns None, or a one-line "warning: ..." for the launcher to print
    after its "gpusandbox: " prefix; raises
    GpuError (exit code 125) when a constraint fails."""
    environ = os.environ if environ is None else environ
    if ceiling is None:
        def ceiling():
            from gpusandbox.gpu import ceiling as _ceiling
            return _ceiling.driver_cuda_version(host)
    elif not (callable(ceiling) or isinstance(ceiling, tuple)):
        raise TypeError(f"ceiling must be (major, minor), a callable or None, not {type(ceiling).__name__}")
    if no_require or disabled(image_env) or disabled(environ):
        why = ("--no-require" if no_require else
               "NVIDIA_DISABLE_REQUIRE is set in the sandbox's environment"
               if disabled(image_env) else "NVIDIA_DISABLE_REQUIRE is set")
        return (f"warning: image requirement check skipped ({why}); a CUDA release "
                "newer than the host driver fails at run time with 'CUDA driver "
                "version is insufficient for CUDA runtime version'")
    reqs = [(src, expr, parse_constraint(expr, src)) for src, expr in
            (requirements(image_env, image_root) if reqs is None else reqs)]
    if not reqs:
        return None
    if callable(ceiling):
        needs_cuda = any(k == "cuda" for _, _, alts in reqs for atoms in alts
                         for k, _, _ in atoms)
        ceiling = ceiling() if needs_cuda else None
    unknown = []
    for facts in host_facts(host, gpus, ceiling):
        for src, expr, alts in reqs:
            verdict = evaluate(alts, facts)
            if verdict is False:
                raise _failure(src, expr, alts, facts)
            if verdict is True and compat is not None and not compat.use:
                via = _only_via_compat(alts, facts)
                if via:
                    raise _compat_failure(src, via, alts, facts, compat)
            if verdict is None:
                unknown.append((src, expr, facts))
    if unknown:
        src, expr, facts = unknown[0]
        missing = [k for k in ("cuda", "driver", "arch", "brand") if facts.get(k) is None]
        gpu = facts.get("gpu")
        model = f" of {getattr(gpu, 'model', None)!r}" if gpu is not None else ""
        return (f"warning: could not check the image's requirement {expr} ({src}): "
                f"the host's {'/'.join(missing)}{model} is unknown; launching anyway")
    return None


def _ways_out(want, driver, facts):
    from .cudatable import ways_out
    return ways_out(want, driver, _datacenter(facts))


def _only_via_compat(alts, facts):
    """The brand/driver alternative that alone makes the constraint hold
    while every alternative naming cuda fails; None otherwise."""
    cuda_alts = [a for a in alts if any(k == "cuda" for k, _, _ in a)]
    if not cuda_alts or any(evaluate([a], facts) is not False for a in cuda_alts):
        return None
    passing = [a for a in alts if a not in cuda_alts and evaluate([a], facts) is True]
    if passing and all(any(k == "brand" for k, _, _ in a) for a in passing):
        return passing[0]
    return None


def _datacenter(facts):
    return is_datacenter(facts.get("brand")) if facts.get("gpu") is not None else None


def _compat_failure(src, via, alts, facts, compat):
    from .cudatable import ways_out
    want = next(v for a in alts for k, op, v in a if k == "cuda")
    term = ",".join(f"{k}{op}{v}" for k, op, v in via)
    driver = facts.get("driver") or "unknown"
    notes = ways_out(want, driver, _datacenter(facts))
    return GpuError(
        f"image requires cuda>={want} ({src})",
        why=f"the host driver {driver} supports CUDA up to {facts.get('cuda')}, and the "
            f"image's term {term} holds only through its forward-compatibility libraries, "
            f"which this launch does not use: {compat.reason}",
        hint="; ".join(notes + ["--no-require or NVIDIA_DISABLE_REQUIRE=true skips this check"]))


def _failure(src, expr, alts, facts):
    first_alt = alts[0]
    failed = [(k, op, v) for k, op, v in first_alt if _compare(k, facts.get(k), op, v) is False]
    cuda_atoms = [a for a in failed if a[0] == "cuda"]
    ceiling = facts.get("cuda")
    driver = facts.get("driver") or "unknown"
    skip = "--no-require or NVIDIA_DISABLE_REQUIRE=true skips this check"
    if cuda_atoms:
        _, op, want = cuda_atoms[0]
        need = min_driver_for(want) if op in (">=", ">", "=") else None
        if need:
            (ma, mi), drv = need
            later = "" if _version(want, "cuda")[:2] == (ma, mi) else f", the first for CUDA {ma}.{mi}"
            way2 = f"a host driver that supports CUDA {want} (Linux driver {drv} or newer{later})"
        else:
            way2 = f"a host driver that supports CUDA {want}"
        return GpuError(
            f"image requires cuda{op}{want} ({src})",
            why=f"the host driver {driver} supports CUDA up to {ceiling}",
            hint=f"use an image built for CUDA {ceiling} or older, or install {way2}; "
                 + "".join(n + "; " for n in _ways_out(want, driver, facts)) + skip)
    gpu = facts.get("gpu")
    have = [f"driver {driver}", f"CUDA {ceiling or 'unknown'}"]
    if gpu is not None:
        have.insert(0, f"GPU {getattr(gpu, 'model', '?')!r} (arch {facts.get('arch') or 'unknown'}, "
                       f"brand {facts.get('brand') or 'unknown'})")
    cond = ",".join(f"{k}{op}{v}" for k, op, v in (failed or first_alt))
    return GpuError(
        f"image requires {cond} ({src})",
        why="the host has " + ", ".join(have),
        hint="select GPUs that satisfy it with --gpus, use an image without this "
             f"requirement, or run on a host that meets it; {skip}")
