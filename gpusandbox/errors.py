"""One exception family for everything the launcher reports to the user.

Nothing below the CLI prints or exits: code raises SandboxError (or a subclass)
with a one-line message, an optional hint and the exit code the CLI should use.
Exit codes follow docker's convention (documented in README.md):
125 launcher error, 126 command not executable, 127 command not found.
"""

EXIT_LAUNCHER = 125
EXIT_CANNOT_EXEC = 126
EXIT_NOT_FOUND = 127


class SandboxError(Exception):
    """A failure the user can act on: `what` failed because of `why`."""

    def __init__(self, what, why=None, hint=None, code=EXIT_LAUNCHER):
        super().__init__(what)
        self.what = what
        self.why = why
        self.hint = hint
        self.code = code

    def line(self):
        return f"{self.what}: {self.why}" if self.why else self.what


class UsageError(SandboxError):
    """Bad command-line input (an option, a selector, a path)."""


class GpuError(SandboxError):
    """The GPU layer: driver, devices, libraries, selection."""


class CgroupError(SandboxError):
    """The cgroup layer: hierarchy, delegation, controllers, BPF device filter."""


class SeccompError(SandboxError):
    """A seccomp profile that cannot be read or compiled."""


def printable(text):
    """`text` kept on one line: control characters (C0, DEL, C1, the Unicode
    line and paragraph separators) shown as escapes.  Messages quote what the
    user typed (paths, values, command words); a newline or carriage return
    there must not forge a second line of output."""
    text = str(text)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        o = ord(ch)
        if o < 0x20 or 0x7F <= o < 0xA0 or o in (0x2028, 0x2029):
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}")
        else:
            out.append(ch)
    return "".join(out)


def message(err):
    """The user-facing text of a SandboxError: one `gpusandbox: error:` line
    and an optional `hint:` line."""
    msg = f"gpusandbox: error: {printable(err.line())}\n"
    if err.hint:
        msg += f"hint: {printable(err.hint)}\n"
    return msg


def exit_main(main, argv, what=None):
    """The end of a module run as a program: exit with main(argv)'s status;
    a SandboxError is shown as `message` writes it and exits with its code;
    with `what`, an OSError too, as `gpusandbox: error: WHAT: ...`, 125."""
    import sys
    try:
        sys.exit(main(argv))
    except SandboxError as e:
        sys.stderr.write(message(e))
        sys.exit(e.code)
    except OSError as e:
        if what is None:
            raise
        sys.stderr.write(f"gpusandbox: error: {what}: {e}\n")
        sys.exit(EXIT_LAUNCHER)
