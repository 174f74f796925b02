"""Device profiles: contract fields, derived peak figures, name errors, host detection paths."""

import subprocess

import pytest

from edgesdk import devices
from edgesdk.devices import PROFILES, DeviceProfile, get_profile
from edgesdk.errors import EdgeSDKError

CONTRACT = ("name", "description", "compute_capability", "sm_count", "memory_gb", "bandwidth_gbs", "l2_mb", "dla_cores",
            "workspace_mb", "is_jetson", "tensor_int8_tops", "tensor_fp16_tflops")


def test_profiles_have_contract_fields():
    assert {"orin", "orin-agx-32", "orin-nx-16", "orin-nx-8", "orin-nano-8", "orin-nano-4"} <= set(PROFILES)
    for p in PROFILES.values():
        d = p.model_dump()
        for k in CONTRACT:
            assert k in d, (p.name, k)
        assert p.compute_capability == "8.7" and p.sm == 87 and p.is_jetson
        assert p.sm_count > 0 and p.memory_gb > 0 and p.bandwidth_gbs > 0 and p.workspace_mb > 0


def test_orin_peak_figures_follow_from_sm_count_and_clock():
    p = get_profile("orin")
    # 16 SMs × 1.3 GHz × 2048 FP16 tensor FLOP/clk/SM = 42.6 TFLOPS; INT8 twice that (DESIGN.md §1: 42.5 / 85)
    assert p.sm_count == 16 and p.dla_cores == 2 and p.memory_gb == 64 and p.bandwidth_gbs == pytest.approx(204.8)
    assert p.tensor_fp16_tflops == pytest.approx(16 * 1.3e9 * 2048 / 1e12, abs=0.05)
    assert p.tensor_int8_tops == pytest.approx(2 * p.tensor_fp16_tflops, abs=0.1)
    assert get_profile("orin-nano-4").tensor_int8_tops < get_profile("orin-nx-16").tensor_int8_tops < p.tensor_int8_tops
    assert get_profile("ORIN") is p and get_profile("orin-agx-64") is p


def test_unknown_device_lists_valid_names():
    with pytest.raises(EdgeSDKError) as e:
        get_profile("xavier")
    assert "xavier" in e.value.problem and "orin-nx-16" in e.value.fix and "host" in e.value.fix


def test_host_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(devices, "_host_from_cuda", lambda: (_ for _ in ()).throw(RuntimeError("no driver")))
    monkeypatch.setattr(devices.shutil, "which", lambda _: None)
    with pytest.raises(EdgeSDKError) as e:
        get_profile("host")
    assert "no NVIDIA GPU" in e.value.problem and "no driver" in e.value.problem and "--device" in e.value.fix


def test_host_from_nvidia_smi(monkeypatch):
    monkeypatch.setattr(devices, "_host_from_cuda", lambda: (_ for _ in ()).throw(RuntimeError("no cuda-python")))
    monkeypatch.setattr(devices.shutil, "which", lambda _: "/usr/bin/nvidia-smi")

    def fake_run(cmd, **kw):
        assert cmd[0] == "/usr/bin/nvidia-smi"
        return subprocess.CompletedProcess(cmd, 0, stdout="NVIDIA H100 80GB HBM3, 9.0, 81559, 1980\n")

    monkeypatch.setattr(devices.subprocess, "run", fake_run)
    p = get_profile("host")
    assert isinstance(p, DeviceProfile) and p.name == "host" and p.compute_capability == "9.0"
    assert p.description.startswith("NVIDIA H100") and not p.is_jetson and p.memory_gb == pytest.approx(79.6, abs=0.1)
