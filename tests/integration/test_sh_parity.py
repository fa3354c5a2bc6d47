"""bin/gpusandbox-oci and the Python path side by side: command x container
state x arguments, each cell run once through the shell entry and once
through `gpusandbox oci` on a container in the same state, root and
rootless (podman runs the entry as either).  The two must give the same
exit status, the same stdout (JSON compared as data), the same stderr lines
(their class and their words, numbers aside) and leave the container in
the same state, with the same signals delivered to the workload.  The
cells the entry answers itself are asserted to start no Python: a matrix
where everything fell back would compare the Python path with itself.

States: absent, created, running, paused (where the container has a
cgroup2 leaf to freeze), stopped; and no container at all: a bad id, a
state directory planted by another user, one of the caller's that lets
others in, a state.fast others can write, a link in ROOT.  Arguments:
--root DIR, podman's spelling (--root=DIR, --log FILE, --log-format json,
--cgroup-manager, --systemd-cgroup), and the default root."""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from gpusandbox.oci.runtime import state as ocistate

from .conftest import CLI, MODES, VENV

OCI = str(VENV / "bin" / "gpusandbox-oci")
# The workload: pid 1 of its pid namespace, so it gets only the signals it
# handles (and SIGKILL): it records those it traps in /mnt/log.
TRAPS = ("TERM", "USR1", "HUP")
WORKLOAD = "".join(f"trap 'echo {s} >> /mnt/log' {s}; " for s in TRAPS) + \
    "echo up >> /mnt/log; while :; do sleep 0.05; done"
KILLS = ("KILL", "SIGKILL", "9")
# The commands with a short cut in the entry, each spelling it takes once.
SHORT = [("state",), ("kill",), ("kill", "KILL"), ("kill", "15"), ("delete",),
         ("delete", "--force"), ("start",)]
SIGNALS = (None, "TERM", "SIGTERM", "15", "USR1", "SIGUSR1", "10", "HUP", *KILLS,
           "term", "RTMIN+1", "NOPE", "0", "65", "SIG")
COMMANDS = [("state",), *((("kill", s) if s else ("kill",)) for s in SIGNALS),
            ("delete",), ("delete", "--force"), ("delete", "-f"), ("start",)]
LIVE = ("created", "running", "paused")
# Where the entry answers without Python (docs/oci.md, "The shell entry").
FAST_SIGNALS = {None, "TERM", "SIGTERM", "15", "USR1", "SIGUSR1", "10", "HUP", *KILLS}


def fast_expected(cmd, status, how="plain"):
    """Whether the entry answers cmd without Python; how: state.fast's last
    line (`start` where a stopped container's delete needs Python: cgroup v1
    leaves, as root on a hybrid host, or site exit hooks)."""
    if cmd[0] == "state":
        return status in (*LIVE, "stopped")
    if cmd[0] == "kill":
        return status in LIVE and (cmd[1] if len(cmd) > 1 else None) in FAST_SIGNALS
    if cmd[0] == "start":
        return status == "created"
    return status == "stopped" and how == "plain"    # delete, with or without --force


def fast_how(state_dir):
    """state.fast's `how` line of a container (None: no such file)."""
    try:
        return (state_dir / "state.fast").read_text().splitlines()[6]
    except (OSError, IndexError):
        return None


def argv_of(cmd, cid):
    """The command line with the id where runc puts it."""
    if cmd[0] == "delete":
        return ["delete", *cmd[1:], cid]
    return [cmd[0], cid, *cmd[1:]]


def line_class(line):
    m = re.match(r"gpusandbox: (\w+):", line)
    return m.group(1) if m else "other"


def outcome(r):
    """(exit status, stdout as data, stderr lines as (class, words))."""
    try:
        out = json.loads(r.stdout) if r.stdout.strip() else r.stdout
    except ValueError:
        out = r.stdout
    err = [(line_class(ln), re.sub(r"\d+", "N", ln)) for ln in r.stderr.splitlines()]
    return r.returncode, out, err


