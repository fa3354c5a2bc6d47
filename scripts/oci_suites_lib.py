"""scripts/oci-suites' reading of the suites' TAP output, its counts, and the
clean-up of what their cases leave on the host (kept apart from the runner
to keep each file small)."""
import os
import re

# Classes for a case that did not pass, first match wins; the text matched is
# the case's name and reason together. A heuristic: docs/oci-suites.md lists the
# cases themselves.
CLASSES = (
    ("runtime-cli", r"flag provided but not defined|unknown option|unrecognized option|unknown flag"
                    r"|invalid argument.*--"),
    ("cgroup-controller-absent",
     r"subsystem \w+ not found|(memory|cpu|cpuset|pids|hugetlb|blkio|io|rdma|net_cls|net_prio) cgroup "
     r"not available|controller.*(not available|absent|missing|not enabled)"),
    # runtime-tools reads a container's cgroup through the v1 hierarchies
    # wherever /sys/fs/cgroup is not cgroup2 alone (a hybrid host)
    ("cgroup-v1-needed", r"linux_cgroups_|delete_resources|not mounted as expected"
                         r"|relative to the cgroups mount point|/sys/fs/cgroup/(devices|memory|cpu|blkio|pids)/"),
    ("cgroup-v2-needed", r"cgroup ?v2|unified|cgroup2|cgroupfs-style"),
    ("cgroup-other", r"\bcgroups?\b(?!-)"),
    ("systemd", r"systemd"),
    ("root-needed", r"requires root|root privileges|rootless|not allowed as non-root"),
    ("nested-namespaces", r"nested namespaces|namespace not available|user namespace"),
    ("kernel-feature", r"SCHED_DEADLINE|I/O priority|idmapped|eBPF|sysctl|/dev/fuse|mempolicy|time namespace"),
    ("criu", r"criu|checkpoint"),
    ("tty", r"TTY|terminal"),
    ("timeout", r"timed out"),
)


def classify(file, name, reason):
    text = f"{file} {name} {reason}"
    for cls, pat in CLASSES:
        if re.search(pat, text, re.I):
            return cls
    return "other"


TAP = re.compile(r"^(not )?ok\s+(\d+)\s*(?:-\s*)?(.*)$")
TIME = re.compile(r"\s*#\s*[\d.]+s\s*$")
DIRECTIVE = re.compile(r"^(.*?)\s*#\s*(SKIP|TODO)\b\s*(.*)$", re.I)


def parse_tap(out, fname, timed_out, rc, diag_after=False):
    """TAP lines into cases: for each, status and the reason (the skip
    directive, or the diagnostics printed around a failure: before it in
    crun's suite, after it in runtime-tools', which also puts a YAML block
    right after a failed line)."""
    cases, pending, lines = [], [], out.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = TAP.match(line)
        if line.strip() == "---":
            # a YAML block that follows no result: an error before any case ran
            while i + 1 < len(lines) and lines[i + 1].strip() != "...":
                i += 1
                pending.append(lines[i].strip())
            i += 2
            continue
        if not m:
            # crun's runner logs "Test 'X' failed" and the environment after X's own result line
            if line.strip() and not line.startswith(("TAP version", "1..")) \
                    and not re.match(r"# (Test '[^']*' failed with return code|Test environment:)", line):
                pending.append(line.strip())
            i += 1
            continue
        notok, desc = m.group(1), TIME.sub("", m.group(3))
        status, reason = ("failed" if notok else "passed"), ""
        d = DIRECTIVE.match(desc)
        if d:
            desc = d.group(1)
            if d.group(2).upper() == "SKIP":
                status, reason = "skipped", d.group(3).strip()
        # runtime-tools puts a failure's details in an indented YAML block after it
        yaml = []
        if i + 1 < len(lines) and lines[i + 1].strip() == "---":
            i += 2
            while i < len(lines) and lines[i].strip() != "...":
                yaml.append(lines[i].strip())
                i += 1
        after = []
        if diag_after:
            j = i + 1
            while j < len(lines) and lines[j].startswith("#"):
                after.append(lines[j].lstrip("# ").strip())
                j += 1
            i = j - 1
        if status == "failed" and diag_after:
            reason = " | ".join(yaml + after) or "no diagnostics"
        elif status == "failed":
            # the runtime's own words (lines the suite did not prefix) come first
            raw = [p for p in pending if not p.startswith("#")][-2:]
            said = [p.lstrip("# ") for p in pending if p.startswith("#")]
            diag = yaml or raw + ([p for p in said if re.search(
                r"level=error|Output:|error:|Error:|Exception message|failed|expected", p)][-3:]
                or said[-2:])
            reason = " | ".join(diag[:5]) or "no diagnostics"
        cases.append({"file": fname, "name": desc.strip() or f"#{m.group(2)}", "status": status,
                      "reason": reason[:600]})
        pending = []
        i += 1
    plan = re.search(r"^1\.\.(\d+)(.*)$", out, re.M)
    if plan and plan.group(1) == "0" and not cases:
        why = plan.group(2).lstrip(" #")
        if re.match(r"skip", why, re.I) or not pending:
            cases.append({"file": fname, "name": "(whole file)", "status": "skipped",
                          "reason": re.sub(r"^skip\S*\s*", "", why, flags=re.I).strip()})
        else:
            cases.append({"file": fname, "name": "(whole file)", "status": "failed",
                          "reason": " | ".join(pending[-4:])[:600]})
    elif timed_out:
        cases.append({"file": fname, "name": "(rest of file)", "status": "failed",
                      "reason": "timed out; last output: " + " | ".join(pending[-3:])})
    elif not cases and rc == 0:
        # runtime-tools' negative checks (*_fail) print nothing when the
        # runtime refused the config as it must; anywhere else an empty
        # stream means the runtimetest report never came out of the container
        if re.search(r"_fail(\.t)?$", fname):
            cases.append({"file": fname, "name": "(whole file)", "status": "passed", "reason": ""})
        else:
            cases.append({"file": fname, "name": "(whole file)", "status": "failed",
                          "reason": "no TAP output, exit status 0: " + " | ".join(pending[-3:])})
    elif rc not in (0, None) and not any(c["status"] == "failed" for c in cases):
        cases.append({"file": fname, "name": "(file exit status)", "status": "failed",
                      "reason": f"exit status {rc}: " + " | ".join(pending[-3:])})
    for c in cases:
        if c["status"] != "passed":
            c["class"] = classify(c["file"], c["name"], c["reason"])
    return cases


