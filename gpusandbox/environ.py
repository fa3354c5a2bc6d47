"""The sandbox's environment, built from one precedence table (README.md,
"Environment"), later rows winning:

  1. defaults        PATH, HOME (the image's passwd entry for the uid), TERM with --tty
                     (`run` only: an OCI config gets none, as runc gives it)
  2. host            job variables (SLURM_* PMI* PMIX_* OMPI_* UCX_* NCCL_*), or the
                     whole host environment with --env-host; never NEVER_PASS (nor,
                     with --profile untrusted, profile.HOST_SOCKET_VARS)
  3. image           OCI config.json process.env, else the image's /etc/environment
  4. GPU             NVIDIA_VISIBLE_DEVICES, NVIDIA_DRIVER_CAPABILITIES, CUDA_VISIBLE_DEVICES
  5. --env-file      in the order given
  6. -e              in the order given (KEY alone copies the host's value)

Nothing here runs on behalf of the image: the image's variables are data
placed in the command's environment, never in the launcher's own (an image
LD_PRELOAD reaching a host-side helper was CVE-2025-23266).
"""
from .errors import UsageError

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# FI_: libfabric (FI_PROVIDER, FI_CXI_*); SLINGSHOT_: the VNI and CXI services Slurm's
# switch/hpe_slingshot plugin gives the step, which libfabric's cxi provider reads.
JOB_PREFIXES = ("SLURM_", "PMI", "PMIX_", "OMPI_", "UCX_", "NCCL_", "FI_", "SLINGSHOT_")
# Host values that would change how code inside loads; they pass only with -e.
NEVER_PASS = frozenset(("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "PYTHONPATH",
                        "PYTHONHOME", "PYTHONSTARTUP", "CUDA_VISIBLE_DEVICES",
                        "NVIDIA_VISIBLE_DEVICES"))


def parse_env_lines(text, origin):
    """KEY=VALUE lines (/etc/environment, --env-file); '#' comments, blank
    lines and an optional 'export ' prefix; matching quotes are removed."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[7:].lstrip()
        key, eq, val = line.partition("=")
        key = key.strip()
        if not eq or not key or not all(c.isalnum() or c == "_" for c in key):
            raise UsageError(f"{origin}:{n}: invalid line {line[:60]!r}",
                             "expected KEY=VALUE", "fix or remove that line")
        if "\0" in val:   # execve cannot carry it
            raise UsageError(f"{origin}:{n}: invalid line {line[:60]!r}",
                             "the value holds a NUL character", "fix or remove that line")
        if len(val) >= 2 and val[0] == val[-1] and val[0] in "\"'":
            val = val[1:-1]
        out.append((key, val))
    return out


def passwd_home(passwd_text, uid):
    if passwd_text:
        for line in passwd_text.splitlines():
            f = line.split(":")
            if len(f) >= 7 and f[2] == str(uid) and f[5].startswith("/") and "\0" not in f[5]:
                return f[5]
    return "/"


def user_rows(spec, host_env):
    """Rows 5 and 6 of the table (--env-file, then -e), in order, as
    [(key, value)]: the caller's word on the sandbox's environment, which also
    counts for the image requirement check (NVIDIA_DISABLE_REQUIRE and
    NVIDIA_REQUIRE_* given with -e or --env-file)."""
    rows = []
    for path in spec.env_files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            raise UsageError(f"cannot read --env-file {path}", e.strerror,
                             "give a readable file of KEY=VALUE lines") from None
        rows += parse_env_lines(text, path)
    for item in spec.env_set:
        key, eq, val = item.partition("=")
        if eq:
            rows.append((key, val))
        elif key in host_env:
            rows.append((key, host_env[key]))
    return rows


def build(spec, host_env, image_env, gpu_env, home, tty_term=None, user=None, defaults=True):
    """defaults: row 1 (docker's rule, `run`); an OCI config's process.env
    gets none (runc's rule: HOME alone, when missing, is the command
    stage's, from the container's passwd)."""
    env = {"PATH": DEFAULT_PATH, "HOME": home} if defaults else {}
    if tty_term:
        env["TERM"] = tty_term
    never = NEVER_PASS
    if spec.profile == "untrusted":
        from .profile import HOST_SOCKET_VARS
        never = never | HOST_SOCKET_VARS
    for key, val in host_env.items():
        if key in never:
            continue
        if spec.env_host or key.startswith(JOB_PREFIXES):
            if spec.env_host and key in ("PATH", "HOME"):
                continue
            env[key] = val
    for key, val in image_env:
        env[key] = val
    env.update(gpu_env)
    for key, val in (user_rows(spec, host_env) if user is None else user):
        env[key] = val
    return env


# --- the image's rows (3 in the table above) ---------------------------------
# Bounds on a bundle's process.env (its config.json is at most 4 MiB anyway).
_MAX_ENV_ITEMS = 4096


def config_env(config, rootfs):
    """(env items, cwd) of a bundle's config.json, every field checked as
    data of the expected type: the file is the image's, not ours."""
    import json

    def bad(why):
        return UsageError(f"invalid OCI config.json next to {rootfs}", why,
                          "fix the bundle's config.json or point at its rootfs/")
    try:
        conf = json.loads(config)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise bad("not valid JSON (or nested too deeply)") from None
    if not isinstance(conf, dict):
        raise bad("not a JSON object")
    proc = conf.get("process")
    proc = {} if proc is None else proc
    if not isinstance(proc, dict):
        raise bad("process is not an object")
    env = proc.get("env")
    env = [] if env is None else env
    if not isinstance(env, list):
        raise bad("process.env is not a list of strings")
    if len(env) > _MAX_ENV_ITEMS:
        raise bad(f"process.env has {len(env)} entries (at most {_MAX_ENV_ITEMS})")
    items = []
    for item in env:
        if not isinstance(item, str):
            raise bad(f"process.env holds a {type(item).__name__}, not a KEY=VALUE string")
        if "\0" in item:
            raise bad("process.env holds a NUL character")
        key, eq, val = item.partition("=")
        if eq and key:
            items.append((key, val))
    cwd = proc.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or "\0" in cwd):
        raise bad("process.cwd is not a path string")
    return items, cwd if cwd and cwd.startswith("/") else None


def image_env(rootfs, config, rootfd=None):
    """(env items, workdir) from the bundle's config.json or /etc/environment."""
    if config is not None:
        return config_env(config, rootfs)
    from .linux.sys import read_in_root
    text = read_in_root(rootfs if rootfd is None else rootfd, "/etc/environment", 1 << 20)
    if not text:
        return [], None
    try:
        return parse_env_lines(text.decode("utf-8", "replace"),
                                      rootfs + "/etc/environment"), None
    except UsageError:
        # A malformed image file is the image author's problem, not a reason to
        # refuse the launch: keep the lines that parse.
        good = []
        for line in text.decode("utf-8", "replace").splitlines():
            key, eq, val = line.strip().partition("=")
            if eq and key and "\0" not in line and all(c.isalnum() or c == "_" for c in key):
                good.append((key, val.strip("\"'")))
        return good, None
