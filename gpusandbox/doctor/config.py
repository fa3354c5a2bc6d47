"""The configuration section of `gpusandbox doctor` (docs/config.md): each
site, user and registries.conf file (owner, mode, syntax, keys), the
site's mounts whose source is missing or forbidden, and what this caller's
`run` gets from them (mounts, variables, locks).  Empty where no file is
there."""
import os

from gpusandbox import conffile, settings
from gpusandbox.errors import SandboxError

from .common import FAIL, PASS, WARN, Check

S = "config"


def check_config(environ, etc="/etc"):
    out = []
    site_dir = os.path.join(etc, "gpusandbox")
    s = settings.Settings(srcs=settings.sources(environ, os.path.join(site_dir, "oci.conf"),
                                                site_dir))
    toml = [src for src in s.sources if isinstance(src, settings.TomlSource)]
    for src in toml:
        for path in src.paths:
            try:
                c = conffile.load(path, settings.KEYS, src.admin, lambda w: out.append(
                    Check(S, path, WARN, w.partition(" skipped: ")[2] or w, "")))
            except SandboxError as e:
                out.append(Check(S, path, FAIL, e.line(), e.hint or ""))
                continue
            if c is not None:
                what = f"{len(c.values)} key(s)" + (f", locks {', '.join(sorted(c.locks))}"
                                                    if c.locks else "")
                out.append(Check(S, path, PASS, what))
    if any(c.status == FAIL for c in out):
        return out
    try:
        from gpusandbox import siterun
        ids = siterun.identity()
        deny = s.get("forbid-binds")
        for i, m in enumerate(s.get("mounts")):
            src = siterun.expand(m["source"], ids, f"mounts[{i}]")
            if src is None:
                out.append(Check(S, f"mount {m['source']}", PASS,
                                 "skipped here (names {job} outside a job)"))
            elif not os.path.exists(src):
                out.append(Check(S, f"mount {src}", PASS if m.get("optional") else FAIL,
                                 "source missing" + (": skipped (optional)"
                                                     if m.get("optional") else ""),
                                 "" if m.get("optional") else
                                 "create it or mark the mount optional = true"))
            elif deny and siterun.forbidden(src, deny):
                out.append(Check(S, f"mount {src}", FAIL, "the site's own mount is forbidden "
                                 "by forbid-binds", "remove one of the two"))
            else:
                out.append(Check(S, f"mount {src}", PASS, "bound at " +
                                 (siterun.expand(m.get("destination", m["source"]), ids, "")
                                  or "?")))
        for name, where in sorted(s.locks().items()):
            v = s.get(name)
            out.append(Check(S, f"lock {name}", PASS, f"{name} = "
                             f"{'the built-in default' if v is None else v} ({where})"))
        for w in s.warnings():
            if "locked by the site" in w:
                out.append(Check(S, "lock", WARN, w, "remove your value"))
    except SandboxError as e:
        out.append(Check(S, "settings", FAIL, e.line(), e.hint or ""))
    from gpusandbox.image import registries
    for path, system in registries.files(environ, os.path.join(etc, "containers/registries.conf"),
                                         os.path.join(etc, "containers/registries.conf.d")):
        text, problem = conffile.read(path, allow_caller=not system)
        if problem:
            out.append(Check(S, path, WARN, problem.partition(" skipped: ")[2], ""))
    try:
        rc = registries.load(environ, system_file=os.path.join(etc, "containers/registries.conf"),
                             system_dropins=os.path.join(etc, "containers/registries.conf.d"))
        if rc.search:
            out.append(Check(S, "registries", PASS, "short names search " +
                             ", ".join(rc.search) + f" ({rc.search_from})"))
        for reg in rc.registries.values():
            detail = "blocked" if reg.blocked else \
                f"from {reg.location}" + (f", mirrors {', '.join(m[0] for m in reg.mirrors)}"
                                          if reg.mirrors else "")
            out.append(Check(S, f"registry {reg.prefix}", PASS, detail))
    except SandboxError as e:
        out.append(Check(S, "registries.conf", FAIL, e.line(), e.hint or ""))
    return out
