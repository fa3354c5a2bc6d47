"""The settings section of `gpusandbox doctor`: what the OCI doors read for
this caller (gpusandbox.settings), a file that would fail them, and the
older spellings and unknown keys they read or ignore without a word (every
container create reads the settings: a warning there would go to the
engine).  Empty where no settings variable is set and no file is there."""
from gpusandbox import settings
from gpusandbox.errors import SandboxError

from .common import FAIL, PASS, WARN, Check


def check_settings(environ, system_file=settings.SYSTEM_FILE):
    out = [Check("settings", var, WARN, "an older name, still read",
                 f"set {settings.FILE_VAR} instead")
           for var in settings.OLD_FILE_VARS if environ.get(var)]
    s = settings.Settings(srcs=settings.sources(environ, system_file))
    for name in settings.KEYS:
        try:
            value, where = s.lookup(name)
        except SandboxError as e:
            out.append(Check("settings", name, FAIL, e.line(), e.hint or ""))
            continue
        if where is not None:
            out.append(Check("settings", name, PASS, f"{value} (from {where})"))
    for src in s.sources[1:]:
        if isinstance(src, settings.TomlSource):
            continue        # the configuration files' own section (doctor/config.py)
        try:
            src.values()
        except SandboxError as e:
            if not any(c.detail == e.line() for c in out):
                out.append(Check("settings", src.path, FAIL, e.line(), e.hint or ""))
            continue
        out += [Check("settings", src.path, WARN, what, fix) for what, fix in src.notes]
    return out
