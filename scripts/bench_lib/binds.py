"""The bind mounts the peers get: the same host files, and as many, as a
gpusandbox launch with `--gpus 0,1` injects (from `gpusandbox list --json`).

Each bind is (host path, container path, kind) with kind "dev" for device
nodes (bound without nodev), else "file" or "dir"."""
import json
import os
import stat
import subprocess

DEFAULT_COUNT = 20
HOST_KEYS = ("host_path", "hostPath", "host", "source")
CONT_KEYS = ("path", "containerPath", "container_path", "container", "destination")


def _kind(path):
    try:
        st = os.stat(path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return "dev"
    return "dir" if stat.S_ISDIR(st.st_mode) else "file"


def _container_path(host, group, sim, multiarch):
    """Where a peer puts a host file when the listing names no target: the
    places the reference stack uses on a Debian-style image."""
    base = os.path.basename(host)
    kind = _kind(host)
    g = (group or "").lower()
    if kind == "dev" or g.startswith("dev"):
        rel = os.path.relpath(host, sim) if host.startswith(sim + "/") else host
        rel = "/" + rel.lstrip("/")
        return rel if rel.startswith("/dev/") else "/dev/" + base
    if g.startswith("lib"):
        return f"/usr/lib/{multiarch}/{base}"
    if g.startswith("bin"):
        return f"/usr/bin/{base}"
    if host.startswith(sim + "/"):
        return "/" + os.path.relpath(host, sim)
    return host


def from_list(doc, sim, multiarch):
    """Collect every host path in a `gpusandbox list --json` document."""
    found = []

    def add(host, cont, group):
        kind = _kind(host)
        if kind is None:
            return
        found.append((host, cont or _container_path(host, group, sim, multiarch), kind))

    def walk(x, group):
        if isinstance(x, dict):
            host = next((x[k] for k in HOST_KEYS if isinstance(x.get(k), str)), None)
            if host is not None and host.startswith("/"):
                cont = next((x[k] for k in CONT_KEYS
                             if isinstance(x.get(k), str) and x[k] != host), None)
                add(host, cont, group)
                return
            for k, v in x.items():
                walk(v, k if isinstance(v, (list, dict)) else group)
        elif isinstance(x, list):
            for v in x:
                walk(v, group)
        elif isinstance(x, str) and x.startswith(sim + "/"):
            add(x, None, group)

    walk(doc, None)
    seen, out = set(), []
    for b in found:
        if b[1] not in seen:
            seen.add(b[1])
            out.append(b)
    return out


def from_gpusandbox(exe, sim, multiarch, env):
    """(binds, source note) or (None, why it could not be listed)."""
    try:
        p = subprocess.run([exe, "list", "--gpus", "0,1", "--driver-root", sim, "--json"],
                           capture_output=True, text=True, timeout=60, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"gpusandbox list failed: {e}"
    if p.returncode != 0:
        err = (p.stderr.strip().splitlines() or ["no output"])[0]
        return None, f"gpusandbox list exited {p.returncode}: {err}"
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        return None, "gpusandbox list --json printed no JSON"
    binds = from_list(doc, sim, multiarch)
    if not binds:
        return None, "gpusandbox list --json named no host paths"
    return binds, "gpusandbox list --gpus 0,1 --json"


def default(tmp, multiarch, n=DEFAULT_COUNT):
    """n small files, when gpusandbox cannot list its mounts."""
    src = os.path.join(tmp, "bindsrc")
    os.makedirs(src, mode=0o755)
    out = []
    for i in range(n):
        path = os.path.join(src, f"lib{i}.so")
        with open(path, "wb") as f:
            f.write(b"\0" * 64)
        os.chmod(path, 0o644)
        out.append((path, f"/usr/lib/{multiarch}/gsbx-bench-{i}.so", "file"))
    return out
