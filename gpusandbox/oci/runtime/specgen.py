"""`spec`: a starting config.json, as `runc spec` writes one (a shell in
rootfs/, the system mounts, the default masked and read-only paths)."""
import json
import os

from ...errors import SandboxError
from ...plan import MASKED_DIRS, MASKED_FILES, READONLY_PATHS


def default_config(rootless=False):
    conf = {
        "ociVersion": "1.0.2",
        "process": {"terminal": True, "user": {"uid": 0, "gid": 0}, "args": ["sh"],
                    "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                            "TERM=xterm"],
                    "cwd": "/", "noNewPrivileges": True,
                    "capabilities": {k: ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"]
                                     for k in ("bounding", "effective", "permitted")},
                    "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]},
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "gpusandbox",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
             "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
             "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
             "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs",
             "options": ["nosuid", "noexec", "nodev", "ro"]}],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
                  "maskedPaths": list(MASKED_FILES + MASKED_DIRS),
                  "readonlyPaths": list(READONLY_PATHS)},
    }
    if rootless:
        conf["linux"]["namespaces"].append({"type": "user"})
        conf["linux"]["uidMappings"] = [{"containerID": 0, "hostID": os.geteuid(), "size": 1}]
        conf["linux"]["gidMappings"] = [{"containerID": 0, "hostID": os.getegid(), "size": 1}]
    return conf


def write_spec(bundle, rootless):
    path = os.path.join(bundle, "config.json")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except FileExistsError:
        raise SandboxError(f"{path} already exists", None, "remove it first") from None
    with os.fdopen(fd, "w") as f:
        json.dump(default_config(rootless), f, indent=2)
        f.write("\n")
    return 0
