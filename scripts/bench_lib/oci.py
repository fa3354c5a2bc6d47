"""Rows for the container-stack interfaces (issue 12): `podman run /bin/true`
with one GPU through gpusandbox's runtime wrapper over crun, through the
precreate filter, and through a gpusandbox CDI spec, each against podman over
plain crun with the same edits written by hand (--device / --mount); and the
wrapper's pass-through of a non-create command against calling crun."""
import json
import os
import subprocess

from . import launchers as L
from . import rootfs

GPU = "0"
CLEANUP = []     # files this section wrote outside its temp dir


def cleanup():
    while CLEANUP:
        try:
            os.unlink(CLEANUP.pop())
        except FileNotFoundError:
            pass


def _base(exe, store, image_unused=None):
    return [exe, "--root", f"{store}/root", "--runroot", f"{store}/run",
            "--tmpdir", f"{store}/tmp", "--storage-driver", "vfs",
            "--events-backend", "none", "--cgroup-manager", "cgroupfs"]


_RUN = ["run", "--rm", "--read-only", "--network", "host", "--cgroups", "disabled",
        "--log-driver", "none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]


def hand_flags(gsbx_py, sim, image, env):
    """podman flags for the edits the filter would write, by hand: every
    device node and bind of the edited config.json."""
    cfg = {"ociVersion": "1.0.2", "root": {"path": image},
           "process": {"env": [f"NVIDIA_VISIBLE_DEVICES={GPU}"]}}
    p = subprocess.run([gsbx_py, "-I", "-m", "gpusandbox.oci.filter"],
                       input=json.dumps(cfg).encode(), capture_output=True,
                       env=dict(env, GPUSANDBOX_DRIVER_ROOT=sim), check=True)
    out = json.loads(p.stdout)
    # The root is read-only: every bind needs its target in the image (as
    # the peer rows' binds have them).
    rootfs.add_mount_targets(image, [(m["source"], m["destination"], None)
                                     for m in out.get("mounts", [])])
    flags = []
    for d in out["linux"].get("devices", []):
        flags += ["--device", f"{d['path']}:{d['path']}:rwm"]
    for m in out.get("mounts", []):
        if "rw" in m["options"] and m["destination"].startswith("/dev/"):
            flags += ["--device", f"{m['source']}:{m['destination']}:rwm"]
        else:
            flags += ["--mount", f"type=bind,source={m['source']},destination="
                      f"{m['destination']},readonly"]
    return flags


def _shim(d, wrapper, sim, runtime):
    """podman passes the runtime no environment: the shim stands in for an
    admin's /etc/gpusandbox/oci.conf (one sh exec, as cheap as reading it).
    Named crun: podman allows --cgroups disabled only for runtimes of that
    name (containers.conf runtime_supports_nocgroups)."""
    os.makedirs(d, mode=0o755, exist_ok=True)
    path = os.path.join(d, "crun")
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\nexport GPUSANDBOX_DRIVER_ROOT={sim} GPUSANDBOX_OCI_RUNTIME={runtime}\n"
                f"exec {wrapper} \"$@\"\n")
    os.chmod(path, 0o755)
    return path


