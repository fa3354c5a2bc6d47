"""`gpusandbox doctor --mpi`: what MPI and NCCL ranks launched from here will
find, and which transports will work between ranks on this node.

Run it where the ranks run (`srun -n N gpusandbox doctor --mpi [IMAGE_DIR]`):
it reads the caller's Slurm variables the way `run` does to choose pod mode,
and with IMAGE_DIR it starts one real rank in the step's pod and reports the
namespace identities, /dev/shm and hostname the command sees there (every
task of the step prints the same identities when they share a pod).
"""
import os
import resource
import socket
import sys

from .common import FAIL, PASS, WARN, Check, _read

S = "mpi"
# Open MPI's shared-memory segments and NCCL's buffers need a /dev/shm this big
# before anything else fails: below it a job dies with SIGBUS, not an error.
_SHM_LOW = 256 << 20
_PROBE = ('for n in pid ipc user mnt uts; do '
          'printf "ns %s %s\\n" $n "$(readlink /proc/self/ns/$n)"; done; '
          'printf "shm %s\\n" "$(stat -f -c "%b %S" /dev/shm) $(stat -c %d /dev/shm)"; '
          'printf "host %s\\n" "$(cat /proc/sys/kernel/hostname)"')


class _Spec:
    share = None


def check_mpi(opts, env=None):
    from gpusandbox.hpc import pod
    env = os.environ if env is None else env
    proc = opts.roots.proc
    out = []
    spec = _Spec()
    spec.share = opts.share
    tasks = pod.tasks_on_node(env)
    share = pod.choose(spec, env)
    where = f"Slurm step {env.get('SLURM_JOB_ID')}.{env.get('SLURM_STEP_ID')}, " \
            f"{tasks} task(s) on this node" if tasks else "not in a Slurm step"
    if share == "node":
        out.append(Check(S, "pod mode", PASS, f"--share node ({where}): ranks share user, pid "
                         "and IPC namespaces and /dev/shm"))
    else:
        out.append(Check(S, "pod mode", WARN if tasks > 1 else PASS,
                         f"--share none ({where}): every rank isolated",
                         "pass --share node for shared memory between ranks"))
    # Yama: CMA (process_vm_readv) between ranks is a ptrace access check.
    yama = _read(f"{proc}/sys/kernel/yama/ptrace_scope")
    if yama is None or yama in ("0", "1"):
        out.append(Check(S, "Yama ptrace scope", PASS, "no Yama" if yama is None else
                         f"{yama} (" + ("classic" if yama == "0" else
                                        "restricted: Open MPI and UCX call PR_SET_PTRACER") + ")"))
    else:
        out.append(Check(S, "Yama ptrace scope", WARN, f"{yama}: process_vm_readv between ranks is "
                         "denied, CMA will not work", "set kernel.yama.ptrace_scope=1, or "
                         "OMPI_MCA_btl_vader_single_copy_mechanism=none / UCX_TLS without cma"))
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)

    def fmt(v):
        return "unlimited" if v == resource.RLIM_INFINITY else f"{v >> 10} KiB"
    if soft == resource.RLIM_INFINITY or soft >= 1 << 30:
        out.append(Check(S, "memlock limit", PASS, f"{fmt(soft)} (hard {fmt(hard)})"))
    else:
        out.append(Check(S, "memlock limit", WARN, f"{fmt(soft)} (hard {fmt(hard)}): RDMA "
                         "(verbs, UCX rc/ud) and CUDA host registration need more",
                         "raise it (ulimit -l unlimited; Slurm: PropagateResourceLimits)"))
    host = _read(f"{proc}/sys/kernel/hostname") or socket.gethostname()
    out.append(Check(S, "hostname", PASS if share == "node" else WARN,
                     f"{host}: ranks see the host's" if share == "node" else
                     f"ranks see 'gpusandbox', not {host}: NCCL treats each as its own host",
                     "" if share == "node" else "pass --share node"))
    dirs = [f"{k}={env[k]}" for k in ("PMIX_SERVER_TMPDIR", "PMIX_SYSTEM_TMPDIR")
            if env.get(k)]
    missing = [d for d in dirs if not os.path.isdir(d.partition("=")[2])]
    if missing:
        out.append(Check(S, "PMIx directories", FAIL, f"missing: {', '.join(missing)}",
                         "srun --mpi=pmix sets them; check the PMIx plugin"))
    elif dirs:
        out.append(Check(S, "PMIx directories", PASS, f"bound at the same path: {', '.join(dirs)}"))
    else:
        out.append(Check(S, "PMIx directories", PASS if tasks == 0 else WARN,
                         "none (no PMIx server in this environment)",
                         "" if tasks == 0 else "launch with srun --mpi=pmix"))
    out += _transports(share, yama, opts, env)
    from .fabric import check_fabric
    out += check_fabric(opts, env)
    if opts.image and opts.probes:
        out += _probe(opts, env, host, share)
    return out


