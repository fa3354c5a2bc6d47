"""`run --name` and `run -d`: the launch's side of a live sandbox's record
(record.py), and the detach.

The front end claims live/NAME before anything else (a clash is refused
before an image is even read), then, for -d, forks: the foreground waits
on a pipe until the command has started (or the launch failed, whose error
it prints with its exit status) and prints the name; the other side leaves
the caller's session and terminal, sends stdout and stderr to the log's
writer (log.py) and goes on as the sandbox's launcher.  The launcher
(stages/parent.py) calls started() once init exists and command_started()
once the command runs; the front end calls ended() with the status.
"""
import os
import time

from ..errors import message
from ..linux import procstat
from . import record

_READY, _FAILED = b"S", b"E"


class Live:
    def __init__(self, spec, slurm=None):
        """`slurm`: (job, step, rank) of the Slurm task this launch is
        (record.slurm_task), recorded for `exec --job`."""
        self.name = spec.name or (record.slurm_name(slurm) if slurm and not spec.detach
                                  else record.auto_name(spec.image))
        self.detached = spec.detach
        self.auto_remove = spec.auto_remove
        self.slurm = slurm
        self.pfd, self.part, self.dfd = record.claim(self.name)
        self.ready_w = None
        self.rec = {"version": record.VERSION, "name": self.name, "owner": os.geteuid(),
                    "image": str(spec.image), "argv": list(spec.argv or ()), "gpus": "",
                    "init": None, "cgroup": "", "created": time.time(),
                    "detached": bool(self.detached), "exit_code": None, "finished": None}
        if slurm:
            self.rec["slurm"] = dict(zip(("job", "step", "rank"), slurm))
        try:
            self.claimed()
        except BaseException:
            self._drop()
            raise

    def claimed(self):
        """The first record, naming this process as the launcher: the name
        is taken from here on (a launcher that dies now leaves a stale
        record, which the next look removes)."""
        me = procstat.start_time(os.getpid())
        self.rec["launcher"] = [os.getpid(), me[0] if me else None]
        record.write(self.dfd, self.rec)

    # --- the launcher's side ------------------------------------------------
    def started(self, plan, init_pid, cg):
        """init exists (held by the launcher's pidfd): the record, with
        what exec needs to start the command's twin."""
        it = procstat.start_time(init_pid)
        self.rec.update({
            "argv": list(plan.argv or ()),
            "gpus": plan.gpu.visible if plan.gpu is not None and not plan.gpu.none else "",
            "init": [init_pid, it[0] if it else None],
            # The leaf (cgroup2, or the v1 devices fallback): exec joins it.
            "cgroup": cg.path or "", "cgroup_version": cg.version if cg.path else None,
            "process": process_settings(plan),
        })
        record.write(self.dfd, self.rec)

    def command_started(self):
        if self.ready_w is not None:
            os.write(self.ready_w, _READY)
            os.close(self.ready_w)
            self.ready_w = None

    # --- the front end's side -------------------------------------------------
    def ended(self, status):
        """The launch is over with `status`: a detached sandbox's record
        keeps it (until `rm`), any other record goes."""
        self.command_started()
        if self.rec.get("init") is None or not self.detached or self.auto_remove:
            self._drop()
            return
        self.rec["exit_code"] = status
        self.rec["finished"] = time.time()
        try:
            record.write(self.dfd, self.rec)
        except OSError:
            pass
        self._close()

    def failed(self, err):
        """The launch failed before its command ran: the error goes to the
        foreground (-d) and nothing of the record stays."""
        if self.ready_w is not None:
            text = message(err).encode("utf-8", "replace")[:3000]
            try:
                os.write(self.ready_w, _FAILED + str(err.code).encode() + b"\n" + text)
            except OSError:
                pass
            os.close(self.ready_w)
            self.ready_w = None
        self._drop()

    def _drop(self):
        if self.pfd is not None:
            record.remove(self.pfd, self.name)
        self._close()

    def _close(self):
        for fd in (self.dfd, self.pfd):
            if fd is not None:
                os.close(fd)
        self.dfd = self.pfd = None


def process_settings(plan):
    """What the command stage reads of the plan, as the planner made it for
    this sandbox's command: exec starts its process from exactly these."""
    sc = plan.seccomp
    return {
        "env": dict(plan.env), "workdir": plan.workdir,
        "uid": plan.cmd_uid, "gid": plan.cmd_gid,
        "groups": list(plan.groups) if plan.groups is not None else None,
        "clear_groups": bool(plan.clear_groups),
        "caps": [list(plan.cap_bounding or ()), list(plan.cap_effective or ()),
                 list(plan.cap_permitted or ()), list(plan.cap_inheritable or ()),
                 list(plan.cap_ambient or ())],
        "no_new_privs": bool(plan.no_new_privs), "umask": plan.umask,
        "seccomp": bytes(sc).hex() if sc is not None else None,
    }


def detach(live):
    """Fork: this process returns as the detached launcher; the caller's
    side waits for the command to start and exits (never returns)."""
    from . import log
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid:
        os.close(ready_w)
        _foreground(live, ready_r)
    os.close(ready_r)
    os.setsid()
    live.ready_w = ready_w
    live.claimed()      # the launcher is this process from here on
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    out = log.start_writer(live.dfd)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)


def _foreground(live, ready_r):
    import sys
    data = b""
    while True:
        chunk = os.read(ready_r, 4096)
        if not chunk:
            break
        data += chunk
        if data[:1] == _READY:
            break
    if data[:1] == _READY:
        sys.stdout.write(live.name + "\n")
        sys.stdout.flush()
        os._exit(0)
    if data[:1] == _FAILED:
        head, _, text = data[1:].partition(b"\n")
        sys.stderr.write(text.decode("utf-8", "replace"))
        sys.stderr.flush()
        os._exit(int(head) if head.isdigit() else 125)
    sys.stderr.write(f"gpusandbox: error: the detached launcher of {live.name} ended before "
                     "its command started\nhint: 'gpusandbox logs "
                     f"{live.name}' shows what it wrote\n")
    sys.stderr.flush()
    os._exit(125)
