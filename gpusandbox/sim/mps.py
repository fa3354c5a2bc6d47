#!/usr/bin/python3
"""The simulated host's MPS stand-in: nvidia-cuda-mps-control, daemon (-d) and
control client.  `gpusandbox sim create` installs this very file as
DIR/usr/bin/nvidia-cuda-mps-control (install() below); the server binary
stays the generic stand-in, since the stand-in daemon never starts a server
(no CUDA context exists to serve).

A stand-in for tests of the wiring, not of MPS: it serves the pipe directory
the way the real daemon lays it out (`control` for every user, mode 0666;
`control_privileged`, mode 0600; `nvidia-cuda-mps-control.pid`; the log
directory's control.log), puts a segment in its /dev/shm as the real server
does (cuda.shm.*), and answers the control commands it is sent, storing the
limits and reading them back in the real daemon's lossy format.  It records
every command with the peer's uid and pid (SO_PEERCRED, as this daemon's user
namespace sees them) and the CUDA_MPS_* variables the client sends, in
<log>/journal.jsonl.  It enforces nothing: only a GPU shows enforcement.

Protocol (its own, not NVIDIA's): one SOCK_SEQPACKET message per command, a
JSON object {"cmd": "...", "env": {...}}; the reply is the text the real
control client would print.  Standalone: it runs inside sandboxes with the
image's python3, so it imports nothing of gpusandbox.
"""
import json
import os
import socket
import struct
import sys
import time

PIPE = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
LOG = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"
# Commands that change the daemon's state: only its own user (or root) may
# send them, as with a single-user daemon.
STATEFUL = ("quit", "set_default_active_thread_percentage", "set_active_thread_percentage",
            "set_default_device_pinned_mem_limit", "set_device_pinned_mem_limit",
            "start_server", "terminate_client", "shutdown_server")


def _size_mib(text):
    text = text.strip().upper()
    mult = {"G": 1024, "M": 1}.get(text[-1:])
    if mult is None or not text[:-1].replace(".", "", 1).isdigit():
        return None
    return int(float(text[:-1]) * mult)


def _shown_mib(mib):
    # The real daemon shows >= 1 GiB as floor(MiB/1024)G (readback is lossy).
    return f"{mib // 1024}G" if mib >= 1024 else f"{mib}M"


class Daemon:
    def __init__(self):
        self.uid = os.getuid()
        self.pct = None
        self.mem = {}
        self.journal = open(os.path.join(LOG, "journal.jsonl"), "a", buffering=1)
        self.log = open(os.path.join(LOG, "control.log"), "a", buffering=1)

    def record(self, **entry):
        self.journal.write(json.dumps(entry, sort_keys=True) + "\n")

    def answer(self, cmd, uid, privileged):
        words = cmd.split()
        if not words:
            return ""
        verb = words[0]
        if verb in STATEFUL and uid not in (self.uid, 0):
            return f"refused: uid {uid} is not this daemon's user ({self.uid})"
        if verb == "get_server_list":
            return ""
        if verb == "set_default_active_thread_percentage" and len(words) == 2:
            self.pct = float(words[1])
            return f"{self.pct:g}"
        if verb == "get_default_active_thread_percentage":
            return f"{self.pct if self.pct is not None else 100.0:.1f}"
        if verb == "set_default_device_pinned_mem_limit" and len(words) == 3:
            mib = _size_mib(words[2])
            if mib is None:
                return "Invalid memory limit"
            self.mem[words[1]] = mib
            return ""
        if verb == "get_default_device_pinned_mem_limit" and len(words) == 2:
            mib = self.mem.get(words[1])
            return "0" if mib is None else _shown_mib(mib)
        if verb == "quit":
            return ""
        return f"Unknown command: {verb}"

    def serve(self, ctl, priv):
        import select
        while True:
            ready, _, _ = select.select([ctl, priv], [], [])
            for lsock in ready:
                conn, _ = lsock.accept()
                with conn:
                    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
                        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
                    try:
                        msg = json.loads(conn.recv(65536).decode())
                        cmd = str(msg.get("cmd", ""))
                        env = {k: str(v) for k, v in dict(msg.get("env") or {}).items()}
                    except (ValueError, AttributeError, UnicodeDecodeError):
                        cmd, env = "", {}
                    privileged = lsock is priv
                    reply = self.answer(cmd, uid, privileged)
                    self.record(cmd=cmd, uid=uid, pid=pid, env=env, privileged=privileged,
                                reply=reply, daemon_uid=self.uid)
                    self.log.write(f"[{time.strftime('%F %T')}] cmd uid {uid}: {cmd}\n")
                    try:
                        conn.send(reply.encode())
                    except OSError:
                        pass
                    if cmd.split()[:1] == ["quit"] and not reply:
                        return


def _listen(path, mode):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)
    os.chmod(path, mode)
    s.listen(16)
    return s


def daemon():
    for d in (PIPE, LOG):
        os.makedirs(d, exist_ok=True)
    if os.fork():
        os._exit(0)
    os.setsid()
    if os.fork():
        os._exit(0)
    fd = os.open(os.devnull, os.O_RDWR)
    for n in (0, 1, 2):
        os.dup2(fd, n)
    d = Daemon()
    shm = f"/dev/shm/cuda.shm.sim.{os.getpid()}"
    with open(shm, "w") as f:
        f.write(f"gpusandbox-sim-mps {os.getpid()}\n")
    ctl = _listen(os.path.join(PIPE, "control"), 0o666)
    priv = _listen(os.path.join(PIPE, "control_privileged"), 0o600)
    pidfile = os.path.join(PIPE, "nvidia-cuda-mps-control.pid")
    with open(pidfile + ".tmp", "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(pidfile + ".tmp", pidfile)
    d.record(cmd="<start>", uid=d.uid, pid=os.getpid(), env={
        k: v for k, v in os.environ.items() if k.startswith(("CUDA_MPS_", "CUDA_VISIBLE"))},
        privileged=False, reply="", daemon_uid=d.uid)
    try:
        d.serve(ctl, priv)
    finally:
        for p in (os.path.join(PIPE, "control"), os.path.join(PIPE, "control_privileged"),
                  pidfile, shm):
            try:
                os.unlink(p)
            except OSError:
                pass
    return 0


def install(root, write):
    """Write this file as DIR/usr/bin/nvidia-cuda-mps-control; write is
    sim.layout.write(path, data, mode)."""
    with open(os.path.abspath(__file__), "rb") as f:
        write(os.path.join(root, "usr/bin/nvidia-cuda-mps-control"), f.read(), 0o755)


def client():
    env = {k: v for k, v in os.environ.items() if k.startswith("CUDA_MPS_")}
    status = 0
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                s.connect(os.path.join(PIPE, "control"))
                s.send(json.dumps({"cmd": line.strip(), "env": env}).encode())
                reply = s.recv(65536).decode()
        except OSError as e:
            print(f"Cannot find MPS control daemon process ({e.strerror})", file=sys.stderr)
            return 1
        if reply:
            print(reply)
        if reply.startswith(("refused", "Unknown", "Invalid")):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(daemon() if sys.argv[1:2] == ["-d"] else client())
