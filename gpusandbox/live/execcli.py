"""`gpusandbox exec` (docs/live.md): one more process in a running sandbox,
named or a Slurm task's, planned from the sandbox's record (live/join.py).

Kept apart from the other commands (live/cli.py) so that its path loads no
argparse and no json: its options are read from EXEC_OPTIONS directly, and
argparse answers only --help, a mistake and the command line reference;
its cost is held to a `run`'s (scripts/bench's live row)."""
import os

from ..errors import SandboxError, UsageError, printable
from . import record
from .cli import _find, _parser, _running


# exec's options, the one table its parsers read: (spellings, attribute,
# metavar or None for a flag, help).  -e may be repeated.
EXEC_OPTIONS = (
    (("-t", "--tty"), "tty", None,
     "a pseudo-terminal in the sandbox (when stdin is a terminal)"),
    (("-i", "--interactive"), "interactive", None,
     "accepted for docker's habit: stdin is always passed on"),
    (("-e", "--env"), "env", "KEY=VALUE",
     "set a variable (KEY alone: the caller's value); repeatable"),
    (("-w", "--workdir"), "workdir", "DIR", "working directory inside (default: the command's)"),
    (("-u", "--user"), "user", "UID[:GID]",
     "run as this numeric user (only in a sandbox whose command is uid 0 inside; without "
     "capabilities unless 0); default: the command's"),
    (("--job",), "job", "JOBID",
     "the Slurm job whose task's sandbox to enter, instead of NAME (default with "
     "--step/--rank: $SLURM_JOB_ID, as under 'srun --overlap --jobid JOBID')"),
    (("--step",), "step", "STEP",
     "its step (needed when the job has sandboxes in several steps on this node)"),
    (("--rank",), "rank", "RANK",
     "its task's rank, SLURM_PROCID (needed when the step has several on this node)"),
)


def exec_parser():
    import argparse
    p = _parser("exec", "Run CMD in the running sandbox NAME, or in the sandbox of a Slurm "
                "task on this node (--job, --step, --rank): its namespaces, cgroup, uid, "
                "groups, capabilities, no_new_privs, seccomp filter, environment and working "
                "directory as its command has them.")
    for flags, dest, metavar, text in EXEC_OPTIONS:
        if metavar is None:
            p.add_argument(*flags, dest=dest, action="store_true", help=text)
        elif dest == "env":
            p.add_argument(*flags, dest=dest, action="append", default=[], metavar=metavar,
                           help=text)
        else:
            p.add_argument(*flags, dest=dest, metavar=metavar, help=text)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="NAME CMD [ARG...]",
                   help="NAME is left out with --job/--step/--rank")
    return p


class _ExecArgs:
    __slots__ = tuple(dest for _, dest, _, _ in EXEC_OPTIONS) + ("command",)


def _exec_args(argv):
    """exec's arguments read from EXEC_OPTIONS as exec_parser reads them
    (options up to the first other word, which starts the command;
    `-it`, `-eK=V`, `--env=K=V`), or None for anything else (--help, an
    unknown or abbreviated option, a missing value, a value that looks like
    an option): exec_parser then answers, with its own message."""
    spell = {f: (dest, metavar) for flags, dest, metavar, _ in EXEC_OPTIONS for f in flags}
    a = _ExecArgs()
    for _, dest, metavar, _ in EXEC_OPTIONS:
        setattr(a, dest, [] if dest == "env" else None if metavar else False)

    def put(dest, val):
        if val.startswith("-"):
            return False
        if dest == "env":
            a.env.append(val)
        else:
            setattr(a, dest, val)
        return True
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--" or word == "-" or not word.startswith("-"):
            break
        if word.startswith("--"):
            name, eq, val = word.partition("=")
            if name not in spell:
                return None
            dest, metavar = spell[name]
            if metavar is None:
                if eq:
                    return None
                setattr(a, dest, True)
            else:
                val, i = _value(argv, i, val if eq else None)
                if val is None or not put(dest, val):
                    return None
        else:
            for j in range(1, len(word)):
                if "-" + word[j] not in spell:
                    return None
                dest, metavar = spell["-" + word[j]]
                if metavar is None:
                    setattr(a, dest, True)
                    continue
                val, i = _value(argv, i, word[j + 1:] or None)
                if val is None or not put(dest, val):
                    return None
                break
        i += 1
    a.command = argv[i:]
    return a


def _value(argv, i, inline):
    """(an option's value, the index of the last word it used): `inline`
    when the word itself held it (--opt=V, -oV), else the next word; None
    when there is none."""
    if inline is not None:
        return inline, i
    i += 1
    return (argv[i], i) if i < len(argv) else (None, i)