class Caller:
    """One caller (root, or the test user) with both paths."""

    def __init__(self, mode, user, tmp):
        self.mode, self.user, self.tmp = mode, user, tmp
        self.uid, self.gid = (0, 0) if mode == "root" else (user.pw_uid, user.pw_gid)
        self.env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "XDG_RUNTIME_DIR": str(tmp / "xdg")}
        self.root = tmp / "root" / "s"
        self.log = tmp / "xdg" / "oci.log"
        self.log.touch()
        os.chown(self.log, self.uid, self.gid)
        self.default = Path("/run/gpusandbox-oci" if mode == "root"
                            else tmp / "xdg" / "gpusandbox-oci")
        if mode == "root":
            # Root's state root in a directory of root's: one of the test
            # user's is refused (the user could swap the hooks root runs).
            for d in (tmp, tmp / "root"):
                os.chown(d, 0, 0)

    def globals(self, variant):
        if variant == "--root":
            return ["--root", str(self.root)]
        if variant == "podman":
            return ["--root=" + str(self.root), "--log", str(self.log), "--log-format", "json",
                    "--cgroup-manager", "cgroupfs", "--systemd-cgroup"]
        return []

    def where(self, variant):
        return self.default if variant == "default" else self.root

    def argv(self, argv):
        if self.mode == "root":
            return argv
        return ["setpriv", f"--reuid={self.user.pw_uid}", f"--regid={self.user.pw_gid}",
                "--clear-groups", "--", *argv]

    def run(self, argv, **kw):
        return subprocess.run(self.argv(argv), capture_output=True, text=True, env=self.env,
                              cwd="/", timeout=60, **kw)

    def entry(self, args):
        """The entry's result and whether it started Python (strace)."""
        trace = self.tmp / "trace"
        r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace),
                            *self.argv([OCI, *args])], capture_output=True, text=True,
                           env=self.env, cwd="/", timeout=60)
        execs = [ln for ln in trace.read_text().splitlines() if "execve(" in ln and "= 0" in ln]
        return r, any("python" in ln for ln in execs)

    def python(self, args):
        return self.run([CLI, "oci", *args])

    def status(self, g, cid):
        r = self.python([*g, "state", cid])
        return json.loads(r.stdout)["status"] if r.returncode == 0 else None


class Containers:
    """Containers of one caller brought into a given state, again and again
    under one id (so both paths see the same id, bundle and root)."""

    def __init__(self, c, rootfs):
        self.c, self.rootfs = c, rootfs
        self.out = c.tmp / "out"
        # The workload's uid 0 has no capabilities (none in the config):
        # the directory it writes to is its own.
        os.chown(self.out, c.uid, c.gid)
        self.bundle = c.tmp / "bundle"
        self.bundle.mkdir(exist_ok=True)
        conf = {"ociVersion": "1.0.2",
                "process": {"args": ["sh", "-c", WORKLOAD], "cwd": "/",
                            "user": {"uid": 0, "gid": 0}, "env": ["PATH=/usr/bin:/bin"]},
                "root": {"path": str(rootfs), "readonly": True},
                "mounts": [{"destination": "/mnt", "type": "bind", "source": str(self.out),
                            "options": ["rbind", "rw"]}],
                "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")]}}
        if c.mode == "rootless":
            conf["linux"]["namespaces"].append({"type": "user"})
            conf["linux"]["uidMappings"] = [{"containerID": 0, "hostID": c.uid, "size": 1}]
            conf["linux"]["gidMappings"] = [{"containerID": 0, "hostID": c.gid, "size": 1}]
        (self.bundle / "config.json").write_text(json.dumps(conf))

    def log(self):
        try:
            return (self.out / "log").read_text().split()
        except FileNotFoundError:
            return []

    def make(self, g, cid, want):
        """The container `cid` in status `want` (None: absent); False where
        this caller cannot bring it there (pause without a cgroup leaf)."""
        c = self.c
        if c.status(g, cid) == want and (want != "running" or "up" in self.log()):
            return True
        c.python([*g, "delete", "--force", cid])
        assert c.status(g, cid) is None
        if want is None:
            return True
        (self.out / "log").unlink(missing_ok=True)
        with open(c.tmp / "create.err", "w+") as err:
            r = subprocess.run(c.argv([CLI, "oci", *g, "create", "--bundle", str(self.bundle),
                                       cid]),
                               stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=c.env,
                               cwd="/", timeout=60)
            err.seek(0)
            assert r.returncode == 0, err.read()
        if want == "created":
            return True
        assert c.python([*g, "start", cid]).returncode == 0
        self.wait(lambda: "up" in self.log(), "the workload to start")
        if want == "paused":
            r = c.python([*g, "pause", cid])
            if r.returncode != 0:
                assert c.mode == "rootless", r.stderr
                return False
        if want == "stopped":
            assert c.python([*g, "kill", cid, "KILL"]).returncode == 0
            self.wait(lambda: c.status(g, cid) == "stopped", "the container to stop")
        assert c.status(g, cid) == want
        return True

    @staticmethod
    def wait(pred, what):
        deadline = time.monotonic() + 20
        while not pred():
            assert time.monotonic() < deadline, f"waited for {what}"
            time.sleep(0.02)

    def after(self, g, cid, cmd, r, before, log0):
        """What the command left: the status, and the signals the workload
        recorded since `log0` (waited for where one must show up)."""
        new = lambda: self.log()[len(log0):]
        if cmd[0] == "kill" and r.returncode == 0:
            sig = cmd[1] if len(cmd) > 1 else "TERM"
            name = {"15": "TERM", "10": "USR1", "1": "HUP"}.get(sig, sig.upper()
                                                             .removeprefix("SIG"))
            if name in KILLS:
                self.wait(lambda: self.c.status(g, cid) == "stopped", "the kill")
            elif before == "running" and name in TRAPS:
                self.wait(lambda: name in new(), f"SIG{name} in the workload")
        if cmd[0] == "start" and r.returncode == 0:
            self.wait(lambda: "up" in new(), "the workload to start")
        return self.c.status(g, cid), new()


