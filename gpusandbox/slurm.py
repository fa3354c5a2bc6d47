"""Slurm allocation -> the GPUs a sandbox gets for `--gpus auto`.

Inside a Slurm step, `auto` (and the default when the step has a GPU allocation)
means exactly the GPUs Slurm gave this task.  Slurm's own variables are not
enough on their own:

- SLURM_STEP_GPUS / SLURM_JOB_GPUS are positions in the node's gres.conf
  `Name=gpu File=...` list, not /dev/nvidia minors and not nvidia-smi indices.
- Under ConstrainDevices, CUDA_VISIBLE_DEVICES is renumbered from 0, and with
  per-task binding (--gpus-per-task, --gpu-bind) Slurm 22.05 also constrains each
  task's device cgroup and rewrites SLURM_STEP_GPUS per task in ways that do not
  name the task's device (observed: both tasks of a step reporting `0`).

So the rule is, in this order:

1. Probe.  Open every host GPU node (dev_root/nvidia<minor>) with
   O_RDWR|O_NONBLOCK|O_CLOEXEC.  The device cgroup check runs in the kernel's
   inode permission check, before the driver is reached, so EPERM (or EACCES)
   means "not ours"; success, ENXIO or ENODEV (node exists, driver absent or
   busy) means "this task may use it".  Nothing is kept open.
2. Some nodes denied (ConstrainDevices): the allowed set is the allocation.
   Its size is cross-checked with Slurm's count for this task: the number of
   CUDA_VISIBLE_DEVICES entries, else SLURM_STEP_GPUS, else SLURM_JOB_GPUS,
   else SLURM_GPUS_ON_NODE.
   - allowed size == that count: the allowed set is the answer;
   - allowed set larger (per-task binding without per-task cgroups):
     CUDA_VISIBLE_DEVICES holds local indices into the allowed set ordered by
     gres.conf position, or GPU UUIDs;
   - anything else is a mismatch and an error, never a guess.
3. Nothing denied (no ConstrainDevices): SLURM_STEP_GPUS (else SLURM_JOB_GPUS)
   are gres.conf positions.  The gres.conf next to $SLURM_CONF (default
   /etc/slurm/slurm.conf) is read for the `Name=gpu` File= list of this node
   (SLURMD_NODENAME); when it cannot be read or lists no device files for
   this node, positions cannot be mapped to devices, and a launch that needs
   the mapping (any allocation short of every GPU) is refused with the fixes,
   never resolved by assuming minor order.  A per-task CUDA_VISIBLE_DEVICES with fewer entries than the
   step then narrows the step's set: entries are gres positions (or UUIDs), and
   local indices into the step's set if they are not all in the step.
   Without CUDA_VISIBLE_DEVICES, a per-task binding (SLURMD_TRES_BIND=
   gpu:per_task:N) with SLURM_LOCALID picks the task's block of the step's set.
4. A step without GPUs inside a GPU job (srun --gres=none) inherits
   SLURM_JOB_GPUS but has neither SLURM_STEP_GPUS nor SLURM_GPUS_ON_NODE: it
   gets `none`.  --gpu-bind=none without ConstrainDevices leaves only a count
   (SLURM_GPUS_ON_NODE); that is refused rather than guessed.
5. Outside Slurm, `auto` is the caller's NVIDIA_VISIBLE_DEVICES, else
   CUDA_VISIBLE_DEVICES (both passed through as selectors), else `none`.

Everything here is plain os calls: this runs on the launch path, so no
subprocess (no `scontrol`), no regular expressions, no json.
"""
import errno
import os

from .errors import GpuError
from . import isdigits

_ALLOC_VARS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
_HINT = ("pass explicit --gpus N,M, or ask the admin to check gres.conf "
         "and ConstrainDevices in cgroup.conf")


