"""`gpusandbox doctor`: find which layer of a GPU launch is broken, and say how to fix it.

GPU container failures come from three layers that users cannot tell apart
from the error they see: the runtime's own prerequisites (user namespaces,
cgroups, overlayfs), the host driver (module, device nodes, libraries of the
running version), and the CUDA release the image needs against what the
driver supports.  Each check below prints PASS, WARN or FAIL with the fix,
in that order, then a three-step verification runs a real sandbox.

Every /proc, /sys and /etc path the checks read comes from a Roots object,
so tests point them at a temporary tree (e.g. a sysctl file reading 0)
instead of changing the machine.

Exit status: 0 when nothing failed (warnings allowed), 1 when a check
failed, 125 for a usage error.  Report-only code: attrs and json are fine.
"""
import os
import sys

import attrs

from gpusandbox.errors import GpuError, SandboxError, UsageError
from gpusandbox.linux import sys as lsys

PASS, WARN, FAIL = "pass", "warn", "fail"
# The PATH the launcher runs newuidmap/newgidmap with (gpusandbox.linux.idmap).
HELPER_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"


@attrs.define
class Check:
    section: str
    name: str
    status: str
    detail: str
    fix: str = ""


@attrs.define
class Roots:
    """Where the checks read the kernel's and the system's files.  /sys is
    reached only through the mount points /proc/self/mountinfo names."""
    proc: str = "/proc"
    etc: str = "/etc"


@attrs.define
class Options:
    gpus: str = "all"
    driver_root: str = "/"
    dev_root: str = None
    image: str = None
    userns: str = "auto"
    roots: Roots = attrs.Factory(Roots)
    probes: bool = True       # the overlay probe and the sandbox runs


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


# --- 1. the launcher's own prerequisites ------------------------------------------

def check_userns(roots, euid):
    """Unprivileged user namespaces: the three switches distributions use."""
    needed = euid != 0
    sev = FAIL if needed else WARN
    who = "rootless launches" if needed else "rootless launches (other users)"
    clone = _read(f"{roots.proc}/sys/kernel/unprivileged_userns_clone")
    if clone == "0":
        return Check("launcher", "user namespaces", sev,
                     f"kernel.unprivileged_userns_clone = 0: {who} cannot create a user namespace",
                     "sysctl -w kernel.unprivileged_userns_clone=1 (persist it in /etc/sysctl.d)")
    limit = _read(f"{roots.proc}/sys/user/max_user_namespaces")
    if limit == "0":
        return Check("launcher", "user namespaces", sev,
                     f"user.max_user_namespaces = 0: {who} cannot create a user namespace",
                     "sysctl -w user.max_user_namespaces=15000 (persist it in /etc/sysctl.d)")
    aa = _read(f"{roots.proc}/sys/kernel/apparmor_restrict_unprivileged_userns")
    if aa == "1":
        return Check("launcher", "user namespaces", sev,
                     "kernel.apparmor_restrict_unprivileged_userns = 1: AppArmor strips the "
                     f"capabilities of user namespaces that {who} create",
                     "grant 'userns,' to the Python running gpusandbox in an AppArmor profile, "
                     "or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")
    detail = "allowed" + (f" (max {limit})" if limit else "")
    return Check("launcher", "user namespaces", PASS, detail)


def _id_helper_ok(path):
    # newuidmap writes maps for other ids only with privilege: setuid root
    # or file capabilities (cap_setuid / cap_setgid).
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_uid == 0 and st.st_mode & 0o4000:
        return True
    try:
        return bool(os.getxattr(path, "security.capability"))
    except OSError:
        return False


