"""The probe of the door parity test (test_door_parity.py): run inside a
sandbox as `python3 /parity/probe.py`, it prints one JSON object describing
the sandbox as the workload sees it, normalised so that two launches of the
same workload through different doors compare equal where they are equal:

  mounts   /proc/self/mountinfo in order: mount point, filesystem type, the
           mount's own options and the superblock options that do not name
           host paths or sizes (no ids, no sources, no overlay layer paths)
  dev      /dev (not /dev/pts, /dev/shm, /dev/mqueue): name -> "c MAJ:MIN",
           "b MAJ:MIN", "dir", "-> TARGET", or "file"
  gpu      each /dev/nvidia* node opened read-write: "ok" or the errno name
           (ENXIO: past the device filter, no driver behind the simulated
           node; EPERM: refused by the cgroup device filter)
  env      the environment
  ids      uid, gid, euid, egid and the supplementary groups
  status   CapInh/CapPrm/CapEff/CapBnd/CapAmb, NoNewPrivs, Seccomp from
           /proc/self/status
  cgroup   /proc/self/cgroup's controllers of each line and whether the
           path is the namespace root ("/")
  net      the network interfaces (/sys/class/net), loopback's state
  bind     what the workload reads and may write through the bind at /data
  umask, cwd, hostname

Only the standard library: the image's python3 runs it.
"""
import errno
import json
import os
import socket
import stat
import sys

# Superblock options that carry host paths, sizes or ids, not behaviour.
HOST_SPECIFIC = ("lowerdir=", "upperdir=", "workdir=", "size=", "nr_inodes=", "uid=", "gid=",
                 "fd=", "pgrp=", "timeout=", "minproto=", "maxproto=", "pipe_ino=", "user_id=",
                 "group_id=", "redirect_dir=", "index=", "xino=", "metacopy=", "max_read=",
                 "blksize=", "inode64", "ptmxmode=", "mode=")
SKIP_DEV = ("pts", "shm", "mqueue")


def mounts():
    """In mountinfo's order; each with the mount point of its parent and its
    depth in a stack of mounts at the same point (0: the first there), which
    is where order matters: a mount made before one over it or over an
    ancestor is hidden."""
    out, by_id, stacks = [], {}, {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            head, tail = line.rstrip("\n").split(" - ", 1)
            fields = head.split(" ")
            mid, parent, point, opts = fields[0], fields[1], fields[4], fields[5]
            point = point.replace("\\040", " ")
            fstype, _source, sopts = tail.split(" ", 2)
            keep = sorted(o for o in sopts.split(",")
                          if o not in ("rw", "ro") and not o.startswith(HOST_SPECIFIC))
            m = {"point": point, "type": fstype, "opts": sorted(opts.split(",")),
                 "super": keep, "parent": parent, "stack": stacks.get(point, 0)}
            stacks[point] = stacks.get(point, 0) + 1
            by_id[mid] = point
            out.append(m)
    for m in out:
        m["parent"] = by_id.get(m["parent"], "(outside)")
    return out


def dev():
    out = {}
    for d, dirs, files in os.walk("/dev"):
        rel = os.path.relpath(d, "/dev")
        if rel == ".":
            dirs[:] = [x for x in dirs if x not in SKIP_DEV]
        for name in sorted(dirs + files):
            p = os.path.join(d, name)
            key = os.path.relpath(p, "/dev")
            try:
                st = os.lstat(p)
            except OSError as e:
                out[key] = errno.errorcode.get(e.errno, str(e.errno))
                continue
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
                out[key] = f"{kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
            elif stat.S_ISLNK(st.st_mode):
                out[key] = "-> " + os.readlink(p)
            elif stat.S_ISDIR(st.st_mode):
                out[key] = "dir"
            else:
                out[key] = "file"
        # A bind of a directory over a node name is not walked further.
        dirs[:] = [x for x in dirs if not os.path.islink(os.path.join(d, x))]
    return out


def gpu():
    out = {}
    for name in sorted(os.listdir("/dev")):
        if not name.startswith("nvidia"):
            continue
        p = "/dev/" + name
        if not stat.S_ISCHR(os.lstat(p).st_mode):
            continue
        try:
            os.close(os.open(p, os.O_RDWR))
            out[name] = "ok"
        except OSError as e:
            out[name] = errno.errorcode.get(e.errno, str(e.errno))
    return out


def status():
    want = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp")
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in want:
                out[k] = v.strip()
    return out


def cgroup():
    out = []
    with open("/proc/self/cgroup") as f:
        for line in f:
            _hid, ctrl, path = line.rstrip("\n").split(":", 2)
            out.append({"controllers": ctrl, "root": path == "/"})
    return sorted(out, key=lambda c: c["controllers"])


def net():
    names = sorted(os.listdir("/sys/class/net"))
    lo = None
    try:
        with open("/sys/class/net/lo/operstate") as f:
            lo = f.read().strip()
        with open("/sys/class/net/lo/flags") as f:
            lo += " up" if int(f.read(), 16) & 1 else " down"
    except OSError:
        pass
    return {"interfaces": names, "lo": lo}


def bind():
    out = {}
    try:
        with open("/data/hello") as f:
            out["read"] = f.read()
    except OSError as e:
        out["read"] = errno.errorcode.get(e.errno, str(e.errno))
    out["writable"] = os.access("/data", os.W_OK)
    return out


def main():
    umask = os.umask(0)
    os.umask(umask)
    report = {
        "mounts": mounts(), "dev": dev(), "gpu": gpu(), "env": dict(os.environ),
        "ids": {"uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(),
                "egid": os.getegid(), "groups": sorted(os.getgroups())},
        "status": status(), "cgroup": cgroup(), "net": net(), "bind": bind(),
        "umask": oct(umask), "cwd": os.getcwd(), "hostname": socket.gethostname(),
    }
    json.dump(report, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


main()
