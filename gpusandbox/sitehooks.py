"""Site hooks (docs/config.md, "Site hooks"): the executables of the site's
hooks directory (the `hooks-dir` setting), run in
lexical order at two points of every launch:

  rootfs  in the sandbox's namespaces, after its root filesystem is
          assembled (image, GPU files, binds, an OCI config's mounts and
          createContainer hooks) and before it is made read-only and
          pivoted into; the hook's working directory and fd 3 are the root
          ($GPUSANDBOX_ROOTFS=/proc/self/fd/3), so it may add files (they
          land in the sandbox's own writable layer) or mount into it.
          The stages' init runs it: `run`, the OCI runtime (podman, docker
          through gpusandbox-oci) and `slurm-oci` alike.
  exit    on the host, after the sandbox ended (no root filesystem):
          `run`'s launcher (and so `slurm-oci` and a SPANK step, which are
          `run`), with the command's "status" in the plan; the OCI
          runtime's `delete` (its caller collected the status, so "status"
          is null there), when `create` found site hooks.

Each hook is run as `HOOK POINT` (a hook ignores a point it does not
handle by exiting 0), with the plan as JSON on stdin, stdout joined to
stderr, and a clean environment (PATH, GPUSANDBOX_HOOK_POINT,
GPUSANDBOX_DOOR, GPUSANDBOX_ROOTFS).  A failing rootfs hook fails the
launch in one line naming it; a failing exit hook is a warning (the
command's status stands).

A hook comes only from the site: the directory must be root's and closed to
others, each hook a root-owned executable regular file no one else can
write; an entry that is not is skipped with a warning; the directory is a
site-only key (a user file cannot name one).  Nothing here comes from an
image, a spec or a user file."""
import os
import stat

from .conffile import owner_problem

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOTFS_FD = 3
_FOUND = []
# The door a launch came through when `run` is called by another one
# (hpc/slurmoci.py sets "slurm-oci"); else info() tells run from oci.
DOOR = []


def hooks(warn=None):
    """[path] of the site's hooks, in lexical order (cached per process: the
    launcher's list is the init's, which a clone inherits)."""
    if _FOUND:
        return _FOUND[0]
    from . import settings
    d = settings.current().get("hooks-dir")
    out = []
    try:
        dst = os.stat(d)
        names = sorted(os.listdir(d))
    except OSError:
        names = []
    else:
        why = owner_problem(dst, allow_caller=False)
        if why is not None or not stat.S_ISDIR(dst.st_mode):
            if warn:
                warn(f"site hooks directory {d} skipped: {why or 'not a directory'}")
            names = []
    for n in names:
        if n.startswith("."):
            continue
        p = os.path.join(d, n)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        why = owner_problem(st, allow_caller=False) if stat.S_ISREG(st.st_mode) \
            else "not a regular file"
        if why is None and not st.st_mode & 0o100:
            why = "not executable"
        if why is not None:
            if warn:
                warn(f"site hook {p} skipped: {why}")
            continue
        out.append(p)
    _FOUND.append(out)
    return out


def info(plan, point, status=None):
    """The plan as the hooks see it (stdin)."""
    spec = plan.spec
    door = DOOR[0] if DOOR else "oci" if getattr(plan, "oci", None) is not None else "run"
    doc = {"point": point, "door": door,
           "image": spec.image, "argv": list(spec.argv or []),
           "rootfs_mode": spec.rootfs_mode, "gpus": spec.gpus,
           "job": os.environ.get("SLURM_JOB_ID"), "step": os.environ.get("SLURM_STEP_ID")}
    if point == "exit":
        doc["status"] = status
    return doc


def run_point(point, doc, rootfd=None, paths=None):
    """Run every hook for `point`.  Returns [(hook, why)] of those that
    failed (the caller decides: the rootfs point fails the launch)."""
    import json
    failed = []
    body = json.dumps(doc).encode()
    for path in hooks() if paths is None else paths:
        env = {"PATH": PATH, "GPUSANDBOX_HOOK_POINT": point, "GPUSANDBOX_DOOR": doc["door"],
               "LANG": "C.UTF-8"}
        if rootfd is not None:
            env["GPUSANDBOX_ROOTFS"] = f"/proc/self/fd/{ROOTFS_FD}"
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(w)
                os.dup2(r, 0)
                os.dup2(2, 1)
                if rootfd is not None:
                    os.dup2(rootfd, ROOTFS_FD)
                    os.fchdir(ROOTFS_FD)
                else:
                    os.chdir("/")
                os.closerange(ROOTFS_FD + 1 if rootfd is not None else 3, 65536)
                os.execve(path, [path, point], env)
            except OSError as e:
                os.write(2, f"gpusandbox: site hook {path}: {e.strerror}\n".encode())
            os._exit(127)
        os.close(r)
        try:
            os.write(w, body)
        except OSError:
            pass            # the hook did not read its stdin: its choice
        finally:
            os.close(w)
        _, st = os.waitpid(pid, 0)
        if os.WIFSIGNALED(st):
            failed.append((path, f"killed by signal {os.WTERMSIG(st)}"))
        elif os.WEXITSTATUS(st):
            failed.append((path, f"exit status {os.WEXITSTATUS(st)}"))
    return failed


def rootfs_point(plan, rootfd):
    """The rootfs point, run by the init: OSError (the init's one line) when
    a hook fails."""
    paths = hooks()
    if not paths or plan.host_root:
        return
    failed = run_point("rootfs", info(plan, "rootfs"), rootfd, paths)
    if failed:
        path, why = failed[0]
        raise OSError(0, f"site hook {path} failed: {why}")


def exit_point(doc, status, warn):
    """The exit point with the plan `doc` (info(plan, "exit")): a failing
    hook is a `warn` line naming it; the command's status stands."""
    if not hooks():
        return
    for path, why in run_point("exit", dict(doc, point="exit", status=status)):
        warn(f"site hook {path} failed at exit: {why}")
