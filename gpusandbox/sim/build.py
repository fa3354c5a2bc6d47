"""Compiling the simulated driver's libraries and programs from src/*.c."""
import hashlib
import json
import os
import shutil
import subprocess

from gpusandbox.errors import GpuError

from .layout import BUILD

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src")
PLACEHOLDER = b"libgpusandbox-sim-soname-" + b"X" * 39  # 64 bytes, see generic.c


def build(root, lib_version, cuda, profiles):
    """Compile simsrc once per (sources, versions, MIG profiles) into root/.sim-build/KEY."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise GpuError("cannot build the simulated driver libraries", "no C compiler (gcc) on PATH",
                       hint="install gcc and the libc headers (Debian: apt-get install gcc libc6-dev)")
    mig = ";".join(f"{g}:{gi}:{p}" for g, d in sorted(profiles.items()) for gi, p in sorted(d.items()))
    flags = ["-O2", "-Wall", "-std=gnu11", f'-DSIM_LIB_VERSION="{lib_version}"',
             f"-DSIM_CUDA_VERSION={cuda}", f'-DSIM_MIG_PROFILES="{mig}"']
    digest = hashlib.sha256(json.dumps(flags).encode())
    for name in sorted(os.listdir(SRC)):
        with open(os.path.join(SRC, name), "rb") as f:
            digest.update(name.encode() + f.read())
    out = os.path.join(root, BUILD, digest.hexdigest()[:16])
    lib = ["-shared", "-fPIC"]
    jobs = {
        "cuda.so": lib + ["-Wl,-soname,libcuda.so.1", "cuda.c"],
        "nvml.so": lib + ["-Wl,-soname,libnvidia-ml.so.1", "nvml.c"],
        # No libc and no separate code segment keep each padding copy near 5 KB.
        "generic.so": lib + ["-nostdlib", "-s", "-Wl,-z,noseparate-code",
                             "-Wl,-soname," + PLACEHOLDER.decode(), "generic.c"],
        # DT_RPATH (not RUNPATH) so dlopen("libnvidia-ml.so.1") from the program
        # takes the NVML next to it, on the host side as in a sandbox, before
        # LD_LIBRARY_PATH or a real driver's NVML on the host.
        "smi": ["-Wl,--disable-new-dtags,-rpath,$ORIGIN/../lib/x86_64-linux-gnu:$ORIGIN/../lib64", "smi.c"],
        "tool": ["tool.c"],
    }
    for old in os.listdir(os.path.dirname(out)) if os.path.isdir(os.path.dirname(out)) else ():
        if old != os.path.basename(out):
            shutil.rmtree(os.path.join(os.path.dirname(out), old))
    if os.path.isdir(out):
        return out
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "32"), mode=0o755)
    _compile(cc, flags, tmp, jobs, required=True)
    # 32-bit copies only where the compiler has a multilib (gcc-multilib).
    if _compile(cc, flags + ["-m32"], os.path.join(tmp, "32"),
                {k: v for k, v in jobs.items() if k.endswith(".so")}, required=False):
        shutil.rmtree(os.path.join(tmp, "32"))
    os.rename(tmp, out)
    return out


def _compile(cc, flags, out, jobs, required):
    """Run the compiler jobs in parallel; return the first failure's stderr, or ''."""
    procs = {name: subprocess.Popen([cc, *flags, "-o", os.path.join(out, name), *args], cwd=SRC,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
             for name, args in jobs.items()}
    failed = ""
    for name, proc in procs.items():
        err = proc.communicate()[1].decode(errors="replace").strip()
        if proc.returncode != 0 and not failed:
            failed = err or f"{cc} exited with status {proc.returncode}"
            if required:
                raise GpuError(f"cannot build the simulated driver ({name})", failed.splitlines()[-1],
                               hint="install gcc and the libc headers (Debian: apt-get install gcc libc6-dev)")
    return failed


def with_soname(body, soname):
    """generic.so with `soname` written over its placeholder SONAME string."""
    name = soname.encode()
    if body.count(PLACEHOLDER) != 1 or len(name) >= len(PLACEHOLDER):
        raise GpuError(f"cannot give the simulated library the SONAME {soname}",
                       "the placeholder is missing or too short", hint="rebuild: remove DIR/.sim-build")
    return body.replace(PLACEHOLDER, name.ljust(len(PLACEHOLDER), b"\0"))
