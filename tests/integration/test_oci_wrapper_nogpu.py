"""The wrapper's shell entry (bin/gpusandbox-runtime): a `create` whose
config.json cannot ask for a GPU goes straight to the runtime without
starting Python; one that names a GPU variable or the toolkit's legacy hook
still goes through the wrapper module."""
import json
import subprocess

import pytest

from .oci_fixtures import BASE_ENV, WRAPPER

LEGACY = {"path": "/usr/bin/nvidia-container-runtime-hook",
          "args": ["nvidia-container-runtime-hook", "prestart"]}


def _create(tmp_path, cfg, bundle_flag="--bundle"):
    d = tmp_path / "bundle"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    rt = tmp_path / "rt"
    rt.write_text('#!/bin/sh\necho "runtime: $*"\n')
    rt.chmod(0o755)
    trace = tmp_path / "trace"
    env = dict(BASE_ENV, GPUSANDBOX_OCI_RUNTIME=str(rt))
    r = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(trace), WRAPPER,
                        "--root", str(tmp_path / "state"), "create", bundle_flag, str(d), "c1"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"runtime: --root {tmp_path / 'state'} create {bundle_flag} {d} c1\n"
    execs = [line for line in trace.read_text().splitlines() if "execve(" in line]
    return execs, json.loads((d / "config.json").read_text())


def _config(env=(), hooks=None):
    cfg = {"ociVersion": "1.0.2", "root": {"path": "rootfs"},
           "process": {"args": ["true"], "cwd": "/", "env": ["PATH=/bin", *env]}}
    if hooks:
        cfg["hooks"] = hooks
    return cfg


@pytest.mark.parametrize("flag", ["--bundle", "-b"])
def test_create_without_gpu_request_starts_no_python(cli, tmp_path, flag):
    execs, cfg = _create(tmp_path, _config(), flag)
    assert not [e for e in execs if "python" in e], execs
    assert cfg == _config()


def test_gpu_variable_or_legacy_hook_goes_through_the_wrapper(cli, tmp_path):
    # void asks for no GPU, but only the wrapper module can tell: Python runs,
    # and leaves the file as it was.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    execs, cfg = _create(tmp_path / "a", _config(["NVIDIA_VISIBLE_DEVICES=void"]))
    assert [e for e in execs if "python" in e], execs
    assert cfg == _config(["NVIDIA_VISIBLE_DEVICES=void"])
    # The legacy hook alone: dropped by the wrapper module.
    execs, cfg = _create(tmp_path / "b", _config(hooks={"prestart": [LEGACY]}))
    assert [e for e in execs if "python" in e], execs
    assert cfg["hooks"]["prestart"] == []