def summarize(cases):
    s = {k: sum(1 for c in cases if c["status"] == k) for k in ("passed", "failed", "skipped")}
    s["files"] = len({c["file"] for c in cases})
    # per file too: runtime-tools' files differ wildly in how many lines they print
    by = {}
    for c in cases:
        by.setdefault(c["file"], set()).add(c["status"])
    s["files_failed"] = sum(1 for v in by.values() if "failed" in v)
    s["files_passed"] = sum(1 for v in by.values() if v == {"passed"} or v == {"passed", "skipped"})
    s["files_skipped"] = sum(1 for v in by.values() if v == {"skipped"})
    s["classes"] = {}
    for c in cases:
        if c["status"] != "passed":
            key = f"{c['status']}:{c['class']}"
            s["classes"][key] = s["classes"].get(key, 0) + 1
    return s


def reap(work):
    """SIGKILL what the suites left running under `work`: containers a case
    left behind (the suite removes their state directories, so the runtime
    can no longer delete them), found by their root, cwd or command line,
    and those processes' descendants."""
    import signal
    hits, children = set(), {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(pid))
            links = [os.readlink(f"/proc/{pid}/{k}") for k in ("root", "cwd")]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                links.append(f.read().decode(errors="replace"))
        except (OSError, IndexError, ValueError):
            continue
        if int(pid) != os.getpid() and any(work in x for x in links):
            hits.add(int(pid))
    todo = list(hits)
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in hits:
                hits.add(c)
                todo.append(c)
    for pid in hits:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    # crun's test_delete freezes its container in the v1 freezer cgroup
    # /frozen on a host with v1 controllers; a frozen task takes SIGKILL only
    # once thawed
    for pid in hits:
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                fr = [ln.split(":", 2)[2].strip() for ln in f if ":freezer:" in ln]
            if fr and fr[0] != "/":
                state = f"/sys/fs/cgroup/freezer{fr[0]}/freezer.state"
                with open(state) as f:
                    frozen = f.read().strip() != "THAWED"
                if frozen:
                    with open(state, "w") as f:
                        f.write("THAWED")
        except (OSError, IndexError):
            pass
    return len(hits)


def mounts_under(work):
    with open("/proc/self/mountinfo") as f:
        points = [ln.split()[4].replace("\\040", " ") for ln in f]
    return [m for m in points if m == work or m.startswith(work + "/")]


def unmount_under(work):
    """Mounts a case propagated back out of its container (runtime-tools'
    linux_rootfs_propagation asks for shared propagation: the container's
    /proc, /sys and /dev appear under the bundle on the host) come off,
    deepest first, before anything under `work` is deleted."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for m in sorted(mounts_under(work), key=len, reverse=True):
        libc.umount2(m.encode(), 2)  # MNT_DETACH
    return not mounts_under(work)
