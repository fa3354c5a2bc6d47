"""The text of --gpus, as docker and podman users type it, made our selector.

Our selector is a device list (`0,1`, UUIDs, bus ids, MIG), `all`, `none`,
`auto` or `void` (gpu/select.py).  Docker's `--gpus` is a CSV list of
`all`, `N` (a count), `count=N|all`, `device=LIST` (quoted to keep its
commas: `--gpus '"device=1,2"'`) and `capabilities=...`.  Where the two
agree or do not overlap docker's meaning is taken: `device=LIST` is LIST,
`count=all` is `all`, and `count=N` stays `count=N` for select.py, which
needs the host's GPUs to pick the first N.  A bare number stays a device
index, as documented; `note` then says how to ask for docker's count.

Pure string work, imported by the run parser: nothing heavy here."""
from gpusandbox.errors import UsageError
from gpusandbox.imagedata import isdigits

_FORMS = "all, none, count=N, device=LIST or a list such as 0,1"


def _bad(text, why, hint=None):
    from gpusandbox.imagedata import short
    return UsageError(f"invalid --gpus {short(text)}", why, hint or f"use --gpus {_FORMS}")


def _fields(text):
    from gpusandbox.mountopt import csv_fields
    fields = csv_fields(text)
    if fields is None:
        raise _bad(text, "unbalanced double quote")
    return fields


def _key(item):
    """A device item as select.py compares it: indices by number, names
    without case (UUIDs and bus ids are hexadecimal)."""
    return str(int(item)) if isdigits(item) and len(item) < 10 else item.lower()


def normalise(text):
    """(selector, note): the selector select.py resolves, and a one-line
    note for the user or None.  Raises UsageError for a form that is not
    one, or a device named twice.  Idempotent on its own output."""
    if '"' not in text and "=" not in text and "," not in text:
        return text, _count_note(text.strip(), text)
    devices, count = [], None
    for field in _fields(text):
        key, eq, val = field.partition("=")
        key = key.strip().lower()
        if not eq:
            devices.append(field.strip())
        elif key == "device":
            devices += [v.strip() for v in val.split(",")]
        elif key == "count":
            if count is not None:
                raise _bad(text, "count= given twice")
            count = val.strip().lower()
        elif key == "capabilities":
            raise _bad(text, "capabilities are a separate option here",
                       f"use --gpu-caps {val.strip() or 'CAPS'}")
        else:
            raise _bad(text, f"unknown key {key + '='!r}")
    devices = [d for d in devices if d]
    if count is not None:
        if devices:
            raise _bad(text, "count= and a device list together",
                       "give one: --gpus count=N or --gpus device=LIST")
        if count == "all":
            return "all", None
        if not isdigits(count) or len(count) > 6:
            raise _bad(text, "count= takes a number or all", "example: --gpus count=2")
        if int(count) == 0:
            raise _bad(text, "count=0 selects no GPU",
                       "leave --gpus out for no GPU support, or --gpus none for the "
                       "driver files without a GPU")
        return f"count={int(count)}", None
    if not devices:
        raise _bad(text, "no device named")
    seen = set()
    for d in devices:
        k = _key(d)
        if k in seen:
            raise _bad(text, f"{d!r} is named twice", "name each GPU once, e.g. --gpus 0,1")
        seen.add(k)
    sel = ",".join(devices)
    note = None
    if len(devices) == 1 and not text.strip().lower().startswith(("device=", '"device=')):
        note = _count_note(devices[0], text)
    return sel, note


def _count_note(item, text):
    """A single bare number: ours is a device index, docker's a count."""
    if isdigits(item) and len(item) <= 4 and int(item) >= 1:
        n = int(item)
        return (f"--gpus {item} is the GPU with index {n}, not docker's count: for "
                f"{n} GPU{'s' if n > 1 else ''} use --gpus count={n} (--gpus device={n} "
                "selects the index without this note)")
    return None
