"""What a launch asks of the GPU layer, parsed once, the same way for every door.

A GpuRequest is pure data read from the door's inputs, before any host is
looked at; gpu/select.py then resolves it against the host (discover.Host)
into a Selection.  Two kinds of door, each with its own inputs:

  the caller's doors  `run` (and `gpu report`, `doctor`): --gpus, --gpu-caps,
                      --device VENDOR/CLASS=NAME and the CALLER's environment.
                      The image's environment never selects anything: an
                      image's NVIDIA_VISIBLE_DEVICES=all must not widen what the
                      host side granted.
  the config doors    `gpusandbox-oci create`, the runtime wrapper, the
                      precreate filter and the OCI hook: a config.json's
                      process.env (the container's environment, as the engine
                      merged the image's Env and its -e) and its annotations.
                      The caller's environment never selects anything there
                      (it only names the driver root: settings.py).

The precedence, one row per field (docs/gpu-request.md has the same table,
with the reasons):

  field        | 1st        | 2nd                        | 3rd                    | else
  devices      | --gpus     | a Slurm step's GPUs (auto) | NVIDIA_VISIBLE_DEVICES | no GPU support
  capabilities | --gpu-caps | NVIDIA_DRIVER_CAPABILITIES |                        | utility,compute
  MIG config   | NVIDIA_MIG_CONFIG_DEVICES=all (config door: privileged only)   | not granted
  MIG monitor  | NVIDIA_MIG_MONITOR_DEVICES=all (config door: privileged only)  | not granted
  CDI devices  | --device V/C=N, or cdi.k8s.io/* annotations (in order), then the
               | CDI names of NVIDIA_VISIBLE_DEVICES when it is the one in effect | none

The options exist only at the caller's doors, Slurm only at `run`.
NVIDIA_VISIBLE_DEVICES unset, empty or `void` means no GPU support at all, and
then capabilities and MIG are not read; `none` means the driver files without
a GPU node.  It holds either GPU selectors or CDI names (`nvidia.com/gpu=0`,
the toolkit's CDI mode), never both.

Bad input raises one error naming its source: UsageError for an option,
GpuError for a variable or an annotation (exit code 125 for both).

Pure string work: imported only when a launch names a GPU input.
"""
from gpusandbox.errors import GpuError, UsageError

# The container variables a config door reads (and memo.py keys on); the
# caller's doors read the same names from the caller's environment.
SELECT_VARS = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
               "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES")
CDI_ANNOTATION = "cdi.k8s.io/"
DEFAULT_CAPS = ("compute", "utility")   # "utility,compute" in canonical order
SLURM = "Slurm step"
_VOID = ("", "void")
_MIG = (("mig_config", "NVIDIA_MIG_CONFIG_DEVICES"),
        ("mig_monitor", "NVIDIA_MIG_MONITOR_DEVICES"))


class GpuRequest:
    """devices: the selector text (None: no GPU support; "none", "all",
    "auto", "count=N" or a device list, resolved by gpu/select.py); caps: the
    driver capabilities (tuple, canonical order; None without devices);
    mig_config / mig_monitor: whether the MIG capability nodes are asked for;
    cdi: fully-qualified CDI device names, in order, each once; source: where
    each field came from ({field: "--gpus" | a variable | "default" | ...})."""
    __slots__ = ("devices", "caps", "mig_config", "mig_monitor", "cdi", "source")

    def __init__(self):
        self.devices = self.caps = None
        self.mig_config = self.mig_monitor = False
        self.cdi = ()
        self.source = {}

    def empty(self):
        """Nothing for the GPU layer to do."""
        return self.devices is None and not self.cdi

    def fields(self):
        """The request without its sources (what two doors must agree on)."""
        return (self.devices, self.caps, self.mig_config, self.mig_monitor, self.cdi)

    def __repr__(self):
        return (f"GpuRequest(devices={self.devices!r} caps={self.caps!r} "
                f"mig_config={self.mig_config} mig_monitor={self.mig_monitor} "
                f"cdi={self.cdi!r} source={self.source!r})")


def is_cdi_name(item):
    """vendor/class=name, as CDI qualifies a device."""
    kind, eq, name = item.partition("=")
    return bool(eq and name and "/" in kind)


def from_caller(gpus=None, caps=None, cdi=(), environ=None):
    """The request of a caller's door: --gpus, --gpu-caps and --device CDI
    names as given (None / empty when not), the caller's environment."""
    environ = environ or {}
    req = GpuRequest()
    _names(req, "--device", cdi)
    if gpus is not None:
        from gpusandbox.gpu.selector import normalise
        value = normalise(gpus)[0].strip()
        if not value:
            raise UsageError("--gpus ''", "empty selector",
                             hint="use --gpus all, none, or a list such as 0,1")
        req.source["devices"] = "--gpus"
        if value.lower() not in _VOID:
            req.devices = value
    elif _slurm_step(environ):
        req.devices, req.source["devices"] = "auto", SLURM
    else:
        _visible(req, environ)
    if req.devices is not None:
        req.caps, req.source["caps"] = _caps(caps, "--gpu-caps", UsageError) if caps is not None \
            else _caps(environ.get("NVIDIA_DRIVER_CAPABILITIES"), "NVIDIA_DRIVER_CAPABILITIES",
                       GpuError)
        _mig(req, environ, privileged=True)
    return req


