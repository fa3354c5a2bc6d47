"""doctor, the three-step verification in a real sandbox."""
import os
import sys

from gpusandbox.spec import names_squashfs

from .common import FAIL, PASS, WARN, Check
from .driver import gpu_listing


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
    if names_squashfs(opts.image) and not os.path.isdir(opts.image) or \
            not opts.image.startswith("/"):     # a store image (doctor/storeimage.py)
        # The probe is the command, not arguments to the image's Entrypoint.
        argv += ["--entrypoint", ""]
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
