"""Find the peer launchers, installing missing ones from Debian packages."""
import os
import shutil
import subprocess
import tomllib

# command -> Debian package that ships it
PEERS = {"bwrap": "bubblewrap", "crun": "crun", "runc": "runc", "podman": "podman"}
# what the images section runs: the registry, the pusher and copier, the unpacker
IMAGE_TOOLS = {"docker-registry": "docker-registry", "skopeo": "skopeo", "umoci": "umoci"}
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


def ensure(install, log, peers=PEERS):
    """Return {command: (path or None, reason)}: the reason says why a peer
    is missing, or how it got here.  `peers`: {command: package}."""
    found = {c: _which(c) for c in peers}
    missing = [c for c, p in found.items() if p is None]
    result = {c: (p, "installed") for c, p in found.items() if p}
    if not missing:
        return result
    if not install:
        for c in missing:
            result[c] = (None, f"not installed (--no-install; apt-get install {peers[c]})")
        return result
    if os.geteuid() != 0 or _which("apt-get") is None:
        why = "needs root" if os.geteuid() != 0 else "no apt-get on this host"
        for c in missing:
            result[c] = (None, f"not installed ({why}; install package {peers[c]})")
        return result
    rc, last = _apt(["update", "-q"], log)
    if rc != 0:
        log(f"apt-get update failed ({last}); trying the cached package lists")
    pkgs = [peers[c] for c in missing]
    rc, last = _apt(["install", "-y", "-q", "--no-install-recommends", *pkgs], log)
    if rc != 0:
        # One package may be unavailable (podman on a minimal mirror): take the rest.
        for c in missing:
            rc1, last1 = _apt(["install", "-y", "-q", "--no-install-recommends", peers[c]], log)
            if rc1 != 0:
                result[c] = (None, f"apt-get install {peers[c]} failed: {last1}")
    for c in missing:
        if c in result:
            continue
        path = _which(c)
        result[c] = (path, f"installed now (package {peers[c]})") if path else \
            (None, f"package {peers[c]} installed but {c} not on PATH")
    return result


def version(path):
    """First line of `<cmd> --version`, for the results file."""
    try:
        p = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (p.stdout or p.stderr).strip().splitlines()
    return lines[0] if lines else None


def find_gpusandbox(opt, tmp, repo, log):
    """The command to measure: --gpusandbox, else a regular (non-editable)
    install of this checkout made for the run, as users install it; the
    editable .venv is a last resort (its import hook costs ~7 ms a launch)."""
    if opt:
        return os.path.abspath(opt) if os.path.exists(opt) else None
    venv = os.path.join(tmp, "venv")
    ok = subprocess.run(["/usr/bin/python3", "-m", "venv", venv],
                        capture_output=True).returncode == 0 and subprocess.run(
        [os.path.join(venv, "bin", "pip"), "install", "-q", "--no-deps", repo],
        capture_output=True, cwd="/").returncode == 0
    if ok:
        # The project's dependencies (the registry client's requests among
        # them), read from pyproject.toml as the test suite's install does.
        with open(os.path.join(repo, "pyproject.toml"), "rb") as f:
            deps = tomllib.load(f)["project"]["dependencies"]
        p = subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", *deps],
                           capture_output=True, text=True, cwd="/")
        if p.returncode:
            log("could not install the dependencies (" +
                (p.stderr.strip().splitlines() or ["pip failed"])[-1] +
                "); image pulls will fail")
        # As the README installs it: setuptools out of the venv once installed
        # (its .pth file runs at every interpreter start).
        subprocess.run([os.path.join(venv, "bin", "pip"), "uninstall", "-qy", "setuptools"],
                       capture_output=True, cwd="/")
        log(f"measuring a regular install of {repo} in {venv}")
        return os.path.join(venv, "bin", "gpusandbox")
    dev = os.path.join(repo, ".venv", "bin", "gpusandbox")
    log("could not install a regular copy; measuring the editable .venv (slower start-up)")
    return dev if os.path.exists(dev) else shutil.which("gpusandbox")


def interpreter_of(script, path):
    """The Python that runs the gpusandbox entry script (its #! line)."""
    try:
        with open(script, "rb") as f:
            first = f.readline().decode(errors="replace")
    except OSError:
        return None
    if first.startswith("#!"):
        parts = first[2:].split()
        if parts and os.path.basename(parts[0]) != "env":
            return parts[0]
        if len(parts) > 1:
            return shutil.which(parts[1], path=path)
    return None
