"""The table on stdout, the targets, and the summary of a profile."""
import re

REF = "gsbx-rootless-gpu"
PEER_FAMILIES = ("bwrap", "crun", "runc", "podman", "floor")


def ratios(launchers):
    """{gpusandbox variant: {peer row: variant median / peer median}}, peers
    of the same mode only (rootless against rootless, root against root)."""
    ok = {l.name: l for l in launchers if l.status == "ok" and l.samples}
    out = {}
    for g in (l for l in ok.values() if l.family == "gsbx"):
        row = {}
        for p in ok.values():
            if p.family in PEER_FAMILIES and p.mode == g.mode:
                row[p.name] = round(g.stats["median_ms"] / p.stats["median_ms"], 2)
        out[g.name] = row
    return out


def _fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def table(launchers, write):
    ref = next((l for l in launchers if l.name == REF and l.status == "ok"), None)
    write(f"{'launcher':<22}{'median':>9}{'min':>9}{'max':>9}{'cpu':>9}{'n':>5}"
          f"  {REF + ' / row':>24}")
    write(f"{'':<22}{'ms':>9}{'ms':>9}{'ms':>9}{'ms':>9}")
    for l in launchers:
        if l.status != "ok":
            write(f"{l.name:<22}  {l.status}: {l.reason}")
            continue
        s = l.stats
        ratio = "-"
        if ref is not None:
            ratio = f"{ref.stats['median_ms'] / s['median_ms']:.2f}x"
        write(f"{l.name:<22}{s['median_ms']:>9.2f}{s['min_ms']:>9.2f}{s['max_ms']:>9.2f}"
              f"{_fmt(s.get('cpu_median_ms'), '.2f'):>9}{s['n']:>5}  {ratio:>24}")


def legend(write):
    write("cpu: median user+system time of the launcher and the processes it reaped itself"
          " (wait4); podman's conmon is not among them.")


def ratio_matrix(rat, write):
    fams = {p.split("-")[0] for row in rat.values() for p in row}
    peers = [f for f in PEER_FAMILIES if f in fams]
    if not rat or not peers:
        return
    write("")
    write("gpusandbox variant median / peer median, same mode (1.00x = as fast):")
    write(f"{'':<22}" + "".join(f"{p:>9}" for p in peers))
    for g, row in rat.items():
        mode = g.split("-")[1]
        cells = [row.get(f"{p}-{mode}") for p in peers]
        write(f"{g:<22}" + "".join(f"{_fmt(c, '.2f') + ('x' if c else ''):>9}" for c in cells))


def _target(name, value, limit, unit, op="<="):
    if value is None or limit is None:
        return {"target": name, "value": value, "limit": limit, "unit": unit,
                "status": "n/a"}
    ok = value <= limit if op == "<=" else value < limit
    return {"target": name, "value": round(value, 3), "limit": round(limit, 3),
            "unit": unit, "status": "PASS" if ok else "MISS"}


def targets(launchers, conc, disco, mem):
    by = {l.name: l for l in launchers if l.status == "ok" and l.samples}
    ref = by.get(REF)
    crun = by.get("crun-rootless")
    bw = by.get("bwrap-rootless")
    out = [
        _target("rootless --gpus 0,1 median <= 1.0x crun rootless",
                ref.stats["median_ms"] if ref else None,
                crun.stats["median_ms"] * 1.0 if (ref and crun) else None, "ms"),
        _target("rootless --gpus 0,1 median <= 2.5x bwrap rootless (same binds)",
                ref.stats["median_ms"] if ref else None,
                bw.stats["median_ms"] * 2.5 if (ref and bw) else None, "ms"),
    ]
    g = conc.get(REF) if conc else None
    b = conc.get("bwrap-rootless") if conc else None
    out.append(_target(f"{conc.get('n', '?') if conc else '?'} concurrent launches: "
                       "total wall <= 2x bwrap's",
                       g["median_ms"] if g else None,
                       b["median_ms"] * 2 if (g and b) else None, "ms"))
    out.append(_target("GPU discovery (ld.so.cache ~2000 entries) < 5 ms",
                       disco.get("median_ms") if disco else None, 5.0, "ms", op="<"))
    worst = None
    for v in (mem or {}).values():
        if isinstance(v, dict) and "rss_mb" in v:
            worst = max(worst or 0, v["rss_mb"])
    out.append(_target("memory of gpusandbox's processes during a run <= 25 MB (RSS sum)",
                       worst, 25.0, "MB"))
    return out


def print_targets(tgts, write):
    write("")
    write("targets (issue 8):")
    for t in tgts:
        if t["status"] == "n/a":
            write(f"  n/a   {t['target']} (not measured)")
        else:
            write(f"  {t['status']:<5} {t['target']}: {t['value']} {t['unit']}"
                  f" (limit {t['limit']} {t['unit']})")


_IMPORT_LINE = re.compile(r"import time:\s+(\d+)\s+\|\s+(\d+)\s+\|(\s*)(\S+)")

# Issue 24's targets for the lean launch path.
LEAN_IMPORTS = 35          # modules a launch imports beyond the interpreter's start-up
LEAN_OWN_WORK = 2.0        # x bwrap's median: gpusandbox's median minus python -I -S's


def import_names(text):
    """The module names of `python -X importtime` output, in order, each as
    often as it was imported (the launcher and its forked init both write)."""
    return [m.group(4) for m in map(_IMPORT_LINE.match, text.splitlines()) if m]