def check_subids(roots, user, uid, path_env=HELPER_PATH, helpers=True):
    """--userns subids: the caller's ranges and, unless root (which writes
    the maps itself), the setuid helpers that apply them."""
    from gpusandbox.linux import idmap
    out = []
    hint = idmap.SUBID_HINT
    for kind in ("subuid", "subgid"):
        rng = idmap.subid_range(user, uid, f"{roots.etc}/{kind}")
        if rng is None:
            out.append(Check("launcher", f"/etc/{kind}", FAIL,
                             f"no range for user {user} (uid {uid})", hint))
            hint = "see /etc/subuid above"
        else:
            out.append(Check("launcher", f"/etc/{kind}", PASS,
                             f"{user}: {rng[1]} ids from {rng[0]}"))
    for tool in ("newuidmap", "newgidmap") if helpers else ():
        found = next((os.path.join(d, tool) for d in path_env.split(":")
                      if d and os.path.exists(os.path.join(d, tool))), None)
        if found is None:
            out.append(Check("launcher", tool, FAIL, f"not found in {path_env}",
                             "install the uidmap package (shadow-utils)"))
        elif not _id_helper_ok(found):
            out.append(Check("launcher", tool, FAIL, f"{found} is neither setuid root nor has "
                             "file capabilities", f"chmod u+s {found} (or setcap cap_setuid/cap_setgid)"))
        else:
            out.append(Check("launcher", tool, PASS, found))
    return out


def check_cgroups(roots, euid):
    try:
        from gpusandbox.linux import cgroup
        st = cgroup.status(proc=roots.proc)
    except ImportError as e:
        return [Check("launcher", "cgroup", WARN, f"cgroup layer unavailable: {e}",
                      "reinstall gpusandbox")]
    root = euid == 0
    out = []
    if st["cgroup2"]:
        kind = "hybrid: v1 controllers elsewhere" if st["hybrid"] else "unified"
        out.append(Check("launcher", "cgroup v2", PASS, f"{st['cgroup2']} ({kind})"))
        pdir = st["leaf_parent"] or st["cgroup2"]
        if st["delegated"]:
            out.append(Check("launcher", "cgroup delegation", PASS, f"{pdir} is writable"))
        else:
            out.append(Check("launcher", "cgroup delegation", FAIL if root else WARN,
                             f"{pdir} is not writable: " + ("no cgroup for the device filter"
                                                            if root else "resource limits unavailable"),
                             "run inside a delegated cgroup (systemd-run --user --scope -p "
                             "Delegate=yes) or pass --cgroup-parent naming one"))
    else:
        v1dev = st.get("v1_devices")
        out.append(Check("launcher", "cgroup v2", WARN if (not root or v1dev) else FAIL,
                         "no cgroup2 mount" + (f" (v1 devices controller at {v1dev})" if v1dev else ""),
                         "boot with systemd.unified_cgroup_hierarchy=1, or mount cgroup2"))
    have = set(st["controllers"]) | (set(st["controllers_v1"]) if root else set())
    missing = [c for c in ("memory", "pids", "cpu") if c not in have]
    if missing:
        out.append(Check("launcher", "cgroup controllers", WARN,
                         f"{', '.join(missing)} not available: --memory/--pids-limit/--cpus "
                         "cannot be enforced", "delegate the controllers (systemd Delegate=yes) "
                         "or boot a unified cgroup v2 hierarchy"))
    else:
        out.append(Check("launcher", "cgroup controllers", PASS, "memory, pids, cpu"))
    if not root:
        out.append(Check("launcher", "BPF device filter", PASS,
                         "not used rootless: the sandbox's /dev holds only the selected nodes"))
    elif st["bpf_filter"]:
        out.append(Check("launcher", "BPF device filter", PASS,
                         f"a cgroup device program loads ({_bpf_caps()})"))
    else:
        out.append(Check("launcher", "BPF device filter", WARN if st.get("v1_devices") else FAIL,
                         st["bpf_why"] or "unavailable",
                         "a kernel with CONFIG_CGROUP_BPF and a cgroup2 mount"))
    return out


def _bpf_caps():
    """Which of the launcher's effective capabilities allow loading the
    program (python-prctl reads them; doctor is off the launch path)."""
    import prctl
    eff = prctl.cap_effective
    held = [n for n, have in (("CAP_SYS_ADMIN", eff.sys_admin), ("CAP_BPF", eff.bpf),
                              ("CAP_NET_ADMIN", eff.net_admin)) if have]
    return "effective: " + (", ".join(held) if held else "none of CAP_SYS_ADMIN, CAP_BPF")


