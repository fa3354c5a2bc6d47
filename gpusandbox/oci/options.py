"""The `--opt value` / `--opt=value` options of the container-stack
subcommands that take a few named options (hook install, runtime
configure)."""
import sys

from gpusandbox.errors import UsageError


def parse_options(argv, opts, what, hint, usage=None):
    """`opts` (option -> default) updated from argv; an option it does not
    name, or one without its value, is refused as `WHAT ARG` with `hint`.
    With `usage`, -h/--help writes it to stdout and returns None."""
    it = iter(argv)
    for a in it:
        k, eq, v = a.partition("=")
        if usage is not None and k in ("-h", "--help"):
            sys.stdout.write(usage)
            return None
        if k not in opts:
            raise UsageError(f"{what} {a}", "unknown option", hint=hint)
        if not eq:
            v = next(it, None)
            if v is None:
                raise UsageError(f"{what} {k}", "needs a value")
        opts[k] = v
    return opts
