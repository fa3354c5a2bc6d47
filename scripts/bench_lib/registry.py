"""A local registry: Debian's docker-registry (the distribution registry) on
127.0.0.1, filled with skopeo from OCI layouts written here.  Shared by the
benchmark's images section, scripts/demo and the test fixtures
(tests/integration/registry_fixture.py), so there is one implementation.

    cd scripts && python3 -m bench_lib.registry serve DIR   # start; prints PORT PID
    ... image LAYOUT ROOTFS TAG      # an OCI layout of one layer from a tree
    ... push DIR LAYOUT TAG REPO[:TAG]
    ... stop DIR

Needs only the standard library (the benchmark and the demo run it with the
system Python)."""
import gzip
import hashlib
import io
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REGISTRY_BIN = "/usr/bin/docker-registry"
OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"

# "GET /v2/<repo>/blobs/sha256:<hex> HTTP/1.1" <status> <bytes>: the access
# log line the registry writes for every request, whatever its log level.
_BLOB_GET = re.compile(r'"GET (/v2/\S+/blobs/(sha256:[0-9a-f]{64})) HTTP/[0-9.]+" (\d+) (\d+|-)')


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def tar_bytes(files):
    """An uncompressed tar of {name: bytes} (regular files, mode 0644)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in sorted(files.items()):
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 0
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


class Layout:
    """An OCI image layout being written (blobs, index.json)."""

    def __init__(self, path):
        self.path = Path(path)
        (self.path / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        (self.path / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
        self.refs = []

    def blob(self, data, media_type):
        d = sha(data)
        (self.path / "blobs" / "sha256" / d[7:]).write_bytes(data)
        return {"mediaType": media_type, "digest": d, "size": len(data)}

    def blob_file(self, tmp, digest, size, media_type):
        """Adopts a blob already written to `tmp` (in the layout's directory)."""
        os.replace(tmp, self.path / "blobs" / "sha256" / digest[7:])
        return {"mediaType": media_type, "digest": digest, "size": size}

    def layer(self, files, compression):
        raw = tar_bytes(files)
        if compression == "gzip":
            data, mt = gzip.compress(raw, mtime=0), OCI_LAYER_GZIP
        elif compression == "zstd":
            data = subprocess.run(["zstd", "-q", "-c"], input=raw, stdout=subprocess.PIPE,
                                  check=True).stdout
            mt = OCI_LAYER_ZSTD
        else:
            data, mt = raw, OCI_LAYER_TAR
        return self.blob(data, mt), sha(raw)

    def manifest(self, descs, diff_ids, arch="amd64", variant=None,
                 env=("PATH=/usr/bin:/bin",), cmd=("/bin/sh",)):
        """The config and manifest over layers already written."""
        cfg = {"architecture": arch, "os": "linux",
               "config": {"Env": list(env), "Cmd": list(cmd)},
               "rootfs": {"type": "layers", "diff_ids": list(diff_ids)}}
        if variant:
            cfg["variant"] = variant
        config = self.blob(json.dumps(cfg).encode(), OCI_CONFIG)
        m = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config,
             "layers": list(descs)}
        raw = json.dumps(m).encode()
        return self.blob(raw, OCI_MANIFEST), m, raw

    def image(self, layers, arch="amd64", variant=None, env=("PATH=/usr/bin:/bin",)):
        descs, diff_ids = [], []
        for files, comp in layers:
            d, diff = self.layer(files, comp)
            descs.append(d)
            diff_ids.append(diff)
        return self.manifest(descs, diff_ids, arch=arch, variant=variant, env=env)

    def tag(self, desc, name):
        self.refs.append(dict(desc, annotations={"org.opencontainers.image.ref.name": name}))
        (self.path / "index.json").write_text(json.dumps(
            {"schemaVersion": 2, "manifests": self.refs}))