def _rmtree(base):
    import shutil
    # overlayfs creates work/work with mode 000 (fs/overlayfs/super.c);
    # its owner (the caller) opens it up so that it can be removed.
    try:
        os.chmod(os.path.join(base, "work", "work"), 0o700)
    except OSError:
        pass
    shutil.rmtree(base, ignore_errors=True)


def probe_overlay():
    """Mount an overlay in a fresh user+mount namespace in a forked child.

    The mount is made with fsmount(2) and never attached, so it vanishes with
    the child; the child writes through it to prove the upper layer works."""
    import tempfile
    from gpusandbox.linux import mounts
    base = tempfile.mkdtemp(prefix="gpusandbox-doctor-")
    try:
        for d in ("lower", "upper", "work"):
            os.mkdir(os.path.join(base, d))
        r, w = os.pipe()
        uid, gid = os.geteuid(), os.getegid()
        pid = os.fork()
        if pid == 0:  # child: report the failure on the pipe, exit without cleanup
            code = 0
            try:
                os.close(r)
                lsys.unshare(lsys.CLONE_NEWUSER | lsys.CLONE_NEWNS)
                for f, data in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"),
                                ("gid_map", f"0 {gid} 1")):
                    with open(f"/proc/self/{f}", "w") as fh:
                        fh.write(data)
                mfd = mounts.new_fs("overlay", [f"lowerdir={base}/lower", f"upperdir={base}/upper",
                                                f"workdir={base}/work"])
                fd = os.open("probe", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=mfd)
                os.write(fd, b"ok")
                os.close(fd)
                os.close(mfd)
            except BaseException as e:  # noqa: BLE001 - the child must always _exit
                os.write(w, str(e).encode()[:500])
                code = 1
            os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            msg = f.read().decode("utf-8", "replace")
        _, status = os.waitpid(pid, 0)
        ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 \
            and os.path.exists(os.path.join(base, "upper", "probe"))
        return ok, msg or f"child status {status}"
    finally:
        _rmtree(base)


def check_overlay(euid):
    ok, why = probe_overlay()
    if ok:
        return Check("launcher", "overlayfs in user namespace", PASS,
                     "mounted and wrote through an overlay")
    who = "rootless launches" if euid == 0 else "this user"
    return Check("launcher", "overlayfs in user namespace", WARN,
                 f"probe failed: {why}: --writable-tmpfs is unavailable to {who}",
                 "Linux >= 5.11 mounts overlayfs in user namespaces")


# --- 2. the host driver ------------------------------------------------------------

def _driver_version(opts):
    from gpusandbox.gpu.discover import proc_root
    path = os.path.join(proc_root(opts.driver_root), "proc/driver/nvidia/version")
    text = _read(path)
    if text is None:
        return None, path
    for tok in text.split("\n", 1)[0].split():
        parts = tok.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts):
            return tok, path
    return "", path