def _slurm_target(job, step, rank, lowest=False):
    """The record of the running sandbox of Slurm task (job, step, rank)
    among the caller's on this node; one line naming what is missing or
    ambiguous otherwise (`lowest`: several ranks are no ambiguity, the
    lowest is taken)."""
    for what, v in (("--job", job), ("--step", step), ("--rank", rank)):
        if v is not None and not (v.isdigit() and len(v) <= 20):
            raise UsageError(f"invalid {what} {printable(v)!r}", "not a number", None)
    pfd, ppath = record.open_part(make=False)
    rows = []
    if pfd is not None:
        try:
            rows = [rec for _, rec in record.entries(pfd, ppath)
                    if record.state(rec) == "running" and isinstance(rec.get("slurm"), dict)
                    and rec["slurm"].get("job") == job]
        finally:
            os.close(pfd)
    everything = rows
    if step is not None:
        rows = [r for r in rows if r["slurm"].get("step") == step]
    if rank is not None:
        rows = [r for r in rows if r["slurm"].get("rank") == rank]
    what = f"job {job}" + (f" step {step}" if step else "") + (f" rank {rank}" if rank else "")
    if not rows:
        here = ", ".join(sorted(f"step {r['slurm'].get('step')} rank {r['slurm'].get('rank')}"
                                for r in everything))
        raise SandboxError(f"no running sandbox of yours for {what} on this node",
                           f"this node has {here}" if here else None,
                           "run exec on the rank's node (srun --overlap --jobid JOB -w NODE "
                           "gpusandbox exec --rank R CMD); only the job's owner can")
    steps = sorted({r["slurm"].get("step") for r in rows}, key=int)
    if len(steps) > 1:
        raise UsageError(f"{what} has sandboxes in steps {', '.join(steps)} on this node",
                         None, "choose one with --step")
    if len(rows) > 1 and lowest:
        rows = [min(rows, key=lambda r: int(r["slurm"].get("rank")))]
    if len(rows) > 1:
        ranks = sorted((r["slurm"].get("rank") for r in rows), key=int)
        raise UsageError(f"{what} has ranks {', '.join(ranks)} on this node", None,
                         "choose one with --rank")
    return rows[0]


def _owner_of_job(job, step, rank):
    """Real root: the uid of the one other user with a running sandbox of
    this Slurm task on the node, or None.  Their records are read only to
    pick whose they are: exec then runs as that user (_become), who reads
    them again as any of their own."""
    found = set()
    for uid, rec in record.others():
        t = rec.get("slurm")
        if isinstance(t, dict) and t.get("job") == job and record.state(rec) == "running" \
                and step in (None, t.get("step")) and rank in (None, t.get("rank")):
            found.add(uid)
    return found.pop() if len(found) == 1 else None


def _become(uid):
    """Drop from real root to `uid` for good (its primary group, no other):
    what follows runs with that user's privileges and finds its directories."""
    import pwd
    try:
        pw = pwd.getpwuid(uid)
        gid, home = pw.pw_gid, pw.pw_dir
    except KeyError:
        gid, home = uid, "/"
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    for var in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME"):
        os.environ.pop(var, None)
    os.environ["HOME"] = home


def slurm_record(job, step=None, rank=None, lowest=False):
    """The record of a running Slurm task's sandbox on this node, found as
    `exec --job` finds it (also the SPANK plugin's join of a running named
    container, hpc/spanktask.py): among the caller's own; real root finds a
    user's by becoming that user for good first, never entering as root."""
    try:
        return _slurm_target(job, step, rank, lowest)
    except SandboxError:
        # Real root may enter a user's job: as that user, never as root.
        owner = _owner_of_job(job, step, rank) if os.geteuid() == 0 else None
        if owner is None:
            raise
        _become(owner)
        return _slurm_target(job, step, rank, lowest)


def main_exec(argv):
    a = _exec_args(argv) or exec_parser().parse_args(argv)
    words = a.command[1:] if a.command[:1] == ["--"] else a.command
    slurm = a.job is not None or a.step is not None or a.rank is not None
    if slurm:
        job = a.job or os.environ.get("SLURM_JOB_ID")
        if not job:
            raise UsageError("exec --step/--rank: which job?", "no --job and no SLURM_JOB_ID",
                             "give --job JOBID")
        argv = words
    else:
        if not words:
            raise UsageError("exec: missing NAME", None, "gpusandbox exec NAME CMD [ARG...]")
        argv = words[1:]
        if argv[:1] == ["--"]:
            argv = argv[1:]
    if not argv:
        raise UsageError("exec: missing CMD", None, "gpusandbox exec NAME CMD [ARG...]")
    from ..cli import parse_env_item, parse_user
    for item in a.env:
        parse_env_item(item)
    user = parse_user(a.user) if a.user is not None else None
    if a.workdir is not None and not a.workdir.startswith("/"):
        raise UsageError(f"invalid --workdir {printable(a.workdir)!r}", "not an absolute path",
                         "example: -w /workspace")
    if slurm:
        rec = slurm_record(job, a.step, a.rank)
    else:
        pfd, rec = _find(words[0])
        os.close(pfd)
        _running(rec)
    from . import join
    tty = a.tty and os.isatty(0)
    plan = join.make_plan(rec, argv, a.env, a.workdir, tty, os.environ, user)
    return join.run(rec, plan, tty)
