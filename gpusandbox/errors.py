"""One exception family for everything the launcher reports to the user.

Nothing below the CLI prints or exits: code raises SandboxError (or a subclass)
with a one-line message, an optional hint and the exit code the CLI should use.
Exit codes follow docker's convention (documented in README.md):
125 launcher error, 126 command not executable, 127 command not found,
130 and 143 gpusandbox itself interrupted by SIGINT and SIGTERM.
"""

EXIT_LAUNCHER = 125
EXIT_CANNOT_EXEC = 126
EXIT_NOT_FOUND = 127
EXIT_SIGINT = 130
EXIT_SIGTERM = 143


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


class Interrupted(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) delivered to gpusandbox itself, raised where the
    main thread is, like SIGINT's KeyboardInterrupt: `finally` blocks and
    `except BaseException` clean-ups run as they do for Ctrl-C."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


_CATCHER = []    # the pid that installed the handlers


def _raise_interrupted(signum, frame):
    import os
    if os.getpid() not in _CATCHER:
        # A forked child that has not exec'd yet (a namespace joiner, an
        # MPS spawner): it dies of the signal as it did before, rather than
        # unwinding its parent's code.
        import _signal
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise Interrupted(signum)


def catch_signals():
    """At a command's start: SIGTERM and SIGHUP raise Interrupted (SIGINT
    already raises KeyboardInterrupt), so that an interrupted command unwinds
    through its clean-ups and ends with one line and 128+N, never a
    traceback.  A signal the caller left ignored (nohup, a background job)
    stays ignored.  The launch replaces these handlers with its own once it
    forwards signals to the sandbox.  (_signal, not signal: `run` does not
    pay for the enum module.)"""
    import _signal
    import os
    _CATCHER[:] = [os.getpid()]
    for sig in (_signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(sig) == _signal.SIG_DFL:
            _signal.signal(sig, _raise_interrupted)


def quiet_signals():
    """From the final report on: SIGINT, SIGTERM and SIGHUP ignored.  The
    clean-ups ran while the interrupt unwound; a second Ctrl-C must not turn
    the report into a traceback."""
    import signal
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:
            pass            # not the main thread: nothing to protect


def interrupted(exc, what=None, hint=None):
    """The SandboxError telling that `what` (default: gpusandbox) was
    interrupted by the signal behind KeyboardInterrupt `exc`, with exit
    code 128+N (130 for SIGINT, 143 for SIGTERM)."""
    import signal
    signum = getattr(exc, "signum", signal.SIGINT)
    name = signal.Signals(signum).name
    return SandboxError(f"{what or 'gpusandbox'} interrupted by {name}", None, hint,
                        128 + int(signum))


# What an interrupted pull leaves (image/partial.py keeps the bytes that
# came; staging is removed): said when a pull or a `run REF` is interrupted.
RESUME_HINT = "run the same command again: the download goes on from where it stopped"


def real_path(name, fd_base="/proc/self/fd/"):
    """`name` as the user knows it: a /proc/self/fd/N[/REST] path (how the
    code reaches a file through a held directory fd) becomes the path that fd
    was opened at, while it is still open; anything else unchanged."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "surrogateescape")
    if not isinstance(name, str) or not name.startswith(fd_base):
        return name
    num, sep, rest = name[len(fd_base):].partition("/")
    import os
    try:
        base = os.readlink(fd_base + num)
    except OSError:
        return None
    if not base.startswith("/"):
        return None             # a pipe, a socket or an anonymous inode
    return base.rstrip("/") + "/" + rest if sep else base


def os_error(what, e, path=None, hint=None, cls=None):
    """An OSError as one line: `WHAT: STRERROR: PATH`, PATH the file as the
    user knows it (`path` when the caller knows better, else the error's
    own file name with /proc/self/fd/N resolved; never a bare fd path)."""
    why = e.strerror or str(e) or type(e).__name__
    where = path if path is not None else real_path(e.filename)
    if where is not None and not str(where).startswith("/proc/self/fd/"):
        why += f": {where}"
        if e.filename2 is not None:
            two = real_path(e.filename2)
            if two is not None and not str(two).startswith("/proc/self/fd/"):
                why += f" -> {two}"
    return (cls or SandboxError)(what, why, hint)


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
    except KeyboardInterrupt as e:
        quiet_signals()
        err = interrupted(e, what)
        sys.stderr.write(message(err))
        sys.exit(err.code)
    except OSError as e:
        if what is None:
            raise
        sys.stderr.write(message(os_error(what, e)))
        sys.exit(EXIT_LAUNCHER)