def _lib_versions(driver_root):
    """{version: [library file]} of libcuda/libnvidia-ml in the driver root's ld.so.cache."""
    from gpusandbox.gpu import ldcache
    try:
        with open(os.path.join(driver_root, "etc/ld.so.cache"), "rb") as f:
            entries = ldcache.parse(f.read())
    except (OSError, ldcache.CacheError):
        return {}
    rootfd = os.open(driver_root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    out = {}
    try:
        for e in entries:
            if not (e.name.startswith(b"libcuda.so") or e.name.startswith(b"libnvidia-ml.so")):
                continue
            try:
                fd = lsys.openat2(rootfd, os.fsdecode(e.path).lstrip("/"), lsys.O_PATH)
            except OSError:
                continue
            try:
                real = os.readlink(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
            name = os.path.basename(real)
            ver = name.split(".so.", 1)[1] if ".so." in name else ""
            if ver.count(".") >= 1:
                out.setdefault(ver, []).append(name)
    finally:
        os.close(rootfd)
    return out


def check_driver(opts):
    """Returns (checks, host or None, CUDA ceiling or None)."""
    from gpusandbox.gpu import discover
    out = []
    version, vpath = _driver_version(opts)
    if version is None:
        out.append(Check("driver", "kernel module", FAIL, f"{vpath} does not exist: the NVIDIA "
                         "driver is not loaded", "modprobe nvidia (or name the driver's root "
                         "with --driver-root, e.g. /run/nvidia/driver)"))
        return out, None, None
    if not version:
        out.append(Check("driver", "kernel module", FAIL, f"no version in {vpath}",
                         "--driver-root must name a tree with the driver's /proc files"))
        return out, None, None
    out.append(Check("driver", "kernel module", PASS, f"NVIDIA {version}"))
    try:
        host = discover.discover(opts.driver_root, opts.dev_root, environ={})
    except GpuError as e:
        if e.what.startswith("driver libraries"):
            out.append(_lib_mismatch(opts, version, e))
        else:
            out.append(Check("driver", "GPUs", FAIL, e.line(), e.hint or ""))
        return out, None, None
    bad = [g for g in host.gpus if g.node.problem] + \
        [n for k, n in host.control.items() if k == "nvidiactl" and n.problem]
    if bad:
        probs = "; ".join((b.node if hasattr(b, "node") else b).problem for b in bad)
        out.append(Check("driver", "device nodes", FAIL, probs,
                         "nvidia-modprobe -c=<minor> (or reload the driver) to recreate the nodes"))
    else:
        out.append(Check("driver", "device nodes", PASS,
                         f"/dev/nvidiactl and {len(host.gpus)} GPU node(s) with the right numbers"))
    uvm = host.control.get("nvidia-uvm")
    if host.majors.get("nvidia-uvm") is None:
        out.append(Check("driver", "nvidia-uvm", FAIL, "module not loaded: CUDA cannot start "
                         "(utility-only use such as nvidia-smi still works)",
                         "modprobe nvidia-uvm (or nvidia-modprobe -u -c=0)"))
    elif uvm is None or uvm.problem:
        out.append(Check("driver", "nvidia-uvm", FAIL, uvm.problem if uvm else "no node",
                         "nvidia-modprobe -u -c=0 creates /dev/nvidia-uvm"))
    else:
        out.append(Check("driver", "nvidia-uvm", PASS, f"/dev/nvidia-uvm {uvm.major}:0"))
    cuda = next((lib for lib in host.libs if lib.family == "libcuda"), None)
    out.append(Check("driver", "driver libraries", PASS if cuda else FAIL,
                     f"{len(host.libs)} libraries of {host.version}" +
                     ("" if cuda else ", but no libcuda: CUDA cannot start"),
                     "" if cuda else "install the driver's CUDA library (libcuda)"))
    out += check_pieces(host)
    if "persistenced" in host.ipc:
        out.append(Check("driver", "persistenced", PASS, host.ipc["persistenced"][1]))
    else:
        out.append(Check("driver", "persistenced", WARN, "no nvidia-persistenced socket: every "
                         "launch re-initialises the GPUs (slow first CUDA call)",
                         "systemctl enable --now nvidia-persistenced"))
    if host.firmware:
        out.append(Check("driver", "GSP firmware", PASS, f"{len(host.firmware)} file(s) for {host.version}"))
    else:
        fdir = os.path.join(opts.driver_root, "lib/firmware/nvidia")
        others = sorted(os.listdir(fdir)) if os.path.isdir(fdir) else []
        out.append(Check("driver", "GSP firmware", WARN,
                         f"none for {host.version}" + (f" (found: {', '.join(others)})" if others else "")
                         + ": GPUs that boot GSP firmware cannot be used in the sandbox",
                         "reinstall the driver package so lib/firmware/nvidia/"
                         f"{host.version} exists"))
    from gpusandbox.gpu import ceiling
    c = ceiling.driver_cuda_version(host)
    if c:
        out.append(Check("driver", "CUDA ceiling", PASS, f"driver {host.version} supports CUDA up to "
                         f"{c[0]}.{c[1]}"))
    else:
        out.append(Check("driver", "CUDA ceiling", FAIL, "libcuda did not answer cuDriverGetVersion",
                         "check that libcuda matches the loaded module (reinstall the driver)"))
    return out, host, c


# What a capability loses without each piece of gpusandbox.gpu.inject.PIECES.
_EFFECT = {
    "libnvidia-ptxjitcompiler": "CUDA cannot JIT-compile PTX (programs built without code for "
                                "this GPU fail)",
    "libnvidia-ml": "NVML and nvidia-smi do not work in sandboxes",
    "nvidia-smi": "no nvidia-smi in sandboxes",
    "libnvcuvid": "no hardware video decoding (NVDEC)",
    "libnvidia-encode": "no hardware video encoding (NVENC)",
    "libvdpau_nvidia": "no VDPAU video decoding",
    "libGLX_nvidia": "no OpenGL through GLX",
    "libEGL_nvidia": "no EGL (headless OpenGL)",
    "libnvidia-glcore": "OpenGL cannot start",
    "libnvidia-eglcore": "EGL and OpenGL ES cannot start",
    "/dev/nvidia-modeset": "no modesetting node for display",
    "libnvidia-ngx": "no NGX (DLSS)",
}


def check_pieces(host):
    """Every piece of every capability the driver root lacks, each with its
    fix; libcuda and nvidia-uvm have their own checks above."""
    from gpusandbox.gpu import inject
    missing = [m for m in inject.missing_pieces(host, set(inject.PIECES))
               if m.piece != "libcuda"]
    if not missing:
        return [Check("driver", "capabilities", PASS, "every piece of "
                      + ", ".join(inject.PIECES) + " is present")]
    return [Check("driver", f"{m.piece} ({m.cap})", WARN,
                  f"not found: {_EFFECT.get(m.piece, 'part of ' + m.cap + ' is missing')}; "
                  f"launches with '{m.cap}' go on without it, with a warning", m.fix)
            for m in missing]


def gpu_listing(gpus):
    """GPUs as `nvidia-smi -L` names them (host index, model, UUID), each with
    its PCI bus id."""
    return "; ".join(f"GPU {g.index}: {g.model} (UUID: {g.uuid or 'hidden from this user'}), "
                     f"bus {g.bus_id}" for g in gpus)


def _lib_mismatch(opts, version, err):
    found = _lib_versions(opts.driver_root)
    others = sorted(v for v in found if v != version)
    if others:
        return Check("driver", "driver libraries", FAIL,
                     f"the libraries are version {', '.join(others)} but the loaded kernel module "
                     f"is {version} (a driver upgrade without a reboot)",
                     f"reboot, or unload and reload the nvidia modules so that {others[-1]} runs; "
                     f"or reinstall driver {version}")
    return Check("driver", "driver libraries", FAIL, err.line(), err.hint or "")


# --- 3. the image ---------------------------------------------------------------------

def _stat_in(root, path):
    """stat of `path` resolved inside `root` (image symlinks stay inside), or None."""
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = lsys.openat2(rootfd, path.lstrip("/") or ".", lsys.O_PATH)
    except OSError:
        return None
    finally:
        os.close(rootfd)
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def load_image(image_dir):
    """(rootfs, env dict) exactly as the launcher reads them: the same plan
    functions pick a bundle's rootfs/ (never the bundle's own root.path, which
    the launcher ignores) and its process.env, else the directory and its
    /etc/environment."""
    from gpusandbox import plan
    from gpusandbox.imageroot import image_root
    root, rootfd, config = image_root(image_dir)
    try:
        items, _cwd = plan._image_env(root, config, rootfd)
    finally:
        os.close(rootfd)
    return root, dict(items)


def _libc(root):
    import stat
    m = os.uname().machine
    glibc = (f"/lib/{m}-linux-gnu/libc.so.6", f"/usr/lib/{m}-linux-gnu/libc.so.6",
             "/lib64/libc.so.6", "/usr/lib64/libc.so.6", "/lib/libc.so.6", "/usr/lib/libc.so.6")
    for p in glibc:
        st = _stat_in(root, p)
        if st and stat.S_ISREG(st.st_mode):
            return "glibc", p
    musl = f"/lib/ld-musl-{m}.so.1"
    if _stat_in(root, musl):
        return "musl", musl
    return None, None


def check_image(opts, host, ceiling, sel):
    """Returns (checks, facts) where facts has rootfs, env, sh, python3 (or None)."""
    import stat
    from gpusandbox.gpu import require
    out = []
    if not os.path.isdir(opts.image):
        out.append(Check("image", "rootfs", FAIL, f"{opts.image} is not a directory",
                         "give an unpacked root filesystem or an OCI bundle directory"))
        return out, None
    try:
        root, env = load_image(opts.image)
    except SandboxError as e:
        out.append(Check("image", "rootfs", FAIL, e.line(), e.hint or ""))
        return out, None
    bins = [d for d in ("/usr/bin", "/bin") if (s := _stat_in(root, d)) and stat.S_ISDIR(s.st_mode)]
    shell = next((p for p in ("/bin/sh", "/usr/bin/sh") if _stat_in(root, p)), None)
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
                   if _stat_in(root, p)), None)
    flavour, libc_path = _libc(root)
    if not bins or not (shell or flavour):
        out.append(Check("image", "rootfs", FAIL, f"{root} has no /bin or /usr/bin with a shell "
                         "or a C library: not a usable root filesystem",
                         "unpack the image (e.g. 'umoci raw unpack' or 'docker export | tar -x')"))
        return out, None
    out.append(Check("image", "rootfs", PASS, f"{root}" + (f", shell {shell}" if shell else "")
                     + (f", python3 {python}" if python else "")))
    m = os.uname().machine
    debian = _stat_in(root, "/etc/debian_version") is not None
    libdir = f"/usr/lib/{m}-linux-gnu (Debian layout)" if debian else "/usr/lib64"
    if flavour == "glibc":
        out.append(Check("image", "libc", PASS, f"glibc ({libc_path}); driver libraries go to {libdir}"))
    elif flavour == "musl":
        out.append(Check("image", "libc", WARN, f"musl ({libc_path}): the NVIDIA driver libraries "
                         "are built for glibc and will not load", "use a glibc-based image for GPU jobs "
                         "(Alpine: install gcompat at your own risk)"))
    else:
        out.append(Check("image", "libc", WARN, "no C library found: only static programs can run, "
                         "and they cannot load the driver libraries", "use an image with glibc"))
    facts = {"rootfs": root, "env": env, "sh": shell, "python3": python}
    try:
        reqs = require.requirements(env, root)
    except GpuError as e:
        out.append(Check("image", "CUDA requirement", FAIL, e.line(), e.hint or ""))
        return out, facts
    if not reqs:
        out.append(Check("image", "CUDA requirement", PASS, "the image states no requirement and "
                         "carries no CUDA runtime"))
        return out, facts
    what = "; ".join(f"{src}: {expr}" if not src.startswith("the image") else f"{expr} from {src}"
                     for src, expr in reqs)
    if host is None:
        out.append(Check("image", "CUDA requirement", WARN, f"{what}; not checked without a "
                         "working driver", "fix the driver checks above"))
        return out, facts
    try:
        warning = require.check(env, root, host, ceiling or (lambda: None), os.environ,
                                gpus=sel.node_gpus() if sel is not None else None)
    except GpuError as e:
        out.append(Check("image", "CUDA requirement", FAIL, e.line(), e.hint or ""))
        return out, facts
    if warning:
        out.append(Check("image", "CUDA requirement", WARN, warning.removeprefix("warning: "),
                         "NVIDIA_DISABLE_REQUIRE / --no-require turn the check off" if "skipped"
                         not in warning else "unset NVIDIA_DISABLE_REQUIRE to check"))
    else:
        out.append(Check("image", "CUDA requirement", PASS, f"{what}; met by driver {host.version}"
                         + (f" (CUDA {ceiling[0]}.{ceiling[1]})" if ceiling else "")))
    return out, facts


