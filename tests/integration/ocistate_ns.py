"""Steps of gpusandbox-oci callers (a victim, an attacker, root) run in a
private mount namespace with fresh tmpfs on /tmp and /run, so that the
XDG_RUNTIME_DIR, /run/user/UID and /run/gpusandbox-oci each case needs can
be made (or left out) without touching the machine's.

    got = run_steps(users, [
        sh("attacker", "mkdir -m 0777 /tmp/xdg"),
        plant("/tmp/xdg/gpusandbox-oci", "c1", owner="attacker", hooks=...),
        sh("victim", '"$OCI" delete --force c1', env={"XDG_RUNTIME_DIR": "/tmp/xdg"}),
    ])
    got["steps"][2]   # {"rc", "out", "err", "py"}: py, with trace=True, whether Python ran

A sleeper of the victim's runs for the whole sequence ($SLEEPER in each
step's environment, and the default pid of a planted state): got["sleeper"]
says whether it was still alive at the end.  Every container init the steps
left (found in any state.json under /tmp, /run and `cleanup`) is killed and
its cgroup leaf removed before the namespace goes.
"""
import json
import subprocess

from .conftest import CLI, VENV

OCI = str(VENV / "bin" / "gpusandbox-oci")
PYTHON = str(VENV / "bin" / "python3")

HARNESS = r"""
import json, os, signal, subprocess, sys, time
from gpusandbox.oci.runtime import state as ocistate
spec = json.loads(sys.argv[1])
users = {k: tuple(v) for k, v in spec["users"].items()}
users["root"] = (0, 0)
for d, mode in (("/tmp", "1777"), ("/run", "755")):
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=" + mode, "tmpfs", d], check=True)
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8",
            "HOME": "/", "OCI": spec["oci"], "CLI": spec["cli"]}


def argv_as(who, argv):
    name = who.split("-")[0]
    if name == "root":
        return argv
    uid, gid = users[name]
    pre = ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", "--"]
    return pre + (["unshare", "-r", "--"] if who.endswith("-userns") else []) + argv


vuid, vgid = users["victim"]
sleeper = subprocess.Popen(argv_as("victim", ["sleep", "600"]))
BASE_ENV["SLEEPER"] = str(sleeper.pid)
out = []
for i, st in enumerate(spec["steps"]):
    if st["kind"] == "plant":
        uid, gid = users[st["owner"]]
        d = os.path.join(st["root"], st["id"])
        os.makedirs(st["root"], exist_ok=True)
        os.mkdir(d, 0o700)
        pid = st.get("pid") or sleeper.pid
        ocistate.save({"id": st["id"], "pid": pid, "start_time": ocistate.start_time(pid)[0],
                       "bundle": st.get("bundle", "/planted"), "rootfs": "/planted/rootfs",
                       "created": "now", "annotations": {}, "cgroup": "", "cgroup_version": 2,
                       "hooks": st.get("hooks") or {}, "_dir": d})
        for name in ("state.json", "state.fast"):
            os.chown(os.path.join(d, name), uid, gid)
            os.chmod(os.path.join(d, name), st.get("file_mode", 0o600))
        os.chown(d, uid, gid)
        os.chmod(d, st.get("dir_mode", 0o700))
        out.append({})
        continue
    env = dict(BASE_ENV, **st.get("env", {}))
    argv = ["sh", "-c", st["sh"]]
    trace = "/run/.trace-%d" % i
    if st.get("trace"):
        open(trace, "w").close()
        os.chmod(trace, 0o666)
        argv = ["strace", "-f", "-qq", "-e", "trace=execve", "-o", trace] + argv
    r = subprocess.run(argv_as(st["as"], argv), capture_output=True, text=True, env=env,
                       cwd="/", timeout=120, stdin=subprocess.DEVNULL)
    res = {"rc": r.returncode, "out": r.stdout, "err": r.stderr}
    if st.get("trace"):
        with open(trace) as f:
            res["py"] = any("python" in ln and "execve(" in ln and "= 0" in ln for ln in f)
    out.append(res)
alive = sleeper.poll() is None
sleeper.kill()
sleeper.wait()
# Containers the steps left (what a test on an unfixed tree creates): their
# inits killed, their cgroup leaves removed.
leaves = []
for top in ["/tmp", "/run"] + spec.get("cleanup", []):
    for d, _, files in os.walk(top):
        if "state.json" not in files:
            continue
        try:
            with open(os.path.join(d, "state.json")) as f:
                rec = json.load(f)
            pid = int(rec.get("pid") or 0)
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        if pid > 0 and ocistate.start_time(pid) and \
                ocistate.start_time(pid)[0] == rec.get("start_time"):
            os.kill(pid, signal.SIGKILL)
            end = time.monotonic() + 10
            while os.path.exists("/proc/%d" % pid) and time.monotonic() < end:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                time.sleep(0.05)
        if rec.get("cgroup"):
            leaves.append(rec["cgroup"])
for leaf in leaves:
    try:
        os.rmdir(leaf)
    except OSError:
        pass
print(json.dumps({"steps": out, "sleeper": alive}))
"""


def sh(who, script, env=None, trace=False):
    """`script` run by sh as `who` ("victim", "attacker", "root", or
    "victim-userns": the victim as root of a user namespace of its own)."""
    return {"kind": "sh", "as": who, "sh": script, "env": env or {}, "trace": trace}


def plant(root, cid, owner="victim", hooks=None, bundle="/planted", dir_mode=0o700,
          file_mode=0o600, pid=None):
    """A container state ROOT/ID as state.save writes it, naming the
    sleeper (or `pid`), with `owner`'s ids on the directory and files."""
    return {"kind": "plant", "root": root, "id": cid, "owner": owner, "hooks": hooks,
            "bundle": bundle, "dir_mode": dir_mode, "file_mode": file_mode, "pid": pid}


def run_steps(users, steps, cleanup=()):
    """Run `steps` ({"victim": pwd entry, "attacker": pwd entry}) in a
    private mount namespace (as root); the harness's JSON result."""
    spec = {"users": {k: [u.pw_uid, u.pw_gid] for k, u in users.items()}, "steps": steps,
            "oci": OCI, "cli": CLI, "cleanup": list(cleanup)}
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", PYTHON, "-I",
                        "-c", HARNESS, json.dumps(spec)], capture_output=True, text=True,
                       timeout=600, cwd="/")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def one_line_error(res):
    """Whether a result is a refusal in gpusandbox's words: nonzero, one
    `gpusandbox: error:` line and at most a hint line, nothing on stdout."""
    lines = res["err"].splitlines()
    return res["rc"] != 0 and res["out"] == "" and 1 <= len(lines) <= 2 and \
        lines[0].startswith("gpusandbox: error: ") and \
        all(ln.startswith("hint: ") for ln in lines[1:])