def in_gpu_step(environ):
    """True inside a Slurm job or step that holds a GPU allocation on this node."""
    if not (environ.get("SLURM_STEP_ID") or environ.get("SLURM_JOB_ID")):
        return False
    return any(environ.get(v) for v in _ALLOC_VARS + ("SLURM_GPUS_ON_NODE",))


def resolve_auto(environ, host, probe=None):
    """Selector string ('0,2' of host GPU indices, 'all' or 'none') for `--gpus auto`.

    `probe(path)` returns True (may open), False (denied) or None (no such node);
    tests inject one, the default opens the node."""
    if not in_gpu_step(environ):
        return _outside_slurm(environ)
    probe = probe or probe_node
    gpus = sorted(host.gpus, key=lambda g: g.minor)
    if not gpus:
        raise GpuError("--gpus auto: Slurm allocated GPUs but the host has none",
                       why=f"{_ALLOC_VARS[0]}={environ.get(_ALLOC_VARS[0], '')}", hint=_HINT)
    order, known = _gres_order(environ, gpus)
    verdict = {g.minor: probe(_node_path(host, g)) for g in gpus}
    allowed = [g for g in order if verdict.get(g.minor)]
    denied = [g for g in gpus if verdict[g.minor] is False]
    cvd = _cvd(environ)
    if denied:
        chosen = _constrained(environ, allowed, cvd, known)
    else:
        chosen = _unconstrained(environ, order, cvd, known)
    if not chosen:
        return "none"
    return ",".join(str(g.index) for g in sorted(chosen, key=lambda g: g.index))


def _node_path(host, gpu):
    node = getattr(gpu, "node", None)
    return getattr(node, "host_path", None) or os.path.join(host.dev_root, f"nvidia{gpu.minor}")


def probe_node(path):
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        if e.errno in (errno.EPERM, errno.EACCES):
            return False
        if e.errno in (errno.ENXIO, errno.ENODEV, errno.EBUSY):
            return True
        if e.errno == errno.ENOENT:
            return None
        raise GpuError(f"--gpus auto: cannot probe {path}", why=e.strerror, hint=_HINT) from None
    os.close(fd)
    return True


def _outside_slurm(environ):
    for var in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        val = environ.get(var)
        if val is None:
            continue
        val = val.strip()
        if val.lower() in ("", "void", "none", "nodevfiles"):
            return "none"
        return val
    # Nothing names a GPU: grant none rather than every GPU of the host.
    return "none"


def _allocation(environ):
    """(gres positions or None, count, variable) of what Slurm gave this step on this node.

    A step (SLURM_STEP_ID set) inherits SLURM_JOB_GPUS from its batch script even
    when it was started with --gres=none; such a step has neither SLURM_STEP_GPUS
    nor SLURM_GPUS_ON_NODE, and holds no GPU.  With --gpu-bind=none Slurm sets
    only SLURM_GPUS_ON_NODE."""
    job = _split(environ.get("SLURM_JOB_GPUS", ""))
    on_node = _int(environ.get("SLURM_GPUS_ON_NODE"))
    if environ.get("SLURM_STEP_ID") is None:
        ids = job or _split(environ.get("SLURM_STEP_GPUS", ""))
        return ids, len(ids), "SLURM_JOB_GPUS"
    step = _split(environ.get("SLURM_STEP_GPUS", ""))
    if step:
        return step, len(step), "SLURM_STEP_GPUS"
    if on_node is None:
        return [], 0, "SLURM_STEP_GPUS"
    if on_node == len(job):
        return job, on_node, "SLURM_JOB_GPUS"
    return None, on_node, "SLURM_GPUS_ON_NODE"


