"""Where settings come from, and whether any is given at all, without
reading one: the one question a plain launch asks before it would load
settings.py (the reader: its table, its files, its checks).  Light: os only.

configured() is True when a variable that starts with PREFIX has a value
(every key's variable, the oci.conf file's and its older spelling do:
tests/unit/test_launch_lean.py holds settings.ENV_VARS to it) or when one of
source_dirs() exists.  A variable of the prefix that names no setting
(GPUSANDBOX_POD, a test's pause point) only makes its caller read the
settings, which then find nothing to change: every key keeps its default.
"""
import os

PREFIX = "GPUSANDBOX_"
SYSTEM_DIR = "/etc/gpusandbox"
# The driver-root key's default (settings.KEYS), the root a launch reads
# when nothing is configured and --driver-root is not given.
DRIVER_ROOT = "/"

_ANSWER = []        # configured() of this process's own environment, once


def source_dirs(environ):
    """The directories every settings file and the site hooks live in: the
    site's (/etc/gpusandbox: oci.conf, gpusandbox.conf, conf.d/, hooks-dir's
    default hooks.d/) and the caller's (<config home>/gpusandbox, under
    $XDG_CONFIG_HOME and under $HOME/.config).  tests/unit/test_launch_lean.py
    holds every path settings.sources() and settings.KEYS name to them."""
    out = [SYSTEM_DIR]
    home = environ.get("HOME") or ""
    for base in (environ.get("XDG_CONFIG_HOME") or "", home and home + "/.config"):
        if base.startswith("/"):
            out.append(os.path.join(base, "gpusandbox"))
    return out


def configured(environ=None):
    """Whether a PREFIX variable is set or one of source_dirs() exists.
    Without one, every key has its default and there is no site hook: a
    launch loads neither settings, siterun, conffile nor sitehooks.  The
    answer for this process's environment (environ None) is asked once: the
    launcher, its init (a fork) and its exit hooks share it."""
    if environ is None:
        if not _ANSWER:
            _ANSWER.append(configured(os.environ))
        return _ANSWER[0]
    if any(val and key.startswith(PREFIX) for key, val in environ.items()):
        return True
    return any(os.path.lexists(d) for d in source_dirs(environ))
