"""doctor, the launcher's own prerequisites."""
import os

from gpusandbox.linux import sys as lsys

from .common import FAIL, HELPER_PATH, PASS, WARN, Check, _read


def check_userns(roots, euid):
    """Unprivileged user namespaces: the three switches distributions use."""
    needed = euid != 0
    sev = FAIL if needed else WARN
    who = "rootless launches" if needed else "rootless launches (other users)"
    clone = _read(f"{roots.proc}/sys/kernel/unprivileged_userns_clone")
    if clone == "0":
        return Check("launcher", "user namespaces", sev,
                     f"kernel.unprivileged_userns_clone = 0: {who} cannot create a user namespace",
                     "sysctl -w kernel.unprivileged_userns_clone=1 (persist it in /etc/sysctl.d)")
    limit = _read(f"{roots.proc}/sys/user/max_user_namespaces")
    if limit == "0":
        return Check("launcher", "user namespaces", sev,
                     f"user.max_user_namespaces = 0: {who} cannot create a user namespace",
                     "sysctl -w user.max_user_namespaces=15000 (persist it in /etc/sysctl.d)")
    aa = _read(f"{roots.proc}/sys/kernel/apparmor_restrict_unprivileged_userns")
    if aa == "1":
        return Check("launcher", "user namespaces", sev,
                     "kernel.apparmor_restrict_unprivileged_userns = 1: AppArmor strips the "
                     f"capabilities of user namespaces that {who} create",
                     "grant 'userns,' to the Python running gpusandbox in an AppArmor profile, "
                     "or sysctl -w kernel.apparmor_restrict_unprivileged_userns=0")
    detail = "allowed" + (f" (max {limit})" if limit else "")
    return Check("launcher", "user namespaces", PASS, detail)


def _id_helper_ok(path):
    # newuidmap writes maps for other ids only with privilege: setuid root
    # or file capabilities (cap_setuid / cap_setgid).
    try:
        st = os.stat(path)
    except OSError:
        return False
    if st.st_uid == 0 and st.st_mode & 0o4000:
        return True
    try:
        return bool(os.getxattr(path, "security.capability"))
    except OSError:
        return False


def check_subids(roots, user, uid, path_env=HELPER_PATH, helpers=True):
    """--userns subids: the caller's ranges and, unless root (which writes
    the maps itself), the setuid helpers that apply them."""
    from gpusandbox.linux import idmap
    out = []
    hint = idmap.SUBID_HINT
    for kind in ("subuid", "subgid"):
        rng = idmap.subid_range(user, uid, f"{roots.etc}/{kind}")
        if rng is None:
            out.append(Check("launcher", f"/etc/{kind}", FAIL,
                             f"no range for user {user} (uid {uid})", hint))
            hint = "see /etc/subuid above"
        else:
            out.append(Check("launcher", f"/etc/{kind}", PASS,
                             f"{user}: {rng[1]} ids from {rng[0]}"))
    for tool in ("newuidmap", "newgidmap") if helpers else ():
        found = next((os.path.join(d, tool) for d in path_env.split(":")
                      if d and os.path.exists(os.path.join(d, tool))), None)
        if found is None:
            out.append(Check("launcher", tool, FAIL, f"not found in {path_env}",
                             "install the uidmap package (shadow-utils)"))
        elif not _id_helper_ok(found):
            out.append(Check("launcher", tool, FAIL, f"{found} is neither setuid root nor has "
                             "file capabilities", f"chmod u+s {found} (or setcap cap_setuid/cap_setgid)"))
        else:
            out.append(Check("launcher", tool, PASS, found))
    return out


