"""GPU sharing refusals and mode bookkeeping that need a real nvidia-smi's
answers: played here by a shell script standing in for it."""
import os
import types

import pytest

from gpusandbox.errors import GpuError
from gpusandbox.gpu import mpscli, share

UUID = "GPU-12345678-aaaa"


def _host(tmp_path, script):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + script)
    smi.chmod(0o755)
    gpu = types.SimpleNamespace(model="NVIDIA H100 80GB HBM3", index=0, uuid=UUID)
    host = types.SimpleNamespace(migs=[], bins={"nvidia-smi": str(smi)}, driver_root="/")
    sel = types.SimpleNamespace(gpus=[gpu], migs=[], none=False, caps=("compute",), visible="0")
    return host, gpu, sel


class _Spec:
    user = None


def test_an_mps_server_of_another_user_on_the_gpu_is_refused(tmp_path, monkeypatch):
    # pid 1 is root's; the caller plays uid 4242.
    host, gpu, sel = _host(tmp_path, f"""case "$1" in
--query-compute-apps=*) echo "1, {UUID}, /usr/bin/nvidia-cuda-mps-server"
  echo "1, GPU-other, /usr/bin/nvidia-cuda-mps-server"; echo "1, {UUID}, python3" ;;
*) echo "{UUID}, 81559, Default" ;;
esac
""")
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    assert share.other_servers(host, gpu) == [(1, 0)]
    with pytest.raises(GpuError) as e:
        share.check_gpu(host, sel, _Spec)
    assert e.value.code == 125
    assert e.value.line() == ("MPS limits on GPU 0: an MPS server of another user (uid 0, pid 1) "
                              "runs on it")
    assert "mps down" in e.value.hint
    # The caller's own server is no obstacle.
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert share.check_gpu(host, sel, _Spec) == (gpu, "Default")


def test_an_nvidia_smi_without_compute_apps_refuses_nothing(tmp_path):
    host, gpu, _ = _host(tmp_path, 'echo "Field is not valid"; exit 2\n')
    assert share.other_servers(host, gpu) == []


class _Daemon:
    def __init__(self, gpu):
        self.gpu, self.state = gpu, {}

    def start(self):
        return True

    def pid(self):
        return 4242

    def read_state(self):
        return dict(self.state)

    def write_state(self, **changes):
        self.state.update(changes)


def test_a_second_exclusive_up_keeps_the_mode_to_restore(tmp_path, monkeypatch):
    mode = tmp_path / "mode"
    mode.write_text("Default\n")
    host, gpu, _ = _host(tmp_path, f"""case "$1" in
--query-gpu=*) echo "{UUID}, 81559, $(cat {mode})" ;;
-i) [ "$4" = EXCLUSIVE_PROCESS ] && echo Exclusive_Process > {mode} || echo "$4" > {mode} ;;
esac
""")
    monkeypatch.setattr(mpscli.os, "geteuid", lambda: 0)
    d = _Daemon(gpu)
    args = mpscli.parser().parse_args(["up", "--exclusive"])
    first = mpscli._up(host, d, args)
    assert mode.read_text().strip() == "Exclusive_Process"
    again = mpscli._up(host, d, args)
    assert d.state["previous_mode"] == "Default"
    # What mps up and down say, in sentences.
    assert mpscli.up_lines(first) == [
        "GPU 0: MPS daemon started (pid 4242)",
        "  compute mode set to Exclusive_Process (was Default; 'gpusandbox mps down' "
        "restores it)"]
    assert mpscli.up_lines(again)[1] == "  compute mode already Exclusive_Process"
    monkeypatch.setattr(d, "stop", lambda: True, raising=False)
    monkeypatch.setattr(d, "remove", lambda: None, raising=False)
    down = mpscli._down(host, d)
    assert down["restored_mode"] == "Default"
    assert mode.read_text().strip() == "DEFAULT"
    assert mpscli.down_lines(down) == [
        "GPU 0: MPS daemon (pid 4242) stopped; compute mode restored to Default"]


def test_info_names_the_tier_a_launch_uses_and_its_limit(tmp_path, monkeypatch):
    from gpusandbox.gpu import mps
    host, gpu, _ = _host(tmp_path, "exit 2\n")
    host.gpus = [gpu]
    host.bins.update({mps.CTL: "/x/ctl", "nvidia-cuda-mps-server": "/x/srv"})
    monkeypatch.setattr(mps, "base_dir", lambda environ=None: str(tmp_path / "mps"))
    lines = dict(share.info_lines(host))
    assert lines["gpu sharing"].startswith(
        "MPS (tiers 1-2): available: --gpu-memory/--gpu-compute use tier 1 (tier 2 once "
        "'gpusandbox mps up --exclusive' set EXCLUSIVE_PROCESS)")
    assert "not against a hostile tenant" in lines["gpu sharing"]
