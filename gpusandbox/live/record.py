"""The records of live sandboxes (docs/live.md): one directory per named or
detached sandbox in the part "live" of the caller's runtime directory
(rundir.py: /run/gpusandbox/live for real root, else the caller's own):

    live/NAME/          0700, the caller's
        record.json     0600: who, what, the launcher and init by pid and
                        start time, the cgroup leaf, and the command's
                        process settings as the planner made them (exec
                        starts the same process from them)
        log             0600: a detached sandbox's output (bounded, log.py)

A record is found only by walking from / under rundir's rule, every piece
the caller's, opened without following a link: another user can neither
read, plant nor rename one (a name is per user: two users may both have a
`train`).  It is written whole (renamed into place) by the launcher, once
when the sandbox's init exists and once with its exit status.

A sandbox is running while its launcher is (pid and start time: a recycled
pid never passes); a record whose launcher is gone without an exit status
(SIGKILL, OOM kill, a reboot) is stale and removed whenever seen.  Nothing
of a record is used as a host path or trusted beyond the caller's own
privilege: exec checks the cgroup leaf against init's own, and acts only
as the record's owner.
"""
import os
import stat
import time

from .. import rundir
from ..errors import SandboxError, UsageError
from ..linux import procstat
# json's C half without the package's import cost: every Slurm rank's launch
# writes a record.
from ..oci import fastjson as json

PART = "live"
RECORD = "record.json"
LOG = "log"
MAX_RECORD = 4 << 20       # env and a seccomp program: well under this
NAME_MAX = 64
NAME_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
NAME_CHARS = NAME_FIRST | frozenset("_.-")
NAME_HINT = "a name is 1 to 64 letters, digits, '_', '.' and '-', starting with a letter or digit"
VERSION = 1
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def check_name(name):
    if not isinstance(name, str) or not name or len(name) > NAME_MAX \
            or name[0] not in NAME_FIRST or not set(name) <= NAME_CHARS:
        from ..errors import printable
        raise UsageError(f"invalid sandbox name {printable(str(name))!r}", None, NAME_HINT)
    return name


def auto_name(image):
    """A name for a detached sandbox given none: the image's last path
    component (made a valid name) and random hex."""
    base = os.path.basename(str(image).rstrip("/").split("@")[0].split(":")[0]) or "sandbox"
    base = "".join(c if c in NAME_CHARS else "-" for c in base).strip("-._")[:40]
    if not base or base[0] not in NAME_FIRST:
        base = "sandbox"
    return f"{base}-{os.urandom(3).hex()}"


def slurm_task(environ):
    """(job, step, rank) of the Slurm task this process is, as strings of
    digits, or None outside a step (or with values that are not numbers)."""
    ids = tuple(environ.get(k) or "" for k in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID"))
    return ids if all(i.isdigit() and len(i) <= 20 for i in ids) else None


def slurm_name(task):
    """The record name of a Slurm task's sandbox that has no --name."""
    return "slurm-{}.{}.{}".format(*task)


def _refused(e):
    return SandboxError(f"sandbox records {e.path}", e.why,
                        f"remove {e.path} and run again" if not e.foreign else rundir.HINT_XDG)


def open_part(make=True):
    """(descriptor, path) of the caller's live/ directory by rundir's rule;
    (None, path) when it does not exist and `make` is false."""
    if make:
        return rundir.open_part(PART, meet=True)
    path = rundir.locate(PART)
    try:
        return rundir.trusted_dir(path), path
    except FileNotFoundError:
        return None, path
    except rundir.Taken as e:
        raise _refused(e) from None


def open_dir(pfd, part_path, name, uid=None):
    """A descriptor of live/NAME: a directory of `uid`'s (default: the
    caller's) that no one else may enter, not a link.  None when missing."""
    uid = os.geteuid() if uid is None else uid
    path = os.path.join(part_path, name)
    try:
        fd = os.open(name, _DIR, dir_fd=pfd)
    except FileNotFoundError:
        return None
    except OSError:
        raise SandboxError(f"sandbox record {path}", "a link or not a directory",
                           f"remove {path}") from None
    st = os.fstat(fd)
    if st.st_uid != uid or st.st_mode & 0o077:
        os.close(fd)
        raise SandboxError(f"sandbox record {path}",
                           f"owned by uid {st.st_uid} with mode {st.st_mode & 0o7777:04o}",
                           f"remove {path}")
    return fd


def read(dfd, path, uid=None):
    """The record in live/NAME (descriptor `dfd`), or None when it is
    missing or unreadable as a record (a launcher killed mid-way)."""
    try:
        data = rundir.read_owned(dfd, RECORD, MAX_RECORD, uid=uid, closed=True)
    except FileNotFoundError:
        return None
    except rundir.Taken as e:
        raise SandboxError(f"sandbox record {path}/{RECORD}", e.why, f"remove {path}") from None
    try:
        rec = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) and rec.get("version") == VERSION else None


def write(dfd, rec):
    """record.json in live/NAME, renamed into place whole."""
    replace(dfd, RECORD, json.dumps(rec).encode())


def replace(dfd, name, data):
    """File `name` of the directory dfd replaced whole by `data` (0600): written
    under a name of this process's, never through a link, then renamed."""
    tmp = f".{name}.{os.getpid()}"
    try:
        os.unlink(tmp, dir_fd=dfd)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dfd)
    with open(fd, "wb") as f:
        f.write(data)
    os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def state(rec):
    """starting (no init yet), running, exited (its status recorded) or
    stale (its launcher gone without one)."""
    if rec.get("exit_code") is not None:
        return "exited"
    pid, start = (rec.get("launcher") or (0, None))[:2]
    if procstat.alive(pid, start):
        return "running" if rec.get("init") else "starting"
    return "stale"


