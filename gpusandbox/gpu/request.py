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

Pure string work: imported only when a launch names a GPU input (the run
parser's --gpus check, normalise, included).
"""
from gpusandbox.errors import GpuError, UsageError
from gpusandbox import isdigits

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


# --- --gpus as docker and podman users type it ----------------------------------
# The text of --gpus, as docker and podman users type it, made our selector.
#
# Our selector is a device list (`0,1`, UUIDs, bus ids, MIG), `all`, `none`,
# `auto` or `void` (gpu/select.py).  Docker's `--gpus` is a CSV list of
# `all`, `N` (a count), `count=N|all`, `device=LIST` (quoted to keep its
# commas: `--gpus '"device=1,2"'`) and `capabilities=...`.  Where the two
# agree or do not overlap docker's meaning is taken: `device=LIST` is LIST,
# `count=all` is `all`, and `count=N` stays `count=N` for select.py, which
# needs the host's GPUs to pick the first N.  A bare number stays a device
# index, as documented; `note` then says how to ask for docker's count.

_FORMS = "all, none, count=N, device=LIST or a list such as 0,1"


def _bad(text, why, hint=None):
    from gpusandbox import short
    return UsageError(f"invalid --gpus {short(text)}", why, hint or f"use --gpus {_FORMS}")


def _fields(text):
    if '"' not in text:
        return text.split(",")      # what csv_fields makes of it, without loading mountopt
    from gpusandbox.mountopt import csv_fields
    fields = csv_fields(text)
    if fields is None:
        raise _bad(text, "unbalanced double quote")
    return fields


def _key(item):
    """A device item as select.py compares it: indices by number, names
    without case (UUIDs and bus ids are hexadecimal)."""
    return str(int(item)) if isdigits(item) and len(item) < 10 else item.lower()


def normalise(text):
    """(selector, note): the selector select.py resolves, and a one-line
    note for the user or None.  Raises UsageError for a form that is not
    one, or a device named twice.  Idempotent on its own output."""
    if '"' not in text and "=" not in text and "," not in text:
        return text, _count_note(text.strip(), text)
    devices, count = [], None
    for field in _fields(text):
        key, eq, val = field.partition("=")
        key = key.strip().lower()
        if not eq:
            devices.append(field.strip())
        elif key == "device":
            devices += [v.strip() for v in val.split(",")]
        elif key == "count":
            if count is not None:
                raise _bad(text, "count= given twice")
            count = val.strip().lower()
        elif key == "capabilities":
            raise _bad(text, "capabilities are a separate option here",
                       f"use --gpu-caps {val.strip() or 'CAPS'}")
        else:
            raise _bad(text, f"unknown key {key + '='!r}")
    devices = [d for d in devices if d]
    if count is not None:
        if devices:
            raise _bad(text, "count= and a device list together",
                       "give one: --gpus count=N or --gpus device=LIST")
        if count == "all":
            return "all", None
        if not isdigits(count) or len(count) > 6:
            raise _bad(text, "count= takes a number or all", "example: --gpus count=2")
        if int(count) == 0:
            raise _bad(text, "count=0 selects no GPU",
                       "leave --gpus out for no GPU support, or --gpus none for the "
                       "driver files without a GPU")
        return f"count={int(count)}", None
    if not devices:
        raise _bad(text, "no device named")
    seen = set()
    for d in devices:
        k = _key(d)
        if k in seen:
            raise _bad(text, f"{d!r} is named twice", "name each GPU once, e.g. --gpus 0,1")
        seen.add(k)
    sel = ",".join(devices)
    note = None
    if len(devices) == 1 and not text.strip().lower().startswith(("device=", '"device=')):
        note = _count_note(devices[0], text)
    return sel, note


def _count_note(item, text):
    """A single bare number: ours is a device index, docker's a count."""
    if isdigits(item) and len(item) <= 4 and int(item) >= 1:
        n = int(item)
        return (f"--gpus {item} is the GPU with index {n}, not docker's count: for "
                f"{n} GPU{'s' if n > 1 else ''} use --gpus count={n} (--gpus device={n} "
                "selects the index without this note)")
    return None
