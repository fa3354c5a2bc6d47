"""A minimal conmon for the OCI runtime tests: becomes a child subreaper,
drives `create`/`start`/`state`/`delete` of the runtime, and reaps the
container's init itself, printing one JSON object of what it saw.

usage: oci_caller.py RUNTIME ROOT BUNDLE ID
"""
import ctypes
import json
import os
import subprocess
import sys


def main():
    runtime, root, bundle, cid = sys.argv[1:5]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)          # PR_SET_CHILD_SUBREAPER
    rt = [runtime, "--root", root]
    out = {}
    pid_file = os.path.join(os.path.dirname(root), f"{cid}.pid")
    # The init inherits create's stdio, as conmon's pipes: the workload writes
    # to this process's stderr, and create's own errors go to a file.
    err_file = os.path.join(os.path.dirname(root), f"{cid}.err")
    with open(err_file, "w+") as err:
        r = subprocess.run(rt + ["create", "--bundle", bundle, "--pid-file", pid_file, cid],
                           stdout=2, stderr=err, stdin=subprocess.DEVNULL)
        err.seek(0)
        out["create"] = [r.returncode, err.read()]
    os.unlink(err_file)
    if r.returncode:
        print(json.dumps(out))
        return
    pid = int(open(pid_file).read())
    os.unlink(pid_file)
    with open(f"/proc/{pid}/status") as f:
        st = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    out["comm"] = st["Name"]
    out["ppid_is_caller"] = int(st["PPid"]) == os.getpid()
    state = lambda: json.loads(subprocess.run(rt + ["state", cid], capture_output=True,
                                              text=True).stdout or "{}")
    s = state()
    out["created"] = [s.get("status"), s.get("pid") == pid]
    r = subprocess.run(rt + ["start", cid], capture_output=True, text=True)
    out["start"] = [r.returncode, r.stderr]
    _, status = os.waitpid(pid, 0)
    out["exit"] = os.waitstatus_to_exitcode(status)
    out["stopped"] = state().get("status")
    r = subprocess.run(rt + ["delete", cid], capture_output=True, text=True)
    out["delete"] = [r.returncode, r.stderr]
    out["left"] = sorted(os.listdir(root))
    print(json.dumps(out))


main()