def _constrained(environ, allowed, cvd, known=True):
    if cvd is not None:
        count, source = len(cvd), "CUDA_VISIBLE_DEVICES"
    else:
        _, count, source = _allocation(environ)
    if count == 0:
        return []
    if not allowed:
        raise GpuError(f"--gpus auto: {source} names {count} GPU(s) but this step may open none",
                       why="every GPU device node was refused (EPERM/EACCES)",
                       hint="check that the device nodes are not on a nodev mount; " + _HINT)
    if count == len(allowed):
        return allowed
    if cvd is not None and len(cvd) < len(allowed):
        return _pick(cvd, allowed, local_first=True, what="CUDA_VISIBLE_DEVICES", known=known,
                     environ=environ)
    raise GpuError(f"--gpus auto: {source} names {count} GPU(s) but this step may open "
                   f"{len(allowed)} (minors {','.join(str(g.minor) for g in allowed)})",
                   why="Slurm's variables disagree with the step's device cgroup", hint=_HINT)


def _unconstrained(environ, order, cvd, known=True):
    if cvd == []:   # NoDevFiles: this task got no GPU, whatever the step holds
        return []
    ids, count, source = _allocation(environ)
    if ids is None:
        raise GpuError(f"--gpus auto: {source}={count} but no SLURM_STEP_GPUS/SLURM_JOB_GPUS "
                       "list names which GPUs", hint=_HINT)
    step = _pick(ids, order, local_first=False, what=source, known=known, environ=environ)
    if cvd is not None and len(cvd) < len(step):
        return _pick(cvd, step, local_first=False, what="CUDA_VISIBLE_DEVICES", gres=order,
                     known=known, environ=environ)
    # slurmd exports the step's binding as SLURMD_TRES_BIND=gpu:per_task:N
    # (--gpus-per-task) or gpu:none (--gpu-bind=none).
    bind = environ.get("SLURMD_TRES_BIND", "")
    per_task = _int(bind[len("gpu:per_task:"):]) if bind.startswith("gpu:per_task:") else None
    local_id = _int(environ.get("SLURM_LOCALID"))
    if cvd is None and per_task and local_id is not None and per_task < len(step):
        block = step[local_id * per_task:(local_id + 1) * per_task]
        if len(block) == per_task:
            if not known:
                raise _order_unknown(environ, f"SLURM_LOCALID={local_id}")
            return block
    return step


def _pick(items, pool, local_first, what, gres=None, known=True, environ=None):
    """Map Slurm entries (indices or GPU UUIDs) onto GPUs of `pool`.

    Numbers are positions in `gres` (gres.conf order; `pool` itself when None)
    unless local_first, where they are positions in `pool`; when the first
    reading leaves `pool`, the other one is tried.  Without a known gres.conf
    order, numbers are accepted only when they name every GPU of `pool` (the
    one answer that does not depend on the order)."""
    by_uuid = {g.uuid: g for g in pool if getattr(g, "uuid", None)}
    nums, out = [], []
    for it in items:
        if it in by_uuid:
            out.append(by_uuid[it])
            continue
        n = _int(it)
        if n is None:
            raise GpuError(f"--gpus auto: {what} entry {it!r} is neither an index nor a UUID of "
                           "an allocated GPU", hint=_HINT)
        nums.append(n)
    if nums and not known:
        if out or sorted(set(nums)) != list(range(len(pool))):
            raise _order_unknown(environ or {}, f"{what}={','.join(items)}")
        return list(pool)
    if nums:
        readings = [pool, gres or pool] if local_first else [gres or pool, pool]
        for table in readings:
            got = [table[n] for n in nums if 0 <= n < len(table)]
            if len(got) == len(nums) and all(g in pool for g in got):
                out += got
                break
        else:
            raise GpuError(f"--gpus auto: {what}={','.join(items)} does not match the "
                           f"{len(pool)} GPU(s) allocated on this node", hint=_HINT)
    return list(dict.fromkeys(out))


def _cvd(environ):
    val = environ.get("CUDA_VISIBLE_DEVICES")
    if val is None:
        return None
    val = val.strip()
    # Slurm writes NoDevFiles when the node has GPUs but the step got none.
    return [] if val in ("", "NoDevFiles") else _split(val)


