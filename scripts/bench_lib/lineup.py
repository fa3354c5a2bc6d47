"""The launch table's lineup: gpusandbox's rows and every peer's (bwrap,
crun, runc, podman, the OCI interfaces, the floor), each set up for this
host: bundles, state and store directories, the OCI runtimes' cgroup."""
import fnmatch
import os

from . import PREFIX, host
from . import launchers as L
from . import oci as ocimod


def selected(name, family, only):
    if not only:
        return True
    return any(p == family or fnmatch.fnmatchcase(name, p) for p in only)


def _oci_view():
    layout, cg2 = host.cgroup_layout()
    if layout == "unified":
        return False, None
    if not host.cgroup2_supported():
        return False, "kernel has no cgroup2: OCI runtimes run as installed"
    return True, (f"{layout} cgroups: OCI runtimes run in a private mount namespace "
                  "with cgroup2 mounted over /sys/fs/cgroup (crun refuses hybrid "
                  "layouts; the host's mounts are untouched)")


def _oci_cgroup_parent(b, log):
    """A parent cgroup of our own for the root OCI runs (cgroup2)."""
    layout, cg2 = host.cgroup_layout()
    if cg2 is None:
        return None
    path = os.path.join(cg2, f"{PREFIX}{os.getpid()}")
    try:
        os.mkdir(path)
    except OSError as e:
        log(f"cannot create cgroup {path} ({e.strerror}); root OCI runs without cgroupsPath")
        return None
    b.cgroup = path
    return "/" + os.path.basename(path)


def launchers(b, log):
    """Every row of the launch table, in table order, for the Bench `b` has
    prepared (its images, simulated host, peers and binds); rows that cannot
    run here come back skipped with the reason."""
    rows = []
    gs = b.gsbx
    why_gs = None if gs else "gpusandbox not found (pass --gpusandbox PATH)"
    for mode in ("rootless", "root"):
        for gpus in ("0,1", "none", None):
            row = L.gpusandbox(gs or "gpusandbox", mode, gpus, b.sim, b.image)
            if why_gs:
                row.skip(why_gs)
            elif gpus is not None and not b.sim:
                row.skip(b.sim_error)
            rows.append(row)
        # A CUDA image (CUDA_VERSION and NVIDIA_REQUIRE_CUDA set): the
        # requirement check against the driver's CUDA ceiling, which
        # after the first launch comes from the per-user cache.
        row = L.gpusandbox(gs or "gpusandbox", mode, "0,1", b.sim, b.cuda_image,
                           label="gpu-cuda")
        if why_gs:
            row.skip(why_gs)
        elif not b.sim:
            row.skip(b.sim_error)
        rows.append(row)
    view, view_note = _oci_view()
    b.results["oci_context"] = view_note or "as installed"
    cg_parent = None
    for mode in ("rootless", "root"):
        path, why = b.peers["bwrap"]
        row = L.bwrap(path or "bwrap", mode, b.peer_image, b.binds)
        rows.append(row if path else row.skip(why))
    uid, gid = b.ids
    for rt in ("crun", "runc"):
        path, why = b.peers[rt]
        for mode in ("rootless", "root"):
            state = os.path.join(b.tmp, f"state-{mode}", rt)
            os.makedirs(state, mode=0o700)
            if mode == "rootless":
                os.chown(os.path.dirname(state), uid, gid)
                os.chown(state, uid, gid)
            cgp = None
            if mode == "root" and path:
                if cg_parent is None:
                    cg_parent = _oci_cgroup_parent(b, log) or ""
                cgp = f"{cg_parent}/{rt}" if cg_parent else None
            # runc refuses every mount destination inside /proc.
            elsewhere = "/run/gsbx-proc" if rt == "runc" else None
            cfg = L.oci_config(b.peer_image, b.binds, mode, b.ids, cgp,
                               proc_elsewhere=elsewhere)
            bundle = os.path.join(b.tmp, f"bundle-{rt}-{mode}")
            L.write_bundle(bundle, cfg, (uid, gid) if mode == "rootless" else None)
            notes = [n for n in (view_note, elsewhere and
                                 f"the /proc/driver/nvidia binds go to {elsewhere}: "
                                 "runc refuses mounts inside /proc") if n]
            row = L.oci(rt, path or rt, mode, bundle, state, view,
                        note="; ".join(notes) or None)
            rows.append(row if path else row.skip(why))
    path, why = b.peers["podman"]
    for mode in ("rootless", "root"):
        store = os.path.join(b.tmp, f"podman-{mode}")
        os.makedirs(store, mode=0o700)
        if mode == "rootless":
            os.chown(store, uid, gid)
            b.podman_pidfiles.append(os.path.join(store, "tmp", "pause.pid"))
        row = L.podman(path or "podman", mode, b.peer_image, b.binds, store, view,
                       note=view_note)
        rows.append(row if path else row.skip(why))
        # `podman run --rm IMAGE /bin/true` with gpusandbox's OCI runtime and
        # with runc, side by side: no GPU binds (runc refuses those in
        # /proc) and the host's cgroup layout as installed.
        oci = gs and os.path.join(os.path.dirname(gs), "gpusandbox-oci")
        for label, rt in (("gsbx", oci), ("runc", b.peers["runc"][0])):
            row = L.podman(path or "podman", mode, b.peer_image, (), store, None,
                           note="no GPU binds; cgroups as installed", runtime=(label, rt or label))
            rows.append(row if path and rt and os.path.exists(rt) else
                        row.skip(why or f"no {label} runtime"))
    crun = b.peers["crun"][0]
    for mode in () if b.a.no_oci else ("rootless", "root"):   # issue 12
        # A store (and so a rootless pause process) of their own: rootless
        # podman joins its pause process's mount namespace, and the one the
        # rows above started has the host's /dev, not the private /dev with
        # the simulated nodes these rows run in.
        store = os.path.join(b.tmp, f"podman-gpu-{mode}")
        os.makedirs(store, mode=0o700)
        if mode == "rootless":
            os.chown(store, uid, gid)
            b.podman_pidfiles.append(os.path.join(store, "tmp", "pause.pid"))
        rows += ocimod.rows(b.gsbx, b.gsbx_py, b.sim, b.peer_image, b.tmp,
                            mode, store, path, crun, view, b.envs[mode], note=view_note)
    if not b.a.no_oci:
        rows += ocimod.passthrough_rows(b.gsbx, crun,
                                        os.path.join(b.tmp, "state-list"))
    for mode in ("rootless", "root"):
        rows.append(L.floor(mode, b.image))
    if b.gsbx_py:
        for name, flags in (("python-startup", []), ("python-startup-IS", ["-I", "-S"])):
            py = b.gsbx_py
            rows.append(L.Launcher(name, "python", "rootless",
                                   lambda _i, _c, f=flags, py=py: [py, *f, "-c", "pass"],
                                   note="gpusandbox's interpreter doing nothing"))
    for r in rows:
        if r.status == "ok" and not selected(r.name, r.family, b.only):
            r.skip("left out by --only")
    return rows