def spawn(argv, log, die_with_parent=True):
    """Start a registry command (argv) in its own session, its output to
    `log`.  It dies with the thread that started it (setpriv --pdeathsig:
    PR_SET_PDEATHSIG, kept across the execs), so a test run or benchmark
    killed before its teardown (a timeout's SIGTERM) leaves no registry
    behind; scripts/demo's `serve` outlives its own command on purpose."""
    lead = ["setpriv", "--pdeathsig", "TERM", "--"] if die_with_parent else []
    return subprocess.Popen(lead + list(argv), stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


class Registry:
    """docker-registry serving `top`/data on 127.0.0.1:<free port>; its
    access log is `top`/registry.log."""

    def __init__(self, top, htpasswd=None, token=None, die_with_parent=True):
        top = Path(top)
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.top = top
        cfg = [
            "version: 0.1",
            "log:",
            "  level: error",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {top / 'data'}",
            "http:",
            f"  addr: {self.host}",
            f"  secret: {secrets.token_hex(16)}",
        ]
        if htpasswd:
            cfg += ["auth:", "  htpasswd:", "    realm: gsbx-test", f"    path: {htpasswd}"]
        if token:
            cfg += ["auth:", "  token:", f"    realm: {token.realm}",
                    f"    service: {token.SERVICE}", f"    issuer: {token.ISSUER}",
                    f"    rootcertbundle: {token.cert}"]
        (top / "config.yml").write_text("\n".join(cfg) + "\n")
        self.log = open(top / "registry.log", "wb")
        self.proc = spawn([REGISTRY_BIN, "serve", str(top / "config.yml")], self.log,
                          die_with_parent)
        self.pid = self.proc.pid
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2).close()
                break
            except urllib.error.HTTPError:
                break           # 401: up, with auth
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("docker-registry did not start: " +
                                       (top / "registry.log").read_text()[-2000:])
                time.sleep(0.1)

    def push(self, layout, tag, repo, creds=None, all_=False, dest_tag=None):
        """Copies layout:tag to repo:tag (repo:dest_tag); returns the manifest digest in the
        registry (skopeo may recompress, so it can differ from the layout's)."""
        dfile = self.top / f"digest-{secrets.token_hex(4)}"
        argv = ["skopeo", "--insecure-policy", "copy", "-q", "--dest-tls-verify=false",
                "--digestfile", str(dfile)]
        if all_:
            argv.append("--all")
        if creds:
            argv += ["--dest-creds", f"{creds[0]}:{creds[1]}"]
        argv += [f"oci:{layout}:{tag}", f"docker://{self.host}/{repo}:{dest_tag or tag}"]
        subprocess.run(argv, check=True, timeout=1800, stdout=subprocess.DEVNULL,
                       env=dict(os.environ, TMPDIR=str(self.top)))
        return dfile.read_text().strip()

    def _blob_lines(self, since):
        with open(self.top / "registry.log", "rb") as f:
            f.seek(since)
            for line in f.read().decode(errors="replace").splitlines():
                m = _BLOB_GET.search(line)
                if m:
                    yield m

    def blob_gets(self, since=0):
        """{path: count} of the blob GETs in the access log after byte `since`
        (log_size() before the action)."""
        out = {}
        for m in self._blob_lines(since):
            out[m.group(1)] = out.get(m.group(1), 0) + 1
        return out

    def blob_bytes(self, since=0):
        """{digest: [count, bytes sent]} of the blob GETs after byte `since`."""
        out = {}
        for m in self._blob_lines(since):
            c = out.setdefault(m.group(2), [0, 0])
            c[0] += 1
            c[1] += int(m.group(4)) if m.group(4).isdigit() else 0
        return out

    def log_size(self):
        self.log.flush()
        # The registry writes its access log lines after the response;
        # give the last one a moment to land.
        time.sleep(0.05)
        return os.path.getsize(self.top / "registry.log")

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


# -- a command line for shell scripts (scripts/demo) --------------------------

def _cli(argv):
    if len(argv) >= 2 and argv[0] == "serve":
        top = Path(argv[1])
        top.mkdir(parents=True, exist_ok=True)
        reg = Registry(top, die_with_parent=False)
        (top / "registry.pid").write_text(f"{reg.pid}\n")
        print(reg.port, reg.pid)
        return 0
    if len(argv) == 5 and argv[0] == "push":
        top, layout, tag, ref = argv[1:]
        repo, _, dest_tag = ref.partition(":")
        reg = object.__new__(Registry)
        reg.top = Path(top)
        reg.host = f"127.0.0.1:{_port_of(reg.top)}"
        print(reg.push(layout, tag, repo, dest_tag=dest_tag or None))
        return 0
    if len(argv) == 4 and argv[0] == "image":
        from .imagegen import tree_image
        print(tree_image(*argv[1:]))
        return 0
    if len(argv) == 2 and argv[0] == "stop":
        pidfile = Path(argv[1]) / "registry.pid"
        try:
            pid = int(pidfile.read_text())
        except (OSError, ValueError):
            return 0
        _stop_pid(pid)
        pidfile.unlink(missing_ok=True)
        return 0
    sys.stderr.write(__doc__)
    return 2


def _port_of(top):
    for line in (top / "config.yml").read_text().splitlines():
        if line.strip().startswith("addr:"):
            return int(line.rsplit(":", 1)[1])
    raise RuntimeError(f"no addr in {top / 'config.yml'}")


def _stop_pid(pid):
    """SIGTERM, then SIGKILL, the registry we started (checked by its
    command name, so a recycled pid is left alone)."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "docker-registry":
                return
    except OSError:
        return
    os.kill(pid, signal.SIGTERM)
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except OSError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(_cli(sys.argv[1:]))