def importtime(text, top=15, startup=None):
    """Summarise `python -X importtime` output: total, the costliest modules
    by own time, and the top-level imports by cumulative time; with
    `startup` (the names `-c pass` imports with the same interpreter), the
    modules beyond the interpreter's own start-up, issue 24's count."""
    rows = []
    for line in text.splitlines():
        m = _IMPORT_LINE.match(line)
        if m:
            depth = (len(m.group(3)) - 1) // 2
            rows.append((m.group(4), int(m.group(1)), int(m.group(2)), depth))
    total = sum(r[1] for r in rows)
    by_self = sorted(rows, key=lambda r: -r[1])[:top]
    top_level = sorted((r for r in rows if r[3] == 0), key=lambda r: -r[2])[:top]
    return {
        "modules": len(rows),
        "total_ms": round(total / 1000, 2),
        "top_self_ms": [[r[0], round(r[1] / 1000, 2)] for r in by_self],
        "top_level_cumulative_ms": [[r[0], round(r[2] / 1000, 2)] for r in top_level],
        "gpusandbox_modules": sorted(r[0] for r in rows if r[0].startswith("gpusandbox")),
        **({} if startup is None else {"beyond_startup": [
            r[0] for r in rows if r[0] not in frozenset(startup)]}),
    }


def lean_targets(launchers, prof):
    """Issue 24's targets: gpusandbox's own work above the interpreter
    against bwrap's whole launch, and the launch's imports (the 50 launches
    at once are issue 8's target above)."""
    by = {l.name: l for l in launchers if l.status == "ok" and l.samples}
    ref, py, bw = by.get(REF), by.get("python-startup-IS"), by.get("bwrap-rootless")
    own = ref.stats["median_ms"] - py.stats["median_ms"] if (ref and py) else None
    it = (prof or {}).get("importtime") or {}
    beyond = it.get("beyond_startup")
    return [
        _target(f"rootless --gpus 0,1: its median minus python-startup-IS's <= "
                f"{LEAN_OWN_WORK:g}x bwrap rootless", own,
                bw.stats["median_ms"] * LEAN_OWN_WORK if (own is not None and bw) else None,
                "ms"),
        _target(f"launch imports beyond the interpreter's start-up <= {LEAN_IMPORTS}",
                None if beyond is None else len(beyond), LEAN_IMPORTS, "modules"),
    ]


def print_launch(res, rows, conc, mem, disco, runs, warmup, w):
    """The launch section on `w` (print): the table, ratios, bursts, memory,
    discovery, the launcher's imports and the targets."""
    m = res["machine"]
    w(f"gpusandbox launch benchmark: {m['cpu']} x{m['cpus']}, {m['mem_gb']} GB, "
      f"{m['distro']}, kernel {m['kernel']}, cgroups {m['cgroups']}")
    w(f"/bin/true, {runs} runs each after {warmup} warm-up, interleaved; "
      f"{res['binds']['count']} bind mounts ({res['binds']['from']})")
    w("")
    table(rows, w)
    legend(w)
    ratio_matrix(res["ratios"], w)
    if "n" in conc:
        w("")
        w(f"{conc['n']} launches at once (total wall, median of rounds):")
        for name, v in conc.items():
            if isinstance(v, dict):
                fail = f", {v['failed']} failed" if v["failed"] else ""
                w(f"  {name:<22}{v['median_ms']:>9.1f} ms{fail}")
    if mem:
        w("")
        w("memory of gpusandbox's processes while `sleep 3` runs (launcher + init):")
        for mode, v in mem.items():
            if "error" in v:
                w(f"  {mode:<9} {v['error']}")
            else:
                procs = ", ".join(f"{p['comm']} {p['rss_kb'] / 1024:.1f}"
                                  for p in v["processes"])
                w(f"  {mode:<9} RSS {v['rss_mb']:.1f} MB, PSS {v['pss_mb']:.1f} MB ({procs})")
    if disco:
        w("")
        if "error" in disco:
            w(f"GPU discovery: {disco['error']}")
        else:
            w(f"GPU discovery on ld.so.cache of {disco['ldcache_entries']} entries: "
              f"median {disco['median_ms']:.2f} ms (min {disco['min_ms']:.2f}, "
              f"first call {disco['first_call_ms']:.2f}, import {disco['import_ms']:.2f})")
    prof = res.get("profile")
    if prof and prof.get("importtime"):
        it = prof["importtime"]
        w("")
        w(f"launcher imports (-X importtime, fastest of 5): {it['modules']} modules, "
          f"{it['total_ms']} ms" + ("" if "beyond_startup" not in it else
                                    f"; {len(it['beyond_startup'])} beyond the "
                                    "interpreter's start-up"))
        w("  top-level, cumulative ms: " + ", ".join(
            f"{n} {t}" for n, t in it["top_level_cumulative_ms"][:6]))
        w("  by own time, ms: " + ", ".join(f"{n} {t}" for n, t in it["top_self_ms"][:6]))
    print_targets(res["targets"], w)
    if res.get("lean_targets"):
        w("")
        w("targets (issue 24, the lean launch path):")
        for t in res["lean_targets"]:
            w(f"  {t['status']:<5} {t['target']}" + ("" if t["status"] == "n/a" else
              f": {t['value']} {t['unit']} (limit {t['limit']} {t['unit']})"))
    if res.get("oci_targets"):
        w("")
        w("targets (issue 12, container-stack interfaces):")
        for t in res["oci_targets"]:
            w(f"  {t['status']:<5} {t['target']}" + ("" if t["status"] == "n/a" else
              f": {t['value']} {t['unit']} (limit {t['limit']} {t['unit']})"))