@pytest.fixture
def tmp(test_user):
    d = Path(tempfile.mkdtemp(prefix="gsbx-shparity-"))
    os.chmod(d, 0o755)
    for sub in ("root", "xdg", "out"):
        (d / sub).mkdir()
        os.chown(d / sub, test_user.pw_uid, test_user.pw_gid)
    os.chmod(d / "xdg", 0o700)
    os.chown(d, test_user.pw_uid, test_user.pw_gid)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _cell(c, g, cid, cmd, before, box=None):
    """One cell: the entry, then the Python path on a container brought
    back to `before`; their outcomes and what each left, and whether the
    entry started Python."""
    results = []
    for path in ("entry", "python"):
        if box is not None:
            assert box.make(g, cid, before)
            log0 = box.log()
        args = [*g, *argv_of(cmd, cid)]
        if path == "entry":
            r, py = c.entry(args)
        else:
            r = c.python(args)
        left = None
        if box is not None:
            left = box.after(g, cid, cmd, r, before, log0)
        results.append((outcome(r), left))
    (fast, fast_left), (ref, ref_left) = results
    assert fast == ref, (cid, cmd, before, fast, ref)
    assert fast_left == ref_left, (cmd, before, fast_left, ref_left)
    return py


@pytest.mark.slow
@pytest.mark.parametrize("status", [None, *LIVE, "stopped"])
@pytest.mark.parametrize("mode", MODES)
def test_commands_on_containers_in_each_state(mode, status, tmp, test_user, rootfs, cli):
    c = Caller(mode, test_user, tmp)
    box = Containers(c, rootfs)
    cid = f"par-{os.getpid()}-{mode}"
    taken = []
    try:
        for variant in ("--root", "podman", "default"):
            g = c.globals(variant)
            if variant == "default":
                os.makedirs(c.default, 0o700, exist_ok=True)
                os.chown(c.default, c.uid, c.gid)
            if not box.make(g, cid, status):
                pytest.skip("pause needs a cgroup2 leaf of the container's (rootless: none here)")
            how = fast_how(Path(c.where(variant)) / cid)
            for cmd in COMMANDS:
                py = _cell(c, g, cid, cmd, status, box)
                want = fast_expected(cmd, status, how)
                assert py is not want, (variant, cmd, status, "python" if py else "no python")
                taken.append((variant, cmd, py))
            c.python([*g, "delete", "--force", cid])
        # Nothing the Python path logs but errors: the entry's answers add none.
        text = c.log.read_text()
        assert all(json.loads(ln)["level"] == "error" for ln in text.splitlines()), text
    finally:
        for variant in ("--root", "default"):
            c.python([*c.globals(variant), "delete", "--force", cid])
    assert taken


# -- no container: ids and state directories the entry must hand over --------

