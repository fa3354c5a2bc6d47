"""Live sandboxes' records (gpusandbox/live/record.py) and the detached log's
bound (live/log.py), on a live/ directory of the test's own."""
import json
import os

import pytest

from gpusandbox.errors import SandboxError, UsageError
from gpusandbox.linux import procstat
from gpusandbox.live import log, record


@pytest.fixture
def part(tmp_path, monkeypatch):
    d = tmp_path / "live"
    d.mkdir(mode=0o700)

    def open_part(make=True):
        return os.open(d, os.O_RDONLY | os.O_DIRECTORY), str(d)
    monkeypatch.setattr(record, "open_part", open_part)
    return d


def _rec(name, launcher=None, exit_code=None):
    me = procstat.start_time(os.getpid())[0]
    return {"version": record.VERSION, "name": name, "owner": os.geteuid(),
            "launcher": launcher or [os.getpid(), me], "init": [os.getpid(), me],
            "exit_code": exit_code, "process": {}}


def _claim(name, rec):
    pfd, _, dfd = record.claim(name)
    record.write(dfd, rec)
    os.close(dfd)
    os.close(pfd)


@pytest.mark.parametrize("bad", ["", "-a", ".a", "_a", "a/b", "a b", "a\nb", "x" * 65, "é"])
def test_bad_names_are_refused(bad):
    with pytest.raises(UsageError) as ei:
        record.check_name(bad)
    assert ei.value.line().startswith("invalid sandbox name") and "\n" not in ei.value.line()


def test_auto_names_are_valid_and_distinct():
    names = {record.auto_name(img) for img in ["/a/b/rootfs/", "docker://x/y:1", "@@", "."]
             * 3}
    assert len(names) == 12
    for n in names:
        assert record.check_name(n) == n


def test_a_running_name_clashes_and_a_stale_one_is_taken_over(part):
    _claim("web", _rec("web"))
    with pytest.raises(UsageError) as ei:
        record.claim("web")
    assert "in use by a running sandbox of yours" in ei.value.line()
    _claim("done", _rec("done", exit_code=0))
    with pytest.raises(UsageError, match="has exited"):
        record.claim("done")
    # A launcher that is gone without an exit status: stale, cleaned on sight.
    _claim("dead", _rec("dead", launcher=[os.getpid(), 1]))
    assert [n for n, _ in record.entries(*record.open_part())] == ["done", "web"]
    assert not (part / "dead").exists()
    _claim("dead2", _rec("dead2", launcher=[os.getpid(), 1]))
    _claim("dead2", _rec("dead2"))          # taken over, no error
    with pytest.raises(SandboxError, match="no sandbox named 'nope'"):
        record.find("nope")


def _refused(name):
    with pytest.raises(SandboxError) as ei:
        record.find(name)
    return ei.value.line()


def test_records_that_are_not_ours_or_links_are_refused(part, tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (part / "linked").symlink_to(tmp_path / "elsewhere")
    assert "a link or not a directory" in _refused("linked")
    (part / "open").mkdir(mode=0o755)
    os.chmod(part / "open", 0o755)
    assert "mode 0755" in _refused("open")
    (part / "wr").mkdir(mode=0o700)
    (part / "wr" / record.RECORD).write_text(json.dumps(_rec("wr")))
    os.chmod(part / "wr" / record.RECORD, 0o666)
    assert "lets others write" in _refused("wr")
    # Listing skips what it cannot trust; nothing of it is removed.
    assert record.entries(*record.open_part()) == []
    assert (tmp_path / "elsewhere").is_dir() and (part / "open").is_dir()


def test_slurm_task_needs_numbers():
    env = {"SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3"}
    assert record.slurm_name(record.slurm_task(env)) == "slurm-12.0.3"
    assert record.slurm_task({**env, "SLURM_STEP_ID": "batch"}) is None
    assert record.slurm_task({**env, "SLURM_PROCID": "../x"}) is None
    assert record.slurm_task({}) is None


def test_the_log_keeps_its_newest_part_within_the_bound(tmp_path):
    d = tmp_path / "n"
    d.mkdir(mode=0o700)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    r, w = os.pipe()
    lines = b"".join(b"line %06d\n" % i for i in range(20000))   # 240000 bytes
    pid = os.fork()
    if pid == 0:
        os.close(w)
        try:
            log._write_loop(r, dfd, 50000)
        finally:
            os._exit(0)
    os.close(r)
    os.write(w, lines)
    os.close(w)
    os.waitpid(pid, 0)
    data = (d / record.LOG).read_bytes()
    assert len(data) <= 50000
    assert data.endswith(b"line 019999\n") and data.startswith(b"line ")
    assert lines.endswith(data)
    out_r, out_w = os.pipe()
    log.read_log(dfd, False, out_w)
    os.close(out_w)
    assert os.read(out_r, 1 << 20) == data
    os.close(dfd)
