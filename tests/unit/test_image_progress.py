"""Pull progress rendering: plain lines with a 10 s heartbeat (a Slurm
log), json events, tty status line, none."""
import io
import json

from gpusandbox.image.progress import Progress

D1 = {"digest": "sha256:" + "1" * 64, "size": 3000}
D2 = {"digest": "sha256:" + "2" * 64, "size": 1000}


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def drive(mode):
    out, clock = io.StringIO(), Clock()
    p = Progress(mode, out, clock)
    p("start", {"layers": 2, "total": 4000})
    for _ in range(3):
        clock.t += 6
        p("bytes", 1000)
    p("blob", D1)
    p("cached", D2)
    p("layer", D1)
    p("warn", "skipped 1 device node")
    p.finish()
    return out.getvalue()


def test_plain_lines_and_heartbeat():
    lines = drive("plain").splitlines()
    assert lines[0].startswith("0/2 layers, 2.0 KiB of 3.9 KiB")   # at 12 s, not 6 s
    assert lines[1:] == [
        "fetched sha256:111111111111 (2.9 KiB)", "cached sha256:222222222222",
        "applied sha256:111111111111", "gpusandbox: warning: skipped 1 device node",
        lines[-1]]
    assert lines[-1].startswith("done: 2/2 layers, 2.9 KiB of 3.9 KiB")


def test_json_events():
    recs = [json.loads(x) for x in drive("json").splitlines() if x.startswith("{")]
    assert [r["event"] for r in recs] == ["start", "bytes", "bytes", "bytes", "blob",
                                          "cached", "layer"]
    assert recs[4]["digest"] == D1["digest"]


def test_tty_and_none():
    out = drive("tty")
    assert "\r\x1b[K0/2 layers" in out and "applied" not in out
    assert drive("none") == "gpusandbox: warning: skipped 1 device node\n"