# --- 4. the three-step verification ----------------------------------------------------

_CUDA_PROBE = ("import ctypes,sys\n"
               "try:\n lib=ctypes.CDLL('libcuda.so.1')\n"
               "except OSError as e:\n print('LOAD', e); sys.exit(3)\n"
               "n=ctypes.c_int(-1)\nr=lib.cuInit(0)\n"
               "c=lib.cuDeviceGetCount(ctypes.byref(n)) if r==0 else -1\n"
               "print('CUDA', r, c, n.value)\n")


def _sandbox(opts, facts, cmd, timeout=120):
    import subprocess
    argv = [sys.executable, "-m", "gpusandbox", "run", "--gpus", opts.gpus,
            "--driver-root", opts.driver_root, "--no-require"]
    if opts.dev_root:
        argv += ["--dev-root", opts.dev_root]
    if opts.userns != "auto":
        argv += ["--userns", opts.userns]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NVIDIA_", "CUDA_"))}
    try:
        res = subprocess.run(argv + [opts.image, "--"] + cmd, env=env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout}s"
    tail = (res.stderr.strip().splitlines() or [""])[-1]
    return res, tail


def check_verify(opts, host, sel, facts):
    out = []
    if host is None or sel is None:
        out.append(Check("verify", "host GPU listing", FAIL, "no GPU selection without a working "
                         "driver", "fix the driver checks above"))
        return out
    listing = gpu_listing(sel.node_gpus()) or "no GPU"
    out.append(Check("verify", "host GPU listing", PASS, f"--gpus {opts.gpus}: {listing}"))
    if facts is None:
        out.append(Check("verify", "sandbox", WARN, "no usable image given: the sandbox steps "
                         "were skipped", "run 'gpusandbox doctor IMAGE_DIR'"))
        return out
    if not opts.probes:
        return out
    want = {g.node.path for g in sel.node_gpus()} | {"/dev/nvidiactl"}
    if facts["sh"]:
        cmd = [facts["sh"], "-c", "for f in /dev/nvidia*; do [ -e \"$f\" ] && echo \"$f\"; done; exit 0"]
    elif facts["python3"]:
        cmd = [facts["python3"], "-c", "import os\nfor n in os.listdir('/dev'):\n"
               " if n.startswith('nvidia'): print('/dev/'+n)"]
    else:
        out.append(Check("verify", "device nodes in sandbox", WARN, "the image has neither sh "
                         "nor python3 to list /dev", "use an image with a shell"))
        return out
    res, tail = _sandbox(opts, facts, cmd)
    if res is None or res.returncode != 0:
        out.append(Check("verify", "device nodes in sandbox", FAIL,
                         f"the test sandbox failed: {tail or 'exit status %d' % res.returncode}",
                         "fix the failure above; 'gpusandbox run --verbose' shows each step"))
        return out
    seen = {line.strip() for line in res.stdout.splitlines() if line.startswith("/dev/nvidia")}
    gpu_nodes = {p for p in seen if p[len("/dev/nvidia"):].isdigit()}
    extra = sorted(gpu_nodes - want)
    missing = sorted(want - seen)
    if extra or missing:
        out.append(Check("verify", "device nodes in sandbox", FAIL,
                         (f"unselected GPU nodes visible: {' '.join(extra)} " if extra else "")
                         + (f"missing: {' '.join(missing)}" if missing else ""),
                         "report this: the sandbox must hold exactly the selected GPUs"))
    else:
        out.append(Check("verify", "device nodes in sandbox", PASS, " ".join(sorted(seen))))
    out.append(_framework(opts, sel, facts))
    return out


