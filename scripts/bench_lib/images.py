"""The images section of the benchmark (issue 11): pull + unpack from a
loopback registry against skopeo copy + umoci unpack and podman pull, the
second image that shares 4 of 5 layers, run of a cached docker:// image
against run of its tree, 32 concurrent cold runs, and the memory of a pull
of a layer with many entries.  Runs as root; see docs/bench.md."""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import time

from . import imagegen
from .host import unmount_under
from .registry import Registry

TRUE = ["/bin/true"]


def _ms(t0):
    return (time.perf_counter() - t0) * 1000


def _tail(text):
    lines = (text or "").strip().splitlines()
    errs = [l for l in lines if l.startswith("gpusandbox: error")]
    return (errs or lines or ["no output"])[-1][:300]


def _timed(argv, env, cwd="/"):
    """(wall ms, returncode, stderr, ru_maxrss KB) of one command."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    err = p.stderr.read().decode(errors="replace")
    _pid, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return _ms(t0), p.returncode, err, ru.ru_maxrss


def _timed_cpu(argv, env):
    """(wall ms, returncode, stderr, CPU ms): the CPU time (user + system of
    the launcher and the sandbox it waits for) barely moves with the load of
    a shared machine, which the wall time does by tens of ms."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, env=env, cwd="/", stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    err = p.stderr.read().decode(errors="replace")
    _pid, status, ru = os.wait4(p.pid, 0)
    return _ms(t0), os.waitstatus_to_exitcode(status), err, \
        (ru.ru_utime + ru.ru_stime) * 1000


def _human(n):
    return f"{n / (1 << 20):.0f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def _med(xs):
    return round(statistics.median(xs), 3) if xs else None


