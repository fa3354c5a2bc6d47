"""The cross-user attack harness: a second account on the node (the
attacker, scripts/test-users' gsbxatk) acting against a victim (the test
user gsbxtest, or root), with canaries that tell whether anything of the
victim's was read or written.

    canaries = Canaries.plant(tmp)          # one per victim and in /root
    as_user(attack_user, ["sh", "-c", "ln -s /root /tmp/nvidia-mps"])
    ... the victim's launch ...
    canaries.check()                        # unchanged, nothing added

A canary is a private directory (0700, the victim's) holding a secret file;
check() fails when a file there changed, one was added or removed, or the
secret's text shows up in a given output (`leaked`).  /root's canary lives
in a fresh directory under /root, removed by remove().  Places an attacker
plants in (/tmp, /run, XDG_RUNTIME_DIR) are the caller's to make fresh: run
the victim in a private mount namespace with a tmpfs there (nsrun.py).
"""
import os
import pwd
import shutil
import subprocess
import tempfile

ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8", "HOME": "/"}


def as_user(user, argv, env=None, **kw):
    """Run argv as `user` (a pwd entry; None: root), with no supplementary
    groups, from /; returns the CompletedProcess."""
    if user is not None:
        argv = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                "--clear-groups", "--"] + list(argv)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 60)
    return subprocess.run(argv, env={**ENV, **(env or {})}, cwd="/", **kw)


class Canaries:
    def __init__(self, dirs):
        self.dirs = dirs                # {owner name: directory}
        self.secret = os.urandom(12).hex()
        self.before = {}

    @classmethod
    def plant(cls, base, users=(), root_dir="/root"):
        """A canary directory per user in `base` (made reachable), and one
        of root's under `root_dir` (/root; a test's private /tmp stand-in
        where root's private directory must be one there)."""
        os.chmod(base, 0o755)
        dirs = {"root": tempfile.mkdtemp(prefix="gsbx-canary-", dir=root_dir)}
        for u in users:
            d = os.path.join(base, f"canary-{u.pw_name}")
            os.mkdir(d, 0o700)
            os.chown(d, u.pw_uid, u.pw_gid)
            dirs[u.pw_name] = d
        self = cls(dirs)
        for name, d in dirs.items():
            p = os.path.join(d, "secret")
            with open(p, "w") as f:
                f.write(f"{name}:{self.secret}\n")
            os.chmod(p, 0o600)
            if name != "root":
                u = pwd.getpwnam(name)
                os.chown(p, u.pw_uid, u.pw_gid)
        self.before = self._snapshot()
        return self

    def _snapshot(self):
        out = {}
        for name, d in self.dirs.items():
            for e in sorted(os.listdir(d)):
                st = os.lstat(os.path.join(d, e))
                with open(os.path.join(d, e), "rb") as f:
                    out[(name, e)] = (st.st_mode, st.st_uid, f.read())
        return out

    def check(self, *leaked):
        """Nothing in a canary directory changed, and the secret is in none
        of `leaked` (outputs the attacker saw)."""
        assert self._snapshot() == self.before, "a canary directory changed"
        for text in leaked:
            assert self.secret not in (text or ""), "a canary's secret leaked"

    def remove(self):
        for d in self.dirs.values():
            shutil.rmtree(d, ignore_errors=True)
