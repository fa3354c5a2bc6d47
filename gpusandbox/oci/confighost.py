"""What the host supplies to an OCI config, never the config itself: the
host device nodes behind linux.devices.  (The driver root GPU injection
reads is a setting: gpusandbox.settings.)"""
import os
import stat

from ..imageroot import container_path
from .configfield import _bad, _get


def _host_node(major, minor, path):
    """A host character device node with these numbers: `path` itself, else
    one in /dev or a directory right below it."""
    def match(p):
        try:
            st = os.stat(p, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == \
            (major, minor)
    if match(path):
        return path
    try:
        top = sorted(os.scandir("/dev"), key=lambda e: e.name)
    except OSError:
        return None
    for e in top:
        if match(e.path):
            return e.path
    for e in top:
        if e.is_dir(follow_symlinks=False):
            try:
                for f in sorted(os.scandir(e.path), key=lambda e: e.name):
                    if match(f.path):
                        return f.path
            except OSError:
                continue
    return None


def _devices(linux, make=False):
    """linux.devices: ([(path, host node, major, minor)] to bind from the
    host, [(path, S_IF type, major, minor, mode, uid, gid)] to create).

    make: real root in the host's user namespace, where mknod(2) of every
    type is allowed (the init makes them, or `create` for a container with
    a user namespace of its own: stages/ocisetup.py); otherwise no process
    holds CAP_MKNOD and each character device is the host's node of the same
    numbers, bind-mounted at its path."""
    binds, nodes = [], []
    for i, d in enumerate(_get(linux, "devices", list, "linux", [])):
        where = f"linux.devices[{i}]"
        path, typ = _get(d, "path", str, where), _get(d, "type", str, where)
        major, minor = _get(d, "major", int, where), _get(d, "minor", int, where)
        if not path or not path.startswith("/") or "\0" in path:
            raise _bad(where, "path must be absolute")
        if typ not in ("c", "u", "b", "p"):
            raise _bad(where, f"{path}: unknown device type {typ!r}")
        if typ != "p" and (major is None or minor is None or major < 0 or minor < 0):
            raise _bad(where, f"{path}: a {typ} device needs major and minor")
        if make:
            mode = _get(d, "fileMode", int, where, 0o666)
            uid, gid = _get(d, "uid", int, where, 0), _get(d, "gid", int, where, 0)
            if not 0 <= mode <= 0o7777 or uid < 0 or gid < 0:
                raise _bad(where, f"{path}: fileMode, uid or gid out of range")
            kind = {"c": stat.S_IFCHR, "u": stat.S_IFCHR, "b": stat.S_IFBLK, "p": stat.S_IFIFO}
            nodes.append((container_path(path), kind[typ], major or 0, minor or 0, mode, uid, gid))
            continue
        if typ not in ("c", "u"):
            raise _bad(where, f"{path}: only character devices can be added here",
                       "block devices and fifos are created only for real root")
        host = _host_node(major, minor, path)
        if host is None:
            raise _bad(where, f"{path}: no host character device {major}:{minor}")
        binds.append((container_path(path), host, major, minor))
    return binds, nodes