def rows(gsbx, gsbx_py, sim, image, tmp, mode, store, podman, crun, view, env, note=None):
    """The Launchers of this section for one mode (root or rootless)."""
    out = []
    names = [f"podman-gpu-{k}-{mode}" for k in ("hand", "wrapper", "filter", "cdi")]
    if not (podman and crun):
        return [L.Launcher(n, "podman-gpu", mode, None).skip("podman or crun missing")
                for n in names]
    if not (gsbx and gsbx_py and sim):
        return [L.Launcher(n, "podman-gpu", mode, None).skip("needs gpusandbox and the sim")
                for n in names]
    base = _base(podman, store)
    # Every row of this section runs where /dev also has the simulated
    # host's nodes (a private mount namespace, runner.py): rootless podman
    # binds a CDI device node from its container path (docs/cdi.md), which
    # the host's /dev lacks where the GPU is simulated.
    view = ("dev", os.path.join(sim, "dev"), bool(view))
    note = "; ".join(n for n in (note, "/dev with the simulated nodes in a private "
                                 "mount namespace") if n)
    wrapper = os.path.join(os.path.dirname(gsbx), "gpusandbox-runtime")
    try:
        hand = hand_flags(gsbx_py, sim, image, env)
    except (OSError, subprocess.CalledProcessError) as e:
        why = getattr(e, "stderr", b"") or str(e).encode()
        return [L.Launcher(n, "podman-gpu", mode, None).skip(
            "oci-filter failed: " + why.decode(errors="replace")[-300:]) for n in names]
    hooks = os.path.join(tmp, f"oci-hooks-{mode}")
    subprocess.run([gsbx, "hook", "install", "--stage", "precreate", "--dir", hooks,
                    "--driver-root", sim], check=True, capture_output=True)
    os.chmod(hooks, 0o755)
    shim = _shim(os.path.join(tmp, f"oci-wrapper-{mode}"), wrapper, sim, crun)
    gpu_env = ["-e", f"NVIDIA_VISIBLE_DEVICES={GPU}"]
    variants = {
        "hand": ["--runtime", crun] + _RUN + hand,
        "wrapper": ["--runtime", shim] + _RUN + gpu_env,
        "filter": ["--runtime", crun, "--hooks-dir", hooks] + _RUN + gpu_env,
    }
    for kind, args in variants.items():
        argv = base + args

        def make(_i, cmd, argv=argv):
            return argv + ["--rootfs", image, *cmd]
        out.append(L.Launcher(f"podman-gpu-{kind}-{mode}", "podman-gpu", mode, make,
                              view=view, note=note))
    # The CDI row needs a spec podman reads from /etc/cdi or /var/run/cdi
    # (podman 4.3 has no per-call spec directory): `gpusandbox cdi generate`
    # writes one there under a vendor name of this run's own, removed by
    # cleanup().
    cdi = L.Launcher(f"podman-gpu-cdi-{mode}", "podman-gpu", mode, None, view=view, note=note)
    vendor = f"gsbx-bench-{os.getpid()}.example.com"
    spec = f"/var/run/cdi/gsbx-bench-{os.getpid()}.json"
    if not os.path.exists(spec):
        p = subprocess.run([gsbx, "cdi", "generate", "--driver-root", sim, "--vendor", vendor,
                            "--output", spec], capture_output=True, text=True)
        if p.returncode != 0:
            out.append(cdi.skip("gpusandbox cdi generate: " + (p.stderr.strip() or "failed")
                                .splitlines()[0]))
            return out
        CLEANUP.append(spec)
    argv = base + ["--runtime", crun] + _RUN + ["--device", f"{vendor}/gpu={GPU}"]
    cdi.make_argv = lambda _i, cmd, argv=argv: argv + ["--rootfs", image, *cmd]
    out.append(cdi)
    return out


def passthrough_rows(gsbx, crun, state):
    """`list` (any command but create) through the wrapper and straight to
    crun, both started through env(1) so only the wrapper's own cost differs."""
    if not (gsbx and crun):
        return []
    wrapper = os.path.join(os.path.dirname(gsbx), "gpusandbox-runtime")
    os.makedirs(state, exist_ok=True)
    rows = []
    for name, argv in (("crun-list-root", ["/usr/bin/env", crun, "--root", state, "list"]),
                       ("wrapper-list-root", ["/usr/bin/env", f"GPUSANDBOX_OCI_RUNTIME={crun}",
                                              wrapper, "--root", state, "list"])):
        rows.append(L.Launcher(name, "passthrough", "root",
                               lambda _i, _c, a=argv: list(a),
                               note="runtime pass-through (podman calls state/list often)"))
    return rows


def targets(launchers, target):
    """Issue 12's performance targets, from this section's rows."""
    by = {r.name: r for r in launchers if r.status == "ok" and r.samples}
    out = []
    for mode in ("root", "rootless"):
        ref = by.get(f"podman-gpu-hand-{mode}")
        for kind in ("wrapper", "filter", "cdi"):
            row = by.get(f"podman-gpu-{kind}-{mode}")
            out.append(target(f"podman run, 1 GPU, through the {kind} ({mode}) <= 1.1x "
                              "plain crun with the same edits by hand",
                              row.stats["median_ms"] if row else None,
                              ref.stats["median_ms"] * 1.1 if (ref and row) else None, "ms"))
    c, w = by.get("crun-list-root"), by.get("wrapper-list-root")
    out.append(target("wrapper pass-through of a non-create command <= crun + 2 ms",
                      w.stats["median_ms"] if (w and c) else None,
                      c.stats["median_ms"] + 2.0 if (w and c) else None, "ms"))
    return out
