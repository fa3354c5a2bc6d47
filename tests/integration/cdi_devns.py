"""Run a command where the simulated GPU host looks like a real one to podman.

Usage (as root): unshare -m --propagation slave python3 cdi_devns.py
                 SIM_DEV_DIR SPEC_DIR -- CMD [ARG...]

In this private mount namespace only (nothing propagates to the host):
  - /dev is a tmpfs holding the host's /dev entries (bound back one by one)
    and the simulated host's nvidia* nodes bound at /dev/nvidia*, because a
    rootless runtime cannot mknod and binds a CDI node from its *container*
    path on the host (runc's bindMountDeviceNode);
  - /run/cdi is SPEC_DIR: podman 4.3 reads specs only from /etc/cdi and
    /var/run/cdi (no option), and other tests must not see this spec.
"""
import os
import subprocess
import sys
import tempfile


def sh(*cmd):
    subprocess.run(cmd, check=True)


def bind_entry(src, dst):
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    if os.path.isdir(src):
        os.mkdir(dst)
        sh("mount", "--rbind", src, dst)
        return
    open(dst, "a").close()
    sh("mount", "--bind", src, dst)


def main():
    sim_dev, spec_dir = sys.argv[1], sys.argv[2]
    cmd = sys.argv[sys.argv.index("--") + 1:]
    old = tempfile.mkdtemp(prefix="gsbx-cdi-olddev-")
    sh("mount", "--rbind", "/dev", old)
    sh("mount", "-t", "tmpfs", "-o", "mode=755,nosuid", "tmpfs", "/dev")
    for name in sorted(os.listdir(old)):
        if not name.startswith("nvidia"):
            bind_entry(os.path.join(old, name), os.path.join("/dev", name))
    for name in sorted(os.listdir(sim_dev)):
        if name.startswith("nvidia"):
            bind_entry(os.path.join(sim_dev, name), os.path.join("/dev", name))
    sh("umount", "-l", old)
    os.rmdir(old)
    os.makedirs("/run/cdi", exist_ok=True)
    sh("mount", "--bind", spec_dir, "/run/cdi")
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main()