BAD_IDS = ["-x", ".x", "a/b", "..", "a b", "x" * (ocistate.ID_MAX + 1), "caf\u00e9", "a*"]


@pytest.mark.parametrize("mode", MODES)
def test_bad_ids_and_absent_containers(mode, tmp, test_user, cli):
    c = Caller(mode, test_user, tmp)
    g = c.globals("--root")
    c.root.mkdir(mode=0o700)
    os.chown(c.root, c.uid, c.gid)
    for cid in [*BAD_IDS, "nosuch"]:
        for cmd in SHORT:
            assert _cell(c, g, cid, cmd, None), (cid, cmd)     # Python answers
    assert os.listdir(c.root) == []


def _plant(root, cid, owner, pid, mode=0o700, fast_mode=0o600):
    """A state directory with a state.fast naming `pid`, as `owner` (uid,
    gid) leaves it."""
    d = Path(root) / cid
    d.mkdir(mode=0o700)
    ocistate.save({"id": cid, "bundle": "/b", "rootfs": "/b/r", "created": "now",
                   "annotations": {}, "cgroup": "", "cgroup_version": 2, "pid": pid,
                   "start_time": ocistate.start_time(pid)[0], "_dir": str(d)})
    os.chmod(d / "state.fast", fast_mode)
    for p in (d, *d.iterdir()):
        os.chown(p, *owner)
    os.chmod(d, mode)
    return d


PLANTS = {
    # another user's directory in the caller's root
    "foreign": dict(owner="other"),
    # the caller's, but open to others / its state.fast writable by others
    "open": dict(mode=0o755),
    "fastw": dict(fast_mode=0o666),
    # a link in ROOT to a state directory of the caller's elsewhere
    "link": dict(link=True),
}


def _planted(c, cid, kind, other, cmd, path):
    """One run of `cmd` by `path` on a fresh plant naming a fresh process
    of root's: (outcome with that pid as PID, whether the process
    outlived the command, what is left in ROOT)."""
    victim = subprocess.Popen(["sleep", "300"])
    try:
        spec = PLANTS[kind]
        owner = other if spec.get("owner") else (c.uid, c.gid)
        where = c.tmp / "xdg" if spec.get("link") else c.root
        d = _plant(where, cid, owner, victim.pid, spec.get("mode", 0o700),
                   spec.get("fast_mode", 0o600))
        if spec.get("link"):
            os.symlink(d, c.root / cid)
            os.lchown(c.root / cid, c.uid, c.gid)
        args = [*c.globals("--root"), *argv_of(cmd, cid)]
        r, py = c.entry(args) if path == "entry" else (c.python(args), True)
        try:
            victim.wait(timeout=5 if cmd[0] == "kill" and r.returncode == 0 else 0.01)
        except subprocess.TimeoutExpired:
            pass
        rc, out, err = outcome(r)
        if isinstance(out, dict) and out.get("pid") == victim.pid:
            out["pid"] = "PID"
        return ((rc, out, err), victim.poll() is None, sorted(os.listdir(c.root))), py
    finally:
        victim.kill()
        victim.wait()
        for p in (c.root / cid, c.tmp / "xdg" / cid):
            if p.is_symlink():
                p.unlink()
            else:
                shutil.rmtree(p, ignore_errors=True)


@pytest.mark.parametrize("mode", MODES)
def test_planted_state_directories(mode, tmp, test_user, attack_user, cli):
    """A state another user planted in the caller's root, one of the
    caller's that lets others in or whose state.fast others can write, and a
    link in ROOT: the entry hands each to the Python path, whose answer it
    then is, and the process the plant names is signalled by neither unless
    the Python path takes the state as the caller's."""
    c = Caller(mode, test_user, tmp)
    c.root.mkdir(mode=0o700)
    os.chown(c.root, c.uid, c.gid)
    other = (attack_user.pw_uid, attack_user.pw_gid)
    for kind in PLANTS:
        for cmd in SHORT:
            fast, py = _planted(c, kind, kind, other, cmd, "entry")
            ref, _ = _planted(c, kind, kind, other, cmd, "python")
            assert fast == ref, (kind, cmd, fast, ref)
            assert py, (kind, cmd)
            if kind in ("foreign", "open"):
                assert fast[1], (kind, cmd)       # refused: nothing signalled
