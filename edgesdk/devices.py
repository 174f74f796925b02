"""Device profiles: the Jetson Orin modules, plus the host's discrete GPU.

A profile drives build limits (TensorRT workspace) and kernel choices (SM count, bandwidth,
tensor throughput). Module figures come from NVIDIA's Jetson Orin module data sheets (SM count,
GPU max clock, memory, bandwidth, DLA cores); peak tensor throughput is derived from them:
dense ops per clock per SM × SMs × clock (Orin's Ampere SMs do 2048 FP16 and 4096 INT8 tensor
ops per clock: 16 SMs × 1.3 GHz → 42.6 TFLOPS FP16, 85.2 TOPS INT8).
"""

from __future__ import annotations

import shutil
import subprocess

from pydantic import BaseModel, ConfigDict

from edgesdk.errors import EdgeSDKError

# Dense FP16 tensor-core FLOPs per clock per SM, by compute capability (INT8 is twice that).
FP16_FLOPS_PER_CLK_SM = {"7.0": 1024, "7.2": 1024, "7.5": 1024, "8.0": 2048, "8.6": 1024, "8.7": 2048,
                         "8.9": 1024, "9.0": 4096, "10.0": 8192, "12.0": 1024}


class DeviceProfile(BaseModel):
    """What edgesdk needs to know about a target GPU.

    Attributes:
        name: Profile name (``orin``, ``orin-nx-16``, ``host`` ...).
        description: Human-readable module name.
        compute_capability: ``"major.minor"``, e.g. ``"8.7"``.
        sm_count: Streaming multiprocessors.
        gpu_clock_mhz: GPU max clock.
        memory_gb: Device (on Jetson: shared CPU/GPU) memory.
        bandwidth_gbs: Peak DRAM bandwidth in GB/s.
        l2_mb: L2 cache size.
        dla_cores: Deep-learning accelerators (0 where absent).
        workspace_mb: TensorRT builder workspace limit.
        is_jetson: An integrated Jetson module (memory shared with the CPU).
        tensor_int8_tops: Peak dense INT8 tensor-core TOPS (derived, see module docstring).
        tensor_fp16_tflops: Peak dense FP16 tensor-core TFLOPS (derived).
    """

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    compute_capability: str
    sm_count: int
    gpu_clock_mhz: float
    memory_gb: float
    bandwidth_gbs: float
    l2_mb: float
    dla_cores: int
    workspace_mb: int
    is_jetson: bool
    tensor_int8_tops: float | None
    tensor_fp16_tflops: float | None

    @property
    def sm(self) -> int:
        """Compute capability as an int (``87`` for ``"8.7"``)."""
        major, minor = self.compute_capability.split(".")
        return int(major) * 10 + int(minor)


def _make(name: str, description: str, cc: str, sms: int, clock_mhz: float, mem: float, bw: float, l2: float,
          dla: int, workspace_mb: int, is_jetson: bool = True) -> DeviceProfile:
    per_clk = FP16_FLOPS_PER_CLK_SM.get(cc)
    fp16 = round(per_clk * sms * clock_mhz * 1e6 / 1e12, 1) if per_clk else None
    return DeviceProfile(name=name, description=description, compute_capability=cc, sm_count=sms,
                         gpu_clock_mhz=clock_mhz, memory_gb=mem, bandwidth_gbs=bw, l2_mb=l2, dla_cores=dla,
                         workspace_mb=workspace_mb, is_jetson=is_jetson, tensor_fp16_tflops=fp16,
                         tensor_int8_tops=round(2 * fp16, 1) if fp16 else None)


PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in [
        _make("orin", "Jetson AGX Orin 64GB", "8.7", 16, 1300, 64, 204.8, 4, 2, 4096),
        _make("orin-agx-32", "Jetson AGX Orin 32GB", "8.7", 14, 930, 32, 204.8, 4, 2, 2048),
        _make("orin-nx-16", "Jetson Orin NX 16GB", "8.7", 8, 918, 16, 102.4, 2, 2, 2048),
        _make("orin-nx-8", "Jetson Orin NX 8GB", "8.7", 8, 765, 8, 102.4, 2, 1, 1024),
        _make("orin-nano-8", "Jetson Orin Nano 8GB", "8.7", 8, 625, 8, 68.0, 2, 0, 1024),
        _make("orin-nano-4", "Jetson Orin Nano 4GB", "8.7", 4, 625, 4, 34.0, 2, 0, 512),
    ]
}
ALIASES = {"orin-agx-64": "orin", "agx-orin": "orin"}
HOST = "host"


def host_profile() -> DeviceProfile:
    """Profile of GPU 0 of this machine, read through cuda-python, else ``nvidia-smi``.

    Raises:
        EdgeSDKError: no NVIDIA GPU (or no driver) on this machine.
    """
    try:
        return _host_from_cuda()
    except Exception as cuda_err:  # noqa: BLE001 - fall back to nvidia-smi, report both causes
        try:
            return _host_from_smi()
        except Exception as smi_err:  # noqa: BLE001
            raise EdgeSDKError(
                f"device 'host': no NVIDIA GPU found on this machine (cuda-python: {cuda_err}; nvidia-smi: {smi_err}).",
                f"build for a Jetson profile instead (--device {' | '.join(PROFILES)}), or run on a machine "
                "with an NVIDIA GPU, its driver and `pip install edgesdk[gpu]`.",
            ) from None


def _host_from_cuda() -> DeviceProfile:
    from cuda.bindings import driver as cu

    def ok(res):
        err, *vals = res
        if int(err) != 0:
            raise RuntimeError(f"CUDA driver error {int(err)}")
        return vals[0] if len(vals) == 1 else vals

    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(0))
    a = cu.CUdevice_attribute

    def attr(x):
        return int(ok(cu.cuDeviceGetAttribute(x, dev)))

    name = ok(cu.cuDeviceGetName(64, dev)).split(b"\0")[0].decode()
    cc = f"{attr(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)}.{attr(a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)}"
    mem = int(ok(cu.cuDeviceTotalMem(dev))) / 2**30
    bus_bits = attr(a.CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
    mem_khz = attr(a.CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)
    clock_mhz = attr(a.CU_DEVICE_ATTRIBUTE_CLOCK_RATE) / 1000
    integrated = bool(attr(a.CU_DEVICE_ATTRIBUTE_INTEGRATED))
    return _make(HOST, name, cc, attr(a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT), clock_mhz, round(mem, 1),
                 round(2 * mem_khz * 1e3 * bus_bits / 8 / 1e9, 1), attr(a.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE) / 2**20,
                 0, min(8192, int(mem * 1024 / 4)), is_jetson=integrated)


def _host_from_smi() -> DeviceProfile:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise RuntimeError("nvidia-smi not found")
    out = subprocess.run([exe, "--query-gpu=name,compute_cap,memory.total,clocks.max.sm", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    name, cc, mem_mib, clock = [s.strip() for s in out.split(",")]
    mem = float(mem_mib) / 1024
    # nvidia-smi reports neither SM count nor bandwidth: 0 marks "unknown" (install cuda-python for them).
    return _make(HOST, name, cc, 0, float(clock), round(mem, 1), 0.0, 0.0, 0, min(8192, int(mem * 1024 / 4)),
                 is_jetson=False)


def get_profile(name: str) -> DeviceProfile:
    """The profile called ``name`` (``host`` probes this machine's GPU).

    Raises:
        EdgeSDKError: unknown name (the message lists the valid ones), or ``host`` without a GPU.
    """
    key = ALIASES.get(name.lower(), name.lower())
    if key == HOST:
        return host_profile()
    if key not in PROFILES:
        raise EdgeSDKError(f"unknown device {name!r}.",
                           f"use one of: {', '.join([*PROFILES, HOST])} (`edgesdk devices` lists them).")
    return PROFILES[key]
