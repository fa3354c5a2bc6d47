"""Pull progress: `--progress auto|tty|plain|json|none`.

tty: one status line rewritten in place (layers done, bytes, rate, ETA; then,
for `pull -o`, the squashfs file's bytes written so far); plain (auto when stderr is
not a terminal, e.g. a Slurm log): a line per fetched blob and applied layer,
a heartbeat every 10 s and a line for the written squashfs file; json: one
object per event for tools.  Writes go to stderr; the pulled digest alone
goes to stdout.  Sizes in docker's decimal units (sizes.human)."""
import json
import os
import sys
import time

from .sizes import human as _size

HEARTBEAT = 10.0
MODES = ("auto", "tty", "plain", "json", "none")


class Progress:
    def __init__(self, mode="auto", out=None, clock=time.monotonic):
        self.out = out or sys.stderr
        if mode == "auto":
            mode = "tty" if self.out.isatty() else "plain"
        self.mode = mode
        self.clock = clock
        self.t0 = self.last = clock()
        self.total = self.seen = 0
        self.layers = self.done = 0
        self._line = False
        self._squash = None      # (path, start time) while a squashfs file is written

    def _write(self, text):
        self.out.write(text)
        self.out.flush()

    def _status(self):
        el = max(self.clock() - self.t0, 1e-6)
        rate = self.seen / el
        eta = (self.total - self.seen) / rate if rate > 0 and self.total > self.seen else 0
        return (f"{self.done}/{self.layers} layers, {_size(self.seen)} of {_size(self.total)}, "
                f"{_size(rate)}/s, ETA {eta:.0f} s")

    def __call__(self, event, item):
        if event == "warn":           # in every mode: the image is not as built
            self._end_line()
            self._write(f"gpusandbox: warning: {item}\n")
            return
        if self.mode == "none":
            return
        if self.mode == "json":
            rec = {"event": event}
            if isinstance(item, dict):
                rec.update({k: item[k] for k in ("digest", "size", "layers", "total", "path",
                                                 "written") if k in item})
            else:
                rec["bytes"] = item
            if event not in ("bytes", "squash") or self.clock() - self.last >= 1.0:
                self.last = self.clock()
                self._write(json.dumps(rec) + "\n")
            return
        if event == "start":
            self.layers, self.total = item["layers"], item["total"]
            return
        if event == "bytes":
            self.seen += item
            now = self.clock()
            if self.mode == "tty" and now - self.last >= 0.2:
                self.last = now
                self._write("\r\x1b[K" + self._status())
                self._line = True
            elif self.mode == "plain" and now - self.last >= HEARTBEAT:
                self.last = now
                self._write(self._status() + "\n")
            return
        if event in ("squash-start", "squash", "squashed"):
            self._squash_event(event, item)
            return
        if event == "cached":
            self.done += 1
            line = f"cached {item['digest'][:19]}"
        elif event == "blob":
            line = f"fetched {item['digest'][:19]} ({_size(item['size'])})"
        elif event == "layer":
            line = f"applied {item['digest'][:19]}"
            if self.mode == "tty":
                return
        else:
            return
        if event == "blob" and item["size"] and self.layers:
            self.done += 1
        self._end_line()
        self._write(line + "\n")

    def _squash_event(self, event, item):
        """`pull -o`: how much of the squashfs file is written, as it grows."""
        now = self.clock()
        if event == "squash-start":
            self._squash = (item["path"], now)
            if self.mode == "plain":
                self._write(f"writing {item['path']} with mksquashfs\n")
            return
        path, t0 = self._squash or (item.get("path", "?"), now)
        name = os.path.basename(path)
        if event == "squashed":
            self._end_line()
            self._write(f"wrote {path} ({_size(item['size'])}) in {now - t0:.0f} s\n")
            self._squash = None
            return
        line = f"writing {name}: {_size(item['written'])} so far, {now - t0:.0f} s"
        if self.mode == "tty" and now - self.last >= 0.2:
            self.last = now
            self._write("\r\x1b[K" + line)
            self._line = True
        elif self.mode == "plain" and now - self.last >= HEARTBEAT:
            self.last = now
            self._write(line + "\n")

    def _end_line(self):
        if self._line:
            self._write("\r\x1b[K")
            self._line = False

    def finish(self):
        if self.mode in ("tty", "plain") and self.layers:
            self._end_line()
            self._write(f"done: {self._status()}\n")
