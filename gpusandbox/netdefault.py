"""The default network namespace of a launch (plan._identity calls it once
the command's host uid is known): the host's only when that uid is one the
caller chose."""


def host_net_risk(plan, spec, real_root):
    """Why the host's network namespace is no default for this command (a
    host uid the caller did not choose as its own), or None.

    Host daemons on abstract unix sockets (D-Bus session buses, X11, the
    containerd shim) live in the network namespace, not the filesystem, so no
    mount hides them, and they trust the peer uid SO_PEERCRED reports.
    uid 0 there is root to every such daemon (containerd-shim,
    CVE-2020-15257; a user namespace of a root caller maps uid 0 inside to
    uid 0 outside).  Under root, an image's User picks the host uid too: an
    image saying `User: 1006` would be uid 1006 to that user's session
    daemons, though neither the caller nor uid 1006 chose it.  The caller's
    own uid (rootless: daemons already see the caller) and a uid the caller
    names with --user are the caller's decision, so those keep the host's."""
    if real_root and plan.cmd_uid == 0:
        return "the command is uid 0 on the host"
    if real_root and spec.user_by_image:
        return (f"the command's host uid {plan.cmd_uid} is the image's User, not a uid "
                "you chose with --user")
    return None


_NET_WARNING = "cannot reach each other over TCP"


def resolve(plan, spec, risk, host_env):
    """Resolve the default network namespace into spec.net: a private one
    (loopback up) when `risk` says why the host's is not safe to default to,
    else the host's.  This holds inside Slurm steps too: ranks that get a
    private one and talk TCP need --net host, which a multi-task step is
    told.  A .sqsh file's User plans the identity a second time: what the
    first pass said about the network is replaced."""
    plan.notes[:] = [n for n in plan.notes if not n.startswith("network: ")]
    plan.warnings[:] = [w for w in plan.warnings if _NET_WARNING not in w]
    if spec.net is None:
        spec.net = "none" if risk else "host"
        if risk:
            plan.notes.append(f"network: private namespace, loopback only ({risk}; "
                              "--net host shares the host's)")
            tasks = host_env.get("SLURM_STEP_NUM_TASKS") or host_env.get("SLURM_NTASKS") or ""
            if host_env.get("SLURM_STEP_ID") and tasks.isdigit() and int(tasks) > 1:
                plan.warnings.append(
                    f"note: the command runs as uid {plan.cmd_uid} in a private network "
                    f"namespace, so the {tasks} tasks of this Slurm step {_NET_WARNING}; "
                    "pass --net host if they must")
    elif spec.net == "host" and risk:
        if plan.cmd_uid == 0:
            plan.notes.append("network: the host's (--net host): the command is uid 0 to host "
                              "services on abstract unix sockets; CAP_NET_RAW and "
                              "CAP_NET_BIND_SERVICE dropped")
        else:
            plan.notes.append(f"network: the host's (--net host): the command is uid "
                              f"{plan.cmd_uid} (the image's User) to host services on "
                              "abstract unix sockets")