def _framework(opts, sel, facts):
    want = sel.device_count()
    if facts["python3"]:
        res, tail = _sandbox(opts, facts, [facts["python3"], "-c", _CUDA_PROBE])
        line = next((ln for ln in (res.stdout.splitlines() if res else []) if ln.startswith(("CUDA", "LOAD"))), "")
        f = line.split()
        if len(f) == 4 and f[0] == "CUDA" and f[1] == "0" and f[2] == "0" and f[3] == str(want):
            return Check("verify", "CUDA in sandbox", PASS, f"libcuda loads, cuInit ok, "
                         f"{want} device(s) as selected")
        if f[:1] == ["LOAD"]:
            why = f"libcuda.so.1 did not load: {line[5:]}"
        elif len(f) == 4 and f[1] != "0":
            why = f"cuInit returned {f[1]}" + (" (no device: check nvidia-uvm and the device "
                                                 "nodes)" if f[1] == "100" else "")
        elif len(f) == 4:
            why = f"CUDA counts {f[3]} device(s), {want} selected"
        else:
            why = f"the probe failed: {tail}"
        return Check("verify", "CUDA in sandbox", FAIL, why,
                     "check the driver section above; 'gpusandbox run --verbose' shows the injection")
    if not facts["sh"]:
        return Check("verify", "CUDA in sandbox", WARN, "the image has neither python3 nor sh",
                     "use an image with python3 for the CUDA check")
    res, tail = _sandbox(opts, facts, [facts["sh"], "-c", "nvidia-smi -L"])
    if res is None or res.returncode != 0:
        return Check("verify", "CUDA in sandbox", WARN, f"no python3 in the image and nvidia-smi -L "
                     f"failed: {tail}", "use an image with python3 for the CUDA check")
    n = sum(1 for ln in res.stdout.splitlines() if ln.startswith(("GPU ", "  MIG ")))
    ok = n == want
    return Check("verify", "CUDA in sandbox", PASS if ok else FAIL,
                 f"nvidia-smi -L lists {n} device(s), {want} selected",
                 "" if ok else "check the driver section above")


