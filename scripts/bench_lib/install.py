"""Find the peer launchers, installing missing ones from Debian packages."""
import os
import shutil
import subprocess

# command -> Debian package that ships it
PEERS = {"bwrap": "bubblewrap", "crun": "crun", "runc": "runc", "podman": "podman"}
APT_ENV = {"DEBIAN_FRONTEND": "noninteractive"}
# Another apt-get may hold the dpkg lock (an image build, another job): wait for it.
APT_LOCK = ["-o", "DPkg::Lock::Timeout=300"]


def _which(cmd):
    return shutil.which(cmd, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")


def _apt(args, log):
    env = dict(os.environ, **APT_ENV)
    log("+ apt-get " + " ".join(args))
    p = subprocess.run(["apt-get", *APT_LOCK, *args], env=env,
                       capture_output=True, text=True)
    tail = (p.stderr.strip() or p.stdout.strip()).splitlines()
    return p.returncode, (tail[-1] if tail else "")


def ensure(install, log):
    """Return {command: (path or None, reason)}: the reason says why a peer
    is missing, or how it got here."""
    found = {c: _which(c) for c in PEERS}
    missing = [c for c, p in found.items() if p is None]
    result = {c: (p, "installed") for c, p in found.items() if p}
    if not missing:
        return result
    if not install:
        for c in missing:
            result[c] = (None, f"not installed (--no-install; apt-get install {PEERS[c]})")
        return result
    if os.geteuid() != 0 or _which("apt-get") is None:
        why = "needs root" if os.geteuid() != 0 else "no apt-get on this host"
        for c in missing:
            result[c] = (None, f"not installed ({why}; install package {PEERS[c]})")
        return result
    rc, last = _apt(["update", "-q"], log)
    if rc != 0:
        log(f"apt-get update failed ({last}); trying the cached package lists")
    pkgs = [PEERS[c] for c in missing]
    rc, last = _apt(["install", "-y", "-q", "--no-install-recommends", *pkgs], log)
    if rc != 0:
        # One package may be unavailable (podman on a minimal mirror): take the rest.
        for c in missing:
            rc1, last1 = _apt(["install", "-y", "-q", "--no-install-recommends", PEERS[c]], log)
            if rc1 != 0:
                result[c] = (None, f"apt-get install {PEERS[c]} failed: {last1}")
    for c in missing:
        if c in result:
            continue
        path = _which(c)
        result[c] = (path, f"installed now (package {PEERS[c]})") if path else \
            (None, f"package {PEERS[c]} installed but {c} not on PATH")
    return result


def version(path):
    """First line of `<cmd> --version`, for the results file."""
    try:
        p = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (p.stdout or p.stderr).strip().splitlines()
    return lines[0] if lines else None
