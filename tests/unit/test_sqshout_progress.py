"""`pull -o`: while mksquashfs writes the file, its growth reaches the
progress line (mksquashfs itself says nothing before the end)."""
import os
import shutil

import pytest

from gpusandbox.image import sqshout


@pytest.mark.skipif(not shutil.which("mksquashfs"), reason="no mksquashfs (squashfs-tools)")
def test_write_reports_the_file_as_it_grows(tmp_path, monkeypatch):
    src = tmp_path / "tree"
    src.mkdir()
    for i in range(4):                       # incompressible: mksquashfs takes a while
        (src / f"f{i}").write_bytes(os.urandom(12_000_000))
    monkeypatch.setattr(sqshout, "POLL", 0.01)
    events = []
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    try:
        sqshout.write(fd, "tree", str(tmp_path / "out.sqsh"),
                      progress=lambda ev, item: events.append((ev, item)))
    finally:
        os.close(fd)
    target = str(tmp_path / "out.sqsh")
    assert events[0] == ("squash-start", {"path": target})
    assert events[-1] == ("squashed", {"path": target, "size": os.stat(target).st_size})
    written = [item["written"] for ev, item in events if ev == "squash"]
    assert written and written == sorted(written) and max(written) > 0, events
    assert sorted(os.listdir(tmp_path)) == ["out.sqsh", "tree"]