def from_config(cfg):
    """The request of a config door: the config.json dict's process.env and
    cdi.k8s.io/* annotations.  The MIG variables are honoured only for a
    privileged container (CAP_SYS_ADMIN in its bounding set), as the
    reference stack does; an unprivileged one naming them is refused."""
    env = config_env(cfg)
    req = GpuRequest()
    ann = cfg.get("annotations") if isinstance(cfg, dict) else None
    for k, v in (ann.items() if isinstance(ann, dict) else ()):
        if isinstance(k, str) and k.startswith(CDI_ANNOTATION) and isinstance(v, str):
            _names(req, k, v.split(","))
    _visible(req, env)
    if req.devices is not None:
        req.caps, req.source["caps"] = _caps(env.get("NVIDIA_DRIVER_CAPABILITIES"),
                                             "NVIDIA_DRIVER_CAPABILITIES", GpuError)
        _mig(req, env, privileged=_privileged(cfg))
    return req


def config_env(cfg):
    """The selection variables of a config's process.env (last one wins, as
    execve's consumers see it); nothing else of it is read."""
    out = {}
    proc = cfg.get("process") if isinstance(cfg, dict) else None
    env = proc.get("env") if isinstance(proc, dict) else None
    for item in env if isinstance(env, list) else ():
        if isinstance(item, str):
            k, eq, v = item.partition("=")
            if eq and k in SELECT_VARS:
                out[k] = v
    return out


def _privileged(cfg):
    proc = cfg.get("process")
    caps = proc.get("capabilities") if isinstance(proc, dict) else None
    bounding = caps.get("bounding") if isinstance(caps, dict) else None
    return isinstance(bounding, list) and "CAP_SYS_ADMIN" in bounding


def _slurm_step(environ):
    if not (environ.get("SLURM_JOB_ID") or environ.get("SLURM_STEP_ID")):
        return False
    try:
        from gpusandbox import slurm
    except ImportError:
        return False
    return slurm.in_gpu_step(environ)


def _visible(req, env):
    """NVIDIA_VISIBLE_DEVICES: GPU selectors, or CDI names, never both."""
    var = "NVIDIA_VISIBLE_DEVICES"
    value = env.get(var)
    req.source["devices"] = var
    if value is None or value.strip().lower() in _VOID:
        return
    items = [i.strip() for i in value.split(",") if i.strip()]
    cdi = [i for i in items if is_cdi_name(i)]
    if cdi and len(cdi) != len(items):
        raise UsageError(f"{var}={value}", "mixes CDI names and GPU selectors",
                  hint="use one form: nvidia.com/gpu=0,nvidia.com/gpu=1 or 0,1")
    if cdi:
        _names(req, var, cdi)
    else:
        req.devices = value.strip()


def _names(req, source, names):
    have = list(req.cdi)
    for n in names:
        n = n.strip()
        if n and n not in have:
            have.append(n)
            req.source.setdefault("cdi", source)
    req.cdi = tuple(have)


def _caps(value, src, err):
    """(capabilities, source): `value` (None or blank: the default)."""
    if value is None or not value.strip():
        return DEFAULT_CAPS, "default"
    from gpusandbox.gpu.discover import CAPABILITIES
    asked = set()
    for item in value.split(","):
        item = item.strip().lower()
        if item == "all":
            return CAPABILITIES, src
        if item not in CAPABILITIES:
            raise err(f"{src} {value!r}", f"unknown capability {item!r}",
                      hint="use all or a comma list of " + ", ".join(CAPABILITIES))
        asked.add(item)
    return tuple(c for c in CAPABILITIES if c in asked), src


def _mig(req, env, privileged):
    """NVIDIA_MIG_CONFIG_DEVICES / NVIDIA_MIG_MONITOR_DEVICES: `all` grants
    the capability node (each is one node for the whole host), unset or
    empty does not; any other value is refused, as is a request from an
    unprivileged container."""
    for field, var in _MIG:
        value = (env.get(var) or "").strip()
        if not value:
            continue
        if value.lower() != "all":
            raise GpuError(f"{var}={value}",
                           "the MIG capability is one node for the whole host",
                           hint=f"set {var}=all to grant it, or leave {var} unset")
        if not privileged:
            raise GpuError(f"{var}={value}", f"only a privileged container may have the "
                           f"MIG {field[4:]} capability (CAP_SYS_ADMIN in "
                           "process.capabilities.bounding)",
                           hint=f"run the container privileged, or leave {var} unset")
        setattr(req, field, True)
        req.source[field] = var