def remove(pfd, name):
    """live/NAME and what is in it (only plain files of ours are there)."""
    try:
        dfd = os.open(name, _DIR, dir_fd=pfd)
    except FileNotFoundError:
        return
    try:
        for entry in os.listdir(dfd):
            try:
                os.unlink(entry, dir_fd=dfd)
            except IsADirectoryError:
                pass
            except FileNotFoundError:
                pass
    finally:
        os.close(dfd)
    try:
        os.rmdir(name, dir_fd=pfd)
    except (FileNotFoundError, OSError):
        pass


def claim(name):
    """Make live/NAME for a new sandbox: (part descriptor, part path,
    directory descriptor).  A name in use is refused (a stale one is
    cleaned first)."""
    check_name(name)
    pfd, ppath = open_part(make=True)
    try:
        for _ in range(2):
            try:
                os.mkdir(name, 0o700, dir_fd=pfd)
                break
            except FileExistsError:
                dfd = open_dir(pfd, ppath, name)
                rec = read(dfd, os.path.join(ppath, name)) if dfd is not None else None
                if dfd is not None:
                    os.close(dfd)
                if rec is not None and state(rec) != "stale":
                    what = {"running": "a running sandbox", "starting": "a sandbox being started",
                            "exited": "a sandbox that has exited"}[state(rec)]
                    raise UsageError(f"the name {name!r} is in use by {what} of yours", None,
                                     f"choose another --name, or 'gpusandbox rm -f {name}' "
                                     "first")
                if rec is None and _young(pfd, name):
                    # Claimed a moment ago, its record not yet written.
                    raise UsageError(f"the name {name!r} is in use by a sandbox being started",
                                     None, "choose another --name")
                remove(pfd, name)
        else:
            raise UsageError(f"the name {name!r} is in use", None, "choose another --name")
        dfd = open_dir(pfd, ppath, name)
        return pfd, ppath, dfd
    except BaseException:
        os.close(pfd)
        raise


def _young(pfd, name, seconds=10):
    """Whether live/NAME was made less than `seconds` ago (a launch between
    its claim and its first record, a moment)."""
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except OSError:
        return False
    return time.time() - st.st_mtime < seconds


def entries(pfd, ppath, uid=None, clean=True):
    """[(name, record)] of every sandbox in live/, stale ones removed (when
    `clean`, the caller's own only) and left out."""
    out = []
    try:
        names = sorted(os.listdir(pfd))
    except OSError:
        return out
    for name in names:
        try:
            check_name(name)
        except UsageError:
            continue
        try:
            dfd = open_dir(pfd, ppath, name, uid)
        except SandboxError:
            continue
        if dfd is None:
            continue
        try:
            rec = read(dfd, os.path.join(ppath, name), uid)
        except SandboxError:
            rec = None
        finally:
            os.close(dfd)
        if rec is None:
            if clean and not _young(pfd, name):
                remove(pfd, name)
            continue
        if state(rec) == "stale":
            if clean:
                remove(pfd, name)
            continue
        out.append((name, rec))
    return out


def find(name, make=False):
    """(part descriptor, part path, record) of the caller's sandbox NAME;
    SandboxError (exit 125, one line and a hint) when there is none."""
    check_name(name)
    pfd, ppath = open_part(make=make)
    missing = SandboxError(f"no sandbox named {name!r}", None,
                           "'gpusandbox ps -a' lists yours")
    if pfd is None:
        raise missing
    try:
        dfd = open_dir(pfd, ppath, name)
        if dfd is None:
            raise missing
        try:
            rec = read(dfd, os.path.join(ppath, name))
        finally:
            os.close(dfd)
        if rec is None or state(rec) == "stale":
            if rec is not None or not _young(pfd, name):
                remove(pfd, name)
            raise missing
        return pfd, ppath, rec
    except BaseException:
        os.close(pfd)
        raise


def other_users():
    """[(uid, part path)] of other users' live/ directories where root can
    find them: /run/user/UID/gpusandbox/live and /tmp/gpusandbox-UID*/live
    (an XDG_RUNTIME_DIR elsewhere is known to its owner only)."""
    out = []
    cands = []
    try:
        cands += [f"/run/user/{u}/gpusandbox/{PART}" for u in os.listdir("/run/user")
                  if u.isdigit()]
    except OSError:
        pass
    try:
        cands += [f"/tmp/{d}/{PART}" for d in os.listdir("/tmp")
                  if d.startswith("gpusandbox-") and d[11:].split(".")[0].isdigit()]
    except OSError:
        pass
    for path in cands:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid != os.geteuid():
            out.append((st.st_uid, path))
    return out


def others():
    """(uid, record) of every other user's sandbox root can see (other_users),
    each directory held as that user's own (rundir.trusted_dir) and read
    without cleaning it up: it is theirs."""
    for uid, path in other_users():
        try:
            fd = rundir.trusted_dir(path, uid=uid)
        except (rundir.Taken, OSError):
            continue
        try:
            for _, rec in entries(fd, path, uid, clean=False):
                yield uid, rec
        finally:
            os.close(fd)