class ImageBench:
    def __init__(self, tmp, gsbx, env, rootfs, size, entries, reps, runs, log, user=None):
        """user: (uid, gid, env) of the unprivileged user for the rootless
        rows (cold pull, second image, cached run), or None for root only."""
        self.top = os.path.join(tmp, "images")
        os.makedirs(self.top, mode=0o700)
        self.user = user
        if user:
            os.chmod(self.top, 0o711)     # the user reaches its own stores below
        self.gsbx, self.env, self.rootfs = gsbx, dict(env), rootfs
        self.size, self.entries, self.reps, self.runs = size, entries, reps, runs
        self.log = log
        self.reg = None
        self.res = {"image_bytes": size, "entries": entries, "reps": reps}
        self.n_store = 0

    def _dir(self, what, mode="root"):
        self.n_store += 1
        d = os.path.join(self.top, f"{what}-{self.n_store}")
        os.mkdir(d, 0o700)
        if mode == "rootless":
            os.chown(d, self.user[0], self.user[1])
        return d

    def _as(self, mode, argv):
        if mode != "rootless":
            return list(argv)
        uid, gid, _env = self.user
        return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--",
                *argv]

    def _env(self, mode):
        return dict(self.user[2]) if mode == "rootless" else self.env

    def modes(self):
        return ("root", "rootless") if self.user else ("root",)

    def _drop(self, d):
        unmount_under(d, self.log)
        shutil.rmtree(d, ignore_errors=True)

    def ref(self, name):
        return f"docker://{self.reg.host}/bench/{name}:1"

    def gpull(self, store, name, mode="root"):
        return _timed(self._as(mode, [self.gsbx, "pull", "--store", store, "--progress",
                                      "none", self.ref(name)]), self._env(mode))

    # --- the whole section --------------------------------------------------
    def run(self):
        try:
            self._prepare()
            self._pulls()
            for mode in self.modes():
                self._second(mode)
                self._cached_run(mode)
            self._concurrent(32)
            self._entries()
        finally:
            if self.reg:
                self.reg.stop()
        self.res["targets"] = self.targets()
        return self.res

    def _prepare(self):
        regdir = os.path.join(self.top, "registry")
        os.mkdir(regdir)
        self.reg = Registry(regdir)
        self.res["registry_pid"] = self.reg.pid
        t0 = time.perf_counter()
        lay = os.path.join(self.top, "layout")
        self.log(f"images: writing a {_human(self.size)} 5-layer image and a "
                 "second one sharing 4 layers")
        self.info = imagegen.big_images(lay, self.rootfs, self.size)
        gen = _ms(t0)
        t0 = time.perf_counter()
        for tag in ("big", "big2"):
            self.reg.push(lay, tag, f"bench/{tag}", dest_tag="1")
        shutil.rmtree(lay)
        self.res["build"] = {"generate_ms": round(gen), "push_ms": round(_ms(t0)),
                             "files": self.info["files"],
                             "layer_bytes": self.info["layer_bytes"]}

    # --- (a) cold pull + unpack against skopeo + umoci and podman --------------
    def _pulls(self):
        tools = {"gpusandbox": self._one_gsbx, "skopeo+umoci": self._one_umoci}
        if self.user:
            tools["gpusandbox rootless"] = lambda: self._one_gsbx("rootless")
        podman = shutil.which("podman")
        if podman:
            tools["podman"] = self._one_podman
        else:
            self.res["podman"] = "not installed"
        samples = {k: [] for k in tools}
        rss = []
        errors = {}
        for i in range(self.reps):
            self.log(f"images: cold pulls, round {i + 1}/{self.reps}")
            for name, fn in tools.items():
                if name in errors:
                    continue
                ms, err, kb = fn()
                if err:
                    errors[name] = err
                    self.log(f"images: {name}: {err}")
                else:
                    samples[name].append(ms)
                    if kb:
                        rss.append(kb)
        out = {}
        for name in tools:
            out[name] = {"median_ms": _med(samples[name]), "samples_ms":
                         [round(s, 1) for s in samples[name]]}
            if name in errors:
                out[name]["error"] = errors[name]
        g = out["gpusandbox"]["median_ms"]
        out["ratios"] = {n: round(g / v["median_ms"], 2) for n, v in out.items()
                         if n != "gpusandbox" and g and v.get("median_ms")}
        out["gpusandbox_max_rss_mb"] = round(max(rss) / 1024, 1) if rss else None
        self.res["pull"] = out

    def _one_gsbx(self, mode="root"):
        d = self._dir("gsbx", mode)
        try:
            ms, rc, err, kb = self.gpull(os.path.join(d, "store"), "big", mode)
            return ms, (None if rc == 0 else _tail(err)), kb
        finally:
            self._drop(d)

    def _one_umoci(self):
        d = self._dir("umoci")
        try:
            t0 = time.perf_counter()
            p = subprocess.run(["skopeo", "--insecure-policy", "copy", "-q",
                                "--src-tls-verify=false", self.ref("big"),
                                f"oci:{d}/oci:big"], env=self.env, capture_output=True,
                               text=True)
            if p.returncode == 0:
                p = subprocess.run(["umoci", "unpack", "--image", f"{d}/oci:big",
                                    f"{d}/bundle"], env=self.env, capture_output=True,
                                   text=True)
            return _ms(t0), (None if p.returncode == 0 else _tail(p.stderr)), None
        finally:
            self._drop(d)

    def _one_podman(self):
        d = self._dir("podman")
        base = ["podman", "--root", f"{d}/root", "--runroot", f"{d}/run",
                "--storage-driver", "overlay", "--cgroup-manager", "cgroupfs",
                "--events-backend", "file"]
        try:
            ms, rc, err, _ = _timed([*base, "pull", "-q", "--tls-verify=false",
                                     self.ref("big")], self.env)
            return ms, (None if rc == 0 else _tail(err)), None
        finally:
            subprocess.run([*base, "rmi", "-a", "-f"], capture_output=True, env=self.env)
            self._drop(d)

    # --- (b) the second image: only its new layer -----------------------------
    def _second(self, mode="root"):
        key = "second" if mode == "root" else "second_rootless"
        d = self._dir("second", mode)
        store = os.path.join(d, "store")
        self.second_store = getattr(self, "second_store", {})
        self.second_store[mode] = store
        first_ms, rc, err, _ = self.gpull(store, "big", mode)
        if rc:
            self.res[key] = {"error": _tail(err)}
            return
        blobs_before = len(os.listdir(os.path.join(store, "blobs", "sha256")))
        layers_dir = os.path.join(store, "layers")
        layers_before = len(os.listdir(layers_dir)) if os.path.isdir(layers_dir) else 0
        since = self.reg.log_size()
        t0 = time.perf_counter()
        p = subprocess.run(self._as(mode, [self.gsbx, "pull", "--store", store, "--progress",
                                           "json", self.ref("big2")]),
                           env=self._env(mode), cwd="/", capture_output=True, text=True)
        ms = _ms(t0)
        got = self.reg.blob_bytes(since)
        if p.returncode:
            self.res[key] = {"error": _tail(p.stderr)}
            return
        unpacked = 0
        for line in (p.stdout + p.stderr).splitlines():
            try:
                unpacked += json.loads(line).get("event") == "layer"
            except (ValueError, AttributeError):
                pass
        new = self.info["big2"][-1]
        shared = set(self.info["big2"][:-1])
        self.res[key] = {
            "first_ms": round(first_ms, 1),
            "ms": round(ms, 1),
            "blobs_fetched": len(got),
            "bytes_fetched": sum(b for _c, b in got.values()),
            "new_layer_bytes": self.info["layer_bytes"][-1],
            "new_layer_fetched": new in got,
            "shared_layers_fetched": len(shared & set(got)),
            # Layers are unpacked once each into the store (layers/); the
            # second image unpacks its new one and links the merge.
            "layers_applied": unpacked,
            "layer_dirs_added": (len(os.listdir(layers_dir)) if os.path.isdir(layers_dir)
                                 else 0) - layers_before,
            "store_blobs_added": len(os.listdir(os.path.join(store, "blobs", "sha256")))
            - blobs_before}

    # --- (c) run of the cached image against run of its tree ------------------
    def _cached_run(self, mode="root"):
        key = "cached_run" if mode == "root" else "cached_run_rootless"
        store = getattr(self, "second_store", {}).get(mode)
        rootfs = None
        for j in glob.glob(os.path.join(store or "/nonexistent", "images", "*", "image.json")):
            with open(j) as f:
                doc = json.load(f)
            layers = [l if isinstance(l, str) else l.get("digest")
                      for l in doc.get("layers", [])]
            if layers == self.info["big"]:
                rootfs = os.path.join(os.path.dirname(j), "rootfs")
        if rootfs is None:
            self.res[key] = {"error": "the pulled image's rootfs was not found"}
            return
        env = dict(self._env(mode), GPUSANDBOX_STORE=store)
        argvs = {"image": self._as(mode, [self.gsbx, "run", self.ref("big"), *TRUE]),
                 "dir": self._as(mode, [self.gsbx, "run", rootfs, *TRUE])}
        samples = {k: [] for k in argvs}
        cpu = {k: [] for k in argvs}
        n = max(10, self.runs)
        for i in range(n + 2):
            for k, argv in argvs.items():
                ms, rc, err, cms = _timed_cpu(argv, env)
                if rc:
                    self.res[key] = {"error": f"{k}: {_tail(err)}"}
                    return
                if i >= 2:
                    samples[k].append(ms)
                    cpu[k].append(cms)
        im, di = _med(samples["image"]), _med(samples["dir"])
        self.res[key] = {"image_median_ms": im, "dir_median_ms": di,
                         "added_ms": round(im - di, 3), "n": n,
                         "image_cpu_ms": _med(cpu["image"]), "dir_cpu_ms": _med(cpu["dir"]),
                         "added_cpu_ms": round(_med(cpu["image"]) - _med(cpu["dir"]), 3)}

    # --- (d) concurrent cold runs ---------------------------------------------
    def _concurrent(self, n):
        d = self._dir("conc")
        env = dict(self.env, GPUSANDBOX_STORE=os.path.join(d, "store"))
        since = self.reg.log_size()
        t0 = time.perf_counter()
        procs = [subprocess.Popen([self.gsbx, "run", self.ref("big"), *TRUE],
                                  env=env, cwd="/", stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                 for _ in range(n)]
        errs = []
        for p in procs:
            e = p.stderr.read().decode(errors="replace")
            if p.wait():
                errs.append(_tail(e))
        wall = _ms(t0)
        got = self.reg.blob_bytes(since)
        pull = self.res.get("pull", {}).get("gpusandbox", {}).get("median_ms")
        self.res["concurrent"] = {
            "n": n, "wall_ms": round(wall, 1), "failed": len(errs),
            "first_error": errs[0] if errs else None,
            "one_pull_ms": pull, "wall_over_pull": round(wall / pull, 2) if pull else None,
            "blobs": len(got), "max_gets_per_blob": max((c for c, _b in got.values()),
                                                        default=0)}
        self._drop(d)

    # --- (e) memory of a pull of a layer with many entries ---------------------
    def _entries(self):
        lay = os.path.join(self.top, "layout-many")
        t0 = time.perf_counter()
        info = imagegen.entries_image(lay, self.entries)
        gen = _ms(t0)
        self.reg.push(lay, "many", "bench/many", dest_tag="1")
        shutil.rmtree(lay)
        d = self._dir("many")
        ms, rc, err, kb = self.gpull(os.path.join(d, "store"), "many")
        t0 = time.perf_counter()
        self._drop(d)
        self.res["entries_pull"] = {
            "entries": self.entries, "layer_bytes": info["layer_bytes"],
            "generate_ms": round(gen), "pull_ms": round(ms), "remove_ms": round(_ms(t0)),
            "max_rss_mb": round(kb / 1024, 1) if rc == 0 else None,
            "error": None if rc == 0 else _tail(err),
            "pull_peak_rss_mb": round(kb / 1024, 1)}

    # --- targets and the table ------------------------------------------------
    def targets(self):
        from .report import _target
        r = self.res
        pull = r.get("pull", {})
        g = pull.get("gpusandbox", {}).get("median_ms")
        su = pull.get("skopeo+umoci", {}).get("median_ms")
        sec = r.get("second", {})
        cr = r.get("cached_run", {})
        co = r.get("concurrent", {})
        en = r.get("entries_pull", {})
        return [
            _target("pull + unpack <= 1.0x skopeo copy + umoci unpack", g,
                    su if g else None, "ms"),
            _target("second image: shared layers fetched again = 0",
                    sec.get("shared_layers_fetched"), 0, "layers"),
            _target("run docker://REF (cached) adds <= 2 ms over run DIR",
                    cr.get("added_ms"), 2.0, "ms"),
            _target("rootless: run docker://REF (cached) adds <= 2 ms over run DIR",
                    r.get("cached_run_rootless", {}).get("added_ms"), 2.0, "ms"),
            _target("second image: layers unpacked = 1 (the new one)",
                    sec.get("layers_applied"), 1, "layers"),
            _target(f"{co.get('n', 32)} concurrent cold runs: each blob fetched once",
                    co.get("max_gets_per_blob") if not co.get("failed") else None, 1,
                    "GETs"),
            _target(f"pull of a layer with {self.entries} entries: peak RSS < 1 GB",
                    en.get("max_rss_mb"), 1024, "MB", op="<"),
        ]


def print_section(r, write):
    write("")
    b = r.get("build", {})
    write(f"images: a {_human(r['image_bytes'])} 5-layer image "
          f"({b.get('files')} files; written in {b.get('generate_ms', 0) / 1000:.1f} s, "
          f"pushed in {b.get('push_ms', 0) / 1000:.1f} s), loopback docker-registry, "
          f"cold store each time, {r['reps']} rounds interleaved")
    pull = r.get("pull", {})
    g = pull.get("gpusandbox", {}).get("median_ms")
    for name in ("gpusandbox", "gpusandbox rootless", "skopeo+umoci", "podman"):
        v = pull.get(name)
        if v is None:
            continue
        if v.get("median_ms") is None:
            write(f"  {name:<22} failed: {v.get('error')}")
            continue
        ratio = f"{g / v['median_ms']:.2f}x" if g else "-"
        write(f"  {name:<22}{v['median_ms'] / 1000:>9.2f} s   gpusandbox / row {ratio}")
    if pull.get("gpusandbox_max_rss_mb"):
        write(f"  gpusandbox pull peak RSS {pull['gpusandbox_max_rss_mb']} MB")
    for key, label in (("second", "root"), ("second_rootless", "rootless")):
        sec = r.get(key, {})
        if "error" in sec:
            write(f"  second image, {label}: {sec['error']}")
        elif sec:
            write(f"  second image (4 of 5 layers shared), {label}: {sec['ms'] / 1000:.2f} s "
                  f"(the first: {sec['first_ms'] / 1000:.2f} s); {sec['blobs_fetched']} "
                  f"blobs / {sec['bytes_fetched']} bytes fetched (new layer "
                  f"{sec['new_layer_bytes']} bytes), shared layers fetched "
                  f"{sec['shared_layers_fetched']}, layers unpacked {sec['layers_applied']}, "
                  f"layer dirs added {sec['layer_dirs_added']}")
    for key, label in (("cached_run", "root"), ("cached_run_rootless", "rootless")):
        cr = r.get(key, {})
        if "error" in cr:
            write(f"  cached run, {label}: {cr['error']}")
        elif cr:
            write(f"  run docker://REF (cached), {label}: {cr['image_median_ms']:.2f} ms, "
                  f"run DIR {cr['dir_median_ms']:.2f} ms: {cr['added_ms']:+.2f} ms "
                  f"(median of {cr['n']}); CPU {cr['image_cpu_ms']:.1f} against "
                  f"{cr['dir_cpu_ms']:.1f} ms: {cr['added_cpu_ms']:+.2f} ms")
    co = r.get("concurrent", {})
    if co:
        ratio = f", {co['wall_over_pull']:.2f}x one pull" if co.get("wall_over_pull") else ""
        fail = f", {co['failed']} failed ({co['first_error']})" if co["failed"] else ""
        write(f"  {co['n']} concurrent cold runs: {co['wall_ms'] / 1000:.2f} s{ratio}; "
              f"{co['blobs']} blobs, at most {co['max_gets_per_blob']} GET each{fail}")
    en = r.get("entries_pull", {})
    if en:
        what = (f"peak RSS {en['max_rss_mb']} MB" if en.get("max_rss_mb") is not None
                else f"failed ({en['error']}; peak RSS {en['pull_peak_rss_mb']} MB)")
        write(f"  pull of one layer with {en['entries']} entries: {what}, pull "
              f"{en['pull_ms'] / 1000:.1f} s (written in {en['generate_ms'] / 1000:.1f} s, "
              f"removed in {en['remove_ms'] / 1000:.1f} s)")
    write("")
    write("image targets (issue 11):")
    for t in r.get("targets", []):
        if t["status"] == "n/a":
            write(f"  n/a   {t['target']} (not measured)")
        else:
            write(f"  {t['status']:<5} {t['target']}: {t['value']} {t['unit']}"
                  f" (limit {t['limit']} {t['unit']})")


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().rstrip("IB")
    try:
        if t and t[-1] in mult:
            return int(float(t[:-1]) * mult[t[-1]])
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None


def uptime():
    with open("/proc/loadavg") as f:
        return "load average " + ", ".join(f.read().split()[:3])