def _split(val):
    """'0,2-3' -> ['0', '2', '3'] (Slurm writes plain lists; ranges are tolerated)."""
    out = []
    for part in val.split(","):
        part = part.strip()
        a, sep, b = part.partition("-")
        if sep and isdigits(a) and isdigits(b) and len(a) < 6 and len(b) < 6:
            out += [str(i) for i in range(int(a), int(b) + 1)]
        elif part:
            out.append(part)
    return out


def _int(s):
    return int(s) if s is not None and isdigits(s.strip()) and len(s.strip()) < 10 else None


# --- gres.conf ---------------------------------------------------------------

def _gres_order(environ, gpus):
    """(host GPUs in gres.conf order, True), or (minor order, False) when
    gres.conf is unreadable or names no device files for this node: then the
    order is unknown, and only answers that do not depend on it are given."""
    by_minor = {g.minor: g for g in gpus}
    minors = gres_file_minors(environ)
    if minors:
        order = [by_minor[m] for m in minors if m in by_minor]
        if order:
            return order + [g for g in gpus if g not in order], True
    return list(gpus), False


def _gres_path(environ):
    conf = environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    return os.path.join(os.path.dirname(conf), "gres.conf")


def _order_unknown(environ, what):
    path = _gres_path(environ)
    why = (f"{path} lists no Name=gpu File= device files for this node"
           if os.access(path, os.R_OK) else f"{path} cannot be read")
    return GpuError(f"--gpus auto: {what} names positions in gres.conf",
                    why=f"{why}, so they cannot be mapped to devices without a guess",
                    hint="let users read gres.conf next to slurm.conf and list this node's "
                         "GPUs in it (Name=gpu File=/dev/nvidia[0-3]), enable "
                         "ConstrainDevices=yes in cgroup.conf, or pass --gpus N,M explicitly")


def gres_file_minors(environ):
    path = _gres_path(environ)
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return []
    node = environ.get("SLURMD_NODENAME") or os.uname().nodename
    minors = []
    for line in text.splitlines():
        kv = _fields(line.split("#", 1)[0])
        if kv.get("name", "").lower() != "gpu" or "file" not in kv:
            continue
        if "nodename" in kv and node not in _expand(kv["nodename"]):
            continue
        for path in _expand(kv["file"]):
            m = _minor_of(path)
            if m is not None:
                minors.append(m)
    return minors


def _fields(line):
    out = {}
    for tok in line.split():
        k, sep, v = tok.partition("=")
        if sep:
            out[k.lower()] = v
    return out


def _minor_of(path):
    try:
        st = os.stat(path)
        if os.major(st.st_rdev) == 195 and (st.st_mode & 0o170000) == 0o020000:
            return os.minor(st.st_rdev)
    except OSError:
        pass
    base = os.path.basename(path)
    return int(base[6:]) if base.startswith("nvidia") and isdigits(base[6:]) and len(base) < 16 else None


def _expand(expr):
    """Slurm hostlist expansion: 'gpu[01-02,5],x' -> ['gpu01', 'gpu02', 'gpu5', 'x']."""
    out, depth, cur = [], 0, ""
    for ch in expr + ",":
        if ch == "," and depth == 0:
            if cur:
                out += _expand_one(cur)
            cur = ""
            continue
        depth += (ch == "[") - (ch == "]")
        cur += ch
    return out


def _expand_one(word):
    lb = word.find("[")
    rb = word.find("]", lb)
    if lb < 0 or rb < 0:
        return [word]
    head, body, rest = word[:lb], word[lb + 1:rb], _expand_one(word[rb + 1:])
    out = []
    for part in body.split(","):
        a, sep, b = part.partition("-")
        if sep and isdigits(a) and isdigits(b) and len(a) < 6 and len(b) < 6:
            items = [str(i).zfill(len(a)) for i in range(int(a), int(b) + 1)]
        else:
            items = [part]
        out += [head + i + r for i in items for r in rest]
    return out