# --- driver of the checks, output, CLI --------------------------------------------------

def run_checks(opts, euid=None):
    from gpusandbox.gpu import select
    euid = os.geteuid() if euid is None else euid
    out = [check_userns(opts.roots, euid)]
    if opts.userns == "subids":
        import pwd
        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = str(os.getuid())
        out += check_subids(opts.roots, user, os.getuid(), helpers=euid != 0)
    out += check_cgroups(opts.roots, euid)
    if opts.probes:
        out.append(check_overlay(euid))
    checks, host, ceiling = check_driver(opts)
    out += checks
    sel = None
    if host is not None:
        try:
            sel = select.resolve(opts.gpus, None, {}, host)
        except SandboxError as e:
            out.append(Check("driver", "GPU selection", FAIL, e.line(), e.hint or ""))
    facts = None
    if opts.image:
        checks, facts = check_image(opts, host, ceiling, sel)
        out += checks
    out += check_verify(opts, host, sel, facts)
    return out


def render(checks):
    lines, section = [], None
    for c in checks:
        if c.section != section:
            section = c.section
            lines.append(f"{section}:")
        line = f"  {c.status.upper():4}  {c.name:<28} {c.detail}"
        if c.fix and c.status != PASS:
            line += f"  (fix: {c.fix})"
        lines.append(line)
    counts = {s: sum(c.status == s for c in checks) for s in (PASS, WARN, FAIL)}
    lines.append(f"{counts[PASS]} passed, {counts[WARN]} warnings, {counts[FAIL]} failed")
    return "\n".join(lines) + "\n"