def check_cgroups(roots, euid):
    try:
        from gpusandbox.linux import cgroup
        st = cgroup.status(proc=roots.proc)
    except ImportError as e:
        return [Check("launcher", "cgroup", WARN, f"cgroup layer unavailable: {e}",
                      "reinstall gpusandbox")]
    root = euid == 0
    out = []
    if st["cgroup2"]:
        kind = "hybrid: v1 controllers elsewhere" if st["hybrid"] else "unified"
        out.append(Check("launcher", "cgroup v2", PASS, f"{st['cgroup2']} ({kind})"))
        pdir = st["leaf_parent"] or st["cgroup2"]
        if st["delegated"]:
            out.append(Check("launcher", "cgroup delegation", PASS, f"{pdir} is writable"))
        else:
            out.append(Check("launcher", "cgroup delegation", FAIL if root else WARN,
                             f"{pdir} is not writable: " + ("no cgroup for the device filter"
                                                            if root else "resource limits unavailable"),
                             "run inside a delegated cgroup (systemd-run --user --scope -p "
                             "Delegate=yes) or pass --cgroup-parent naming one"))
    else:
        v1dev = st.get("v1_devices")
        out.append(Check("launcher", "cgroup v2", WARN if (not root or v1dev) else FAIL,
                         "no cgroup2 mount" + (f" (v1 devices controller at {v1dev})" if v1dev else ""),
                         "boot with systemd.unified_cgroup_hierarchy=1, or mount cgroup2"))
    have = set(st["controllers"]) | (set(st["controllers_v1"]) if root else set())
    missing = [c for c in ("memory", "pids", "cpu") if c not in have]
    if missing:
        out.append(Check("launcher", "cgroup controllers", WARN,
                         f"{', '.join(missing)} not available: --memory/--pids-limit/--cpus "
                         "cannot be enforced", "delegate the controllers (systemd Delegate=yes) "
                         "or boot a unified cgroup v2 hierarchy"))
    else:
        out.append(Check("launcher", "cgroup controllers", PASS, "memory, pids, cpu"))
    if not root:
        out.append(Check("launcher", "BPF device filter", PASS,
                         "not used rootless: the sandbox's /dev holds only the selected nodes"))
    elif st["bpf_filter"]:
        out.append(Check("launcher", "BPF device filter", PASS,
                         f"a cgroup device program loads ({_bpf_caps()})"))
    else:
        out.append(Check("launcher", "BPF device filter", WARN if st.get("v1_devices") else FAIL,
                         st["bpf_why"] or "unavailable",
                         "a kernel with CONFIG_CGROUP_BPF and a cgroup2 mount"))
    return out


def _bpf_caps():
    """Which of the launcher's effective capabilities allow loading the
    program (python-prctl reads them; doctor is off the launch path)."""
    import prctl
    eff = prctl.cap_effective
    held = [n for n, have in (("CAP_SYS_ADMIN", eff.sys_admin), ("CAP_BPF", eff.bpf),
                              ("CAP_NET_ADMIN", eff.net_admin)) if have]
    return "effective: " + (", ".join(held) if held else "none of CAP_SYS_ADMIN, CAP_BPF")


def _rmtree(base):
    import shutil
    # overlayfs creates work/work with mode 000 (fs/overlayfs/super.c);
    # its owner (the caller) opens it up so that it can be removed.
    try:
        os.chmod(os.path.join(base, "work", "work"), 0o700)
    except OSError:
        pass
    shutil.rmtree(base, ignore_errors=True)


def probe_overlay():
    """Mount an overlay in a fresh user+mount namespace in a forked child.

    The mount is made with fsmount(2) and never attached, so it vanishes with
    the child; the child writes through it to prove the upper layer works."""
    import tempfile
    from gpusandbox.errors import SandboxError
    from gpusandbox.linux import idmap, mounts
    base = tempfile.mkdtemp(prefix="gpusandbox-doctor-")
    try:
        for d in ("lower", "upper", "work"):
            os.mkdir(os.path.join(base, d))
        r, w = os.pipe()
        uid, gid = os.geteuid(), os.getegid()
        pid = os.fork()
        if pid == 0:  # child: report the failure on the pipe, exit without cleanup
            code = 0
            try:
                os.close(r)
                lsys.unshare(lsys.CLONE_NEWUSER | lsys.CLONE_NEWNS)
                idmap.write_single("self", 0, uid, 0, gid, False)
                mfd = mounts.new_fs("overlay", [f"lowerdir={base}/lower", f"upperdir={base}/upper",
                                                f"workdir={base}/work"])
                fd = os.open("probe", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=mfd)
                os.write(fd, b"ok")
                os.close(fd)
                os.close(mfd)
            except BaseException as e:  # noqa: BLE001 - the child must always _exit
                os.write(w, (e.line() if isinstance(e, SandboxError) else str(e)).encode()[:500])
                code = 1
            os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            msg = f.read().decode("utf-8", "replace")
        _, status = os.waitpid(pid, 0)
        ok = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 \
            and os.path.exists(os.path.join(base, "upper", "probe"))
        return ok, msg or f"child status {status}"
    finally:
        _rmtree(base)


def check_overlay(euid):
    ok, why = probe_overlay()
    if ok:
        return Check("launcher", "overlayfs in user namespace", PASS,
                     "mounted and wrote through an overlay")
    who = "rootless launches" if euid == 0 else "this user"
    return Check("launcher", "overlayfs in user namespace", WARN,
                 f"probe failed: {why}: --writable-tmpfs is unavailable to {who}",
                 "Linux >= 5.11 mounts overlayfs in user namespaces")