def _transports(share, yama, opts, env):
    out = []
    root_net = os.geteuid() == 0 and opts.net != "host"
    if share == "node":
        out.append(Check(S, "shared memory (sm, NCCL)", PASS, "works between the "
                         "ranks on this node"))
        cma_ok = yama in (None, "0", "1")
        out.append(Check(S, "single copy (CMA)", PASS if cma_ok else WARN,
                         "works (kcmp and process_vm_readv are allowed)" if cma_ok else
                         "denied by Yama", "" if cma_ok else
                         "OMPI_MCA_btl_vader_single_copy_mechanism=none"))
    else:
        out.append(Check(S, "shared memory (sm, NCCL)", WARN, "not between isolated "
                         "ranks (separate pid namespaces and /dev/shm)",
                         "--share node, or OMPI_MCA_btl=self,tcp"))
    if root_net:
        out.append(Check(S, "TCP between ranks", WARN, "commands running as root get a private "
                         "network namespace each", "pass --net host"))
    else:
        out.append(Check(S, "TCP between ranks", PASS, "the host's network"))
    return out


def _probe(opts, env, host, share):
    """One rank in the pod: what the command really sees."""
    import subprocess
    argv = [sys.executable, "-m", "gpusandbox", "run", "--share", share]
    if opts.net:
        argv += ["--net", opts.net]
    if not opts.image.startswith("/"):
        argv += ["--entrypoint", ""]        # a store image: the probe is the command
    argv += [opts.image, "sh", "-c", _PROBE]
    try:
        res = subprocess.run(argv, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return [Check(S, "rank probe", FAIL, "no answer within 120s", "")]
    if res.returncode:
        tail = (res.stderr.strip().splitlines() or [""])[-1]
        return [Check(S, "rank probe", FAIL, f"exit {res.returncode}: {tail}", "")]
    facts = {}
    for line in res.stdout.splitlines():
        key, _, val = line.partition(" ")
        facts.setdefault(key, []).append(val)
    ns = " ".join(v.replace(" ", "=") for v in facts.get("ns", []))
    out = [Check(S, "namespaces (rank)", PASS, ns or "unknown")]
    try:
        blocks, bsize, dev = facts["shm"][0].split()
        size = int(blocks) * int(bsize)
        out.append(Check(S, "/dev/shm (rank)", PASS if size >= _SHM_LOW else WARN,
                         f"device {dev}, {size >> 20} MiB",
                         "" if size >= _SHM_LOW else "pass --shm-size 1g or more"))
    except (KeyError, ValueError, IndexError):
        out.append(Check(S, "/dev/shm (rank)", WARN, "the probe could not stat it", ""))
    seen = (facts.get("host") or [""])[0]
    agree = seen == host
    out.append(Check(S, "hostname (rank)", PASS if agree else WARN,
                     f"{seen}" + (" = the host's" if agree else f", the host is {host}"),
                     "" if agree else "pass --share node (NCCL compares hostnames)"))
    return out