def to_json(checks):
    import json
    counts = {s: sum(c.status == s for c in checks) for s in (PASS, WARN, FAIL)}
    return json.dumps({"ok": counts[FAIL] == 0, "summary": counts,
                       "checks": [attrs.asdict(c) for c in checks]}, indent=2) + "\n"


def _parser():
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise UsageError(f"doctor: {message}", hint="run 'gpusandbox doctor --help'")

    p = Parser(prog="gpusandbox doctor", description="Check the launcher's prerequisites, the "
               "host driver and (given IMAGE_DIR) the image, then run a test sandbox.",
               epilog="Exit status: 0 nothing failed (warnings allowed), 1 a check failed, "
                      "125 usage error.")
    p.add_argument("--gpus", default="all", help="GPUs to verify (default: all)")
    p.add_argument("--driver-root", default="/", help="where the host driver lives (default /)")
    p.add_argument("--dev-root", default=None, help="where its device nodes live")
    p.add_argument("--userns", default="auto", choices=("auto", "single", "subids", "host"),
                   help="check the prerequisites of this user-namespace mode")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("image", nargs="?", metavar="IMAGE_DIR", help="image to check and test")
    return p


def main(argv, roots=None):
    """`gpusandbox doctor ARGV`; roots replaces /proc, /sys and /etc (tests)."""
    try:
        a = _parser().parse_args(argv)
        opts = Options(gpus=a.gpus, driver_root=os.path.abspath(a.driver_root),
                       dev_root=os.path.abspath(a.dev_root) if a.dev_root else None,
                       image=os.path.abspath(a.image) if a.image else None, userns=a.userns,
                       roots=roots or Roots())
        checks = run_checks(opts)
    except SandboxError as e:
        from gpusandbox.errors import message
        sys.stderr.write(message(e))
        return e.code
    sys.stdout.write(to_json(checks) if a.json else render(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0
