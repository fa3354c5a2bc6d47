"""gpusandbox: a daemonless container runtime for GPU jobs.

The package's own file also holds the checks of data read from an image (they
were imagedata.py): every module of the package loads this file anyway, so
these few functions, which most of the launch path uses, cost no import of
their own."""
__version__ = "0.1.0"

# Checks for data read from an image (config.json, /etc/environment,
# version.json, ld.so.cache, file names): all of it is untrusted input to the
# host side, so every field is checked for type, character set and size before
# it is used, and only SandboxError subclasses come out of a bad value.
#
# str.isdigit() is not a number check: it accepts Unicode digits ("²", "١")
# that int() then rejects or reads in another script, so every numeric field
# goes through isdigits().

# Longest numeric component accepted in a version or index: far beyond any
# real one, and far below int()'s 4300-digit conversion limit.
MAX_DIGITS = 18


def isdigits(s):
    """True for a non-empty run of ASCII digits (0-9) only."""
    return isinstance(s, str) and s.isascii() and s.isdigit()


def number(s):
    """int(s) for a short ASCII-digit string, else None."""
    if isdigits(s) and len(s) <= MAX_DIGITS:
        return int(s)
    return None


def short(s, limit=60):
    """repr() of s cut to about `limit` characters, for one-line messages."""
    r = repr(s)
    return r if len(r) <= limit else r[:limit - 4] + "...'"
