"""doctor, a squashfs image file: mounted as `run FILE.sqsh` mounts it (the
same code: a detached read-only, nosuid, nodev mount, kernel squashfs as
root, squashfuse rootless), read through the mount's fd, and released when
the checks are done (closing the fd ends a detached mount; squashfuse is
stopped).  Nothing is attached in the host's mount namespace."""
import contextlib
import os
import types


@contextlib.contextmanager
def mounted(image, userns="auto"):
    """(root path, image env dict) of the squashfs file `image` while the
    block runs; `userns` is doctor's --userns (kernel squashfs only for real
    root in the host user namespace, as for run).  The env is the carried image config's (`pull -o`), else
    the file's /etc/environment, as `run` reads them."""
    from gpusandbox import environ
    from gpusandbox.image import squash, squashfuse, sqshconfig
    fake = types.SimpleNamespace(spec=types.SimpleNamespace(rootfs_mode="ro"),
                                 userns="host" if os.geteuid() == 0 and userns in ("auto", "host")
                                 else "single",
                                 squash=None, squash_pid=None)
    _shown, fd = squash.mount_image(image, fake)
    try:
        root = f"/proc/self/fd/{fd}"
        conf = sqshconfig.load(fd, image)
        env = list(conf.env) if conf is not None else environ.image_env(root, None, fd)[0]
        yield root, dict(env)
    finally:
        os.close(fd)
        if fake.squash_pid:
            squashfuse.stop(fake.squash_pid)
