"""The runc command line's option reader, shared by cli.py and the
commands it dispatches to (execute.py): below both, so neither imports the
other for it."""
from ...errors import SandboxError, printable


def _split(argv, values, flags):
    """(options dict, positional args) of one command's argv; runc's
    spellings: --opt VALUE, --opt=VALUE, -opt (Go's flag package)."""
    opts, pos = {}, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            pos += argv[i + 1:]
            break
        if a.startswith("-") and a != "-" and not pos:
            name, eq, val = a.partition("=")
            if not name.startswith("--") and len(name) > 2:
                name = "-" + name
            if name in values:
                if not eq:
                    i += 1
                    if i >= len(argv):
                        raise SandboxError(f"option {name} needs a value")
                    val = argv[i]
                opts.setdefault(name, []).append(val)
            elif name in flags:
                opts[name] = [val or "true"]
            else:
                raise SandboxError(f"unknown option {printable(name)}")
        else:
            pos.append(a)
        i += 1
    return opts, pos


def _one(opts, name, default=None):
    v = opts.get(name)
    return v[-1] if v else default


def _truthy(opts, name):
    return _one(opts, name, "false") not in ("false", "0")
