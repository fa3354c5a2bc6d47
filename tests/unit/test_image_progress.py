"""Pull progress rendering: plain lines with a 10 s heartbeat (a Slurm
log), json events, tty status line, none; and `pull -o`'s squashfs file
as mksquashfs writes it."""
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
    assert lines[0].startswith("0/2 layers, 2.0 kB of 4.0 kB")   # at 12 s, not 6 s
    assert lines[1:] == [
        "fetched sha256:111111111111 (3.0 kB)", "cached sha256:222222222222",
        "applied sha256:111111111111", "gpusandbox: warning: skipped 1 device node",
        lines[-1]]
    assert lines[-1].startswith("done: 2/2 layers, 3.0 kB of 4.0 kB")


def test_json_events():
    recs = [json.loads(x) for x in drive("json").splitlines() if x.startswith("{")]
    assert [r["event"] for r in recs] == ["start", "bytes", "bytes", "bytes", "blob",
                                          "cached", "layer"]
    assert recs[4]["digest"] == D1["digest"]


def test_tty_and_none():
    out = drive("tty")
    assert "\r\x1b[K0/2 layers" in out and "applied" not in out
    assert drive("none") == "gpusandbox: warning: skipped 1 device node\n"


def squash(mode):
    out, clock = io.StringIO(), Clock()
    p = Progress(mode, out, clock)
    p("squash-start", {"path": "/shared/img.sqsh"})
    for n in range(1, 60):                  # 15 s of mksquashfs, polled every 0.25 s
        clock.t += 0.25
        p("squash", {"written": n * 2_000_000})
    clock.t += 0.5
    p("squashed", {"path": "/shared/img.sqsh", "size": 120_000_000})
    return out.getvalue()


def test_squashfs_export_shows_a_progress_line_on_a_terminal():
    out = squash("tty")
    updates = out.split("\r\x1b[K")
    assert len(updates) > 20, out        # rewritten in place, at most 5 times a second
    assert updates[1] == "writing img.sqsh: 2.0 MB so far, 0 s"
    assert "writing img.sqsh: 100 MB so far, 12 s" in updates
    assert out.endswith("\r\x1b[Kwrote /shared/img.sqsh (120 MB) in 15 s\n")


def test_squashfs_export_in_a_log_and_quiet():
    assert squash("plain").splitlines() == ["writing /shared/img.sqsh with mksquashfs",
                                            "writing img.sqsh: 80.0 MB so far, 10 s",
                                            "wrote /shared/img.sqsh (120 MB) in 15 s"]
    recs = [json.loads(x) for x in squash("json").splitlines()]
    assert recs[0] == {"event": "squash-start", "path": "/shared/img.sqsh"}
    assert recs[-1] == {"event": "squashed", "path": "/shared/img.sqsh", "size": 120_000_000}
    assert 10 <= len(recs) <= 20         # a squash event a second
    assert squash("none") == ""
