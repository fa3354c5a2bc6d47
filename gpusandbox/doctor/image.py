"""doctor, the image."""
import os

from gpusandbox.errors import GpuError, SandboxError
from gpusandbox.linux import sys as lsys
from gpusandbox.spec import names_squashfs

from .common import FAIL, PASS, WARN, Check


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


def _same(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def load_image(image_dir):
    """(rootfs, env dict) exactly as the launcher reads them: the same plan
    functions pick a bundle's rootfs/ (never the bundle's own root.path, which
    the launcher ignores) and its process.env, else the directory and its
    /etc/environment."""
    from gpusandbox import environ
    from gpusandbox.imageroot import image_root
    root, rootfd, config = image_root(image_dir)
    try:
        items, _cwd = environ.image_env(root, config, rootfd)
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
    out = []
    if names_squashfs(opts.image) and not os.path.isdir(opts.image):
        from .sqsh import mounted
        try:
            with mounted(opts.image, opts.userns) as (root, env):
                return _check_tree(out, root, env, opts, host, ceiling, sel, opts.image)
        except SandboxError as e:
            out.append(Check("image", "rootfs", FAIL, e.line(), e.hint or ""))
            return out, None
    from .storeimage import is_store_ref, resolve
    if not opts.image.startswith("/") and is_store_ref(opts.image):
        try:
            root, env, shown = resolve(opts.image)
        except SandboxError as e:
            out.append(Check("image", "rootfs", FAIL, e.line(), e.hint or ""))
            return out, None
        return _check_tree(out, root, env, opts, host, ceiling, sel, shown)
    if not os.path.isdir(opts.image):
        out.append(Check("image", "rootfs", FAIL, f"{opts.image} is not a directory",
                         "give an unpacked root filesystem, an OCI bundle directory, a "
                         "FILE.sqsh or an image in the store (NAME[:TAG], docker://REF)"))
        return out, None
    try:
        root, env = load_image(opts.image)
    except SandboxError as e:
        out.append(Check("image", "rootfs", FAIL, e.line(), e.hint or ""))
        return out, None
    return _check_tree(out, root, env, opts, host, ceiling, sel, root)


def _check_tree(out, root, env, opts, host, ceiling, sel, shown):
    """The checks of the tree at the path `root` (shown as `shown`)."""
    import stat
    from gpusandbox.gpu import require
    bins = [d for d in ("/usr/bin", "/bin") if (s := _stat_in(root, d)) and stat.S_ISDIR(s.st_mode)]
    shell = next((p for p in ("/bin/sh", "/usr/bin/sh") if _stat_in(root, p)), None)
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")
                   if _stat_in(root, p)), None)
    flavour, libc_path = _libc(root)
    if not bins or not (shell or flavour):
        out.append(Check("image", "rootfs", FAIL, f"{shown} has no /bin or /usr/bin with a shell "
                         "or a C library: not a usable root filesystem",
                         "unpack the image (e.g. 'umoci raw unpack' or 'docker export | tar -x')"))
        return out, None
    if _same(root, "/"):
        shown = "/, the host's own userland (read-only, homes hidden: docs/workstation.md)"
    out.append(Check("image", "rootfs", PASS, f"{shown}" + (f", shell {shell}" if shell else "")
                     + (f", python3 {python}" if python else "")))
    m = os.uname().machine
    debian = _stat_in(root, "/etc/debian_version") is not None
    libdir = f"/usr/lib/{m}-linux-gnu (Debian layout)" if debian else "/usr/lib64"
    if _same(root, "/"):
        # gpusandbox/hostroot.py: the host's root is never written to.
        libdir = ("nowhere: the host's own, used in place" if _same(opts.driver_root or "/", "/")
                  else "/run/gpusandbox/lib (the host's root stays read-only)")
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
