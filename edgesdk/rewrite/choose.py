"""Which kernel runs each linear: the ``--kernels auto|bitmap|vitbit|none`` rule.

``auto`` picks, per layer:

1. **bitmap** (``EdgeBitmapLinear``) when the layer is *decode-style and memory-bound* and pruned
   to at least :data:`BITMAP_MIN_SPARSITY`: its expected rows per call ``M`` (the product of the
   activation's leading dims when the model runs at the build shape, ``--shape``, an unset dynamic batch
   being 1: one image, or the new tokens of one call, 1 for a decoder with a KV cache built at
   ``input_ids:1x1``) is at most :data:`DECODE_MAX_M` (the bitmap kernel's GEMV regime) **and** reading the
   dense weights takes longer than the dense math on the device (roofline with the
   :class:`~edgesdk.devices.DeviceProfile`'s bandwidth and peak throughput). Below 30 % sparsity
   the bitmap bytes are ≥ 0.85 of dense fp16 and the decode overhead eats the gain.
2. **vitbit** (``EdgeVitBitGemm``) when the layer is an INT8 Q/DQ linear (int8 symmetric
   per-channel weights, symmetric int8 per-tensor activation scale) that is not decode-style:
   the quantized ViT linears (``M`` = tokens ≥ 17).
3. **none** otherwise, with the reason in the report.

``bitmap`` and ``vitbit`` force that kernel on every layer that can take it; layers that cannot
(e.g. a float linear under ``vitbit``) keep their original nodes and get a reason.

**Measured choice** (``measure``, :func:`measure_plan`): the rule above only says where a plugin
*can* win. Where it loses depends on the GPU (launch latency, SMs, bandwidth, layer size), so
when the build runs on the target GPU (a Jetson building its own engine, as TensorRT requires, or
``--device host``), ``auto`` times each plugin candidate against the dense layer it replaces
(``edgesdk.kernels.<op>.measure_vs_dense``: our kernel vs cuBLAS — fp16, and INT8 for INT8 Q/DQ layers)
and keeps the dense layer unless the plugin is ``MEASURE_MARGIN`` faster (:func:`decide_measured`) — TensorRT's own
timing-based tactic choice, extended to the plugin-or-not decision. The times go into the report.
"""

from __future__ import annotations

from dataclasses import dataclass

KERNELS = ("auto", "bitmap", "vitbit", "none")
MEASURE = ("auto", "on", "off")
# The plugin must beat the dense layer by 2 % in the build's timing: near-ties keep the dense layer. Set
# from tools/bitmap_linear_autochoice.py on an H100 (2026-11-22T10:11Z, bench/results/bitmap_linear_autochoice.json):
# with no margin, 3 of the 88 bitmap picks were below 0.95x (0.83-0.93x) of cuBLAS fp16 in the independent
# benchmark run (all on layers of <= 1.8 MB, where one call takes ~5 us and two timing runs differ by up to ~15 %).
MEASURE_MARGIN = 1.02
BITMAP_MIN_SPARSITY = 0.3
DECODE_MAX_M = 16


@dataclass
class LayerFacts:
    """What the chooser needs to know about one linear.

    Attributes:
        name: Layer name.
        k: Input features.
        n: Output features.
        m: Expected rows per call (see module doc).
        int8_weights: Weights are symmetric int8 per output channel (or per tensor).
        int8_act: The activation goes through a symmetric int8 per-tensor Q/DQ pair.
        sparsity: Fraction of zero weights after pruning.
        weight_problem: Why int8 weights cannot be packed as they are, or None.
    """

    name: str
    k: int
    n: int
    m: int
    int8_weights: bool
    int8_act: bool
    sparsity: float
    weight_problem: str | None = None


def memory_bound(f: LayerFacts, device) -> bool:
    """Roofline: do the dense weight + activation bytes take longer than the dense math on ``device``?

    Uses the :class:`~edgesdk.devices.DeviceProfile`'s ``bandwidth_gbs`` and peak dense tensor
    throughput (``tensor_int8_tops`` for INT8 layers, ``tensor_fp16_tflops`` otherwise). Without a
    profile (or its figures) every decode-style layer counts as memory-bound, which holds on every
    GPU at M <= 16.
    """
    int8 = f.int8_weights and f.int8_act
    bw = getattr(device, "bandwidth_gbs", None)
    peak = getattr(device, "tensor_int8_tops" if int8 else "tensor_fp16_tflops", None)
    if not bw or not peak:
        return True
    wbytes = f.n * f.k * (1 if f.int8_weights else 2)
    abytes = f.m * (f.k + f.n) * 2
    t_mem = (wbytes + abytes) / (bw * 1e9)
    t_math = 2.0 * f.m * f.n * f.k / (peak * 1e12)
    return t_mem > t_math


def choose(f: LayerFacts, kernels: str, device) -> tuple[str, str | None]:
    """``(kernel, reason)``: kernel is ``bitmap``, ``vitbit`` or ``none``; reason is None when chosen."""
    can_vitbit = f.int8_weights and f.int8_act and f.weight_problem is None
    vitbit_why = (f.weight_problem or "vitbit needs an INT8 Q/DQ linear (int8 symmetric weights and a symmetric "
                  "int8 activation Q/DQ); quantize the model first")
    if kernels == "none":
        return "none", "--kernels none"
    if kernels == "bitmap":
        return "bitmap", None
    if kernels == "vitbit":
        return ("vitbit", None) if can_vitbit else ("none", vitbit_why)
    decode = f.m <= DECODE_MAX_M
    if decode and f.sparsity >= BITMAP_MIN_SPARSITY and memory_bound(f, device):
        return "bitmap", None
    if can_vitbit and not decode:
        return "vitbit", None
    if decode and f.sparsity < BITMAP_MIN_SPARSITY:
        return "none", (f"auto: M={f.m} row{'s' if f.m != 1 else ''} per call (memory-bound, as in LLM decode) but "
                        f"sparsity {f.sparsity:.2f} < {BITMAP_MIN_SPARSITY}: the dense kernel reads fewer bytes")
    if decode:
        return "none", f"auto: M={f.m} is compute-bound on this device: the dense kernel is faster"
    if f.weight_problem:  # a Q/DQ layer whose weights the plugins cannot take as they are
        return "none", f"auto: {f.weight_problem}: TensorRT's dense kernels"
    if not (f.int8_weights and f.int8_act):
        what = "an activation without a symmetric int8 per-tensor Q/DQ" if f.int8_weights else "float linear"
        return "none", f"auto: {what} with M={f.m} rows per call: TensorRT's dense kernels"
    return "none", f"auto: {vitbit_why}"


def measure_plan(mode: str, device, host) -> tuple[bool, str]:
    """Whether ``auto`` times its plugin candidates on this machine's GPU: ``(measure, note)``.

    Args:
        mode: ``auto`` (measure when this machine's GPU is the target: ``device`` is ``host``, or the
            same compute capability and SM count as the profile), ``on`` (measure on whatever GPU is
            here, with a note when it is not the target), ``off``.
        device: Target :class:`~edgesdk.devices.DeviceProfile` (or None).
        host: Profile of this machine's GPU, or None when there is none.

    Raises:
        EdgeSDKError: ``on`` without a GPU.
    """
    from edgesdk.errors import EdgeSDKError

    if mode not in MEASURE:
        raise EdgeSDKError(f"unknown --measure {mode!r}", f"use one of {', '.join(MEASURE)}")
    if mode == "off":
        return False, "--measure off: static rule"
    target = getattr(device, "name", None)
    if host is None or not getattr(host, "sm_count", 0):
        if mode == "on":
            raise EdgeSDKError("--measure on needs an NVIDIA GPU on this machine (none answers through cuda-python)",
                               "build on the target device (e.g. the Jetson), or use --measure auto/off")
        return False, (f"not measured: no GPU here, so the static rule decides; build on the {target or 'target'} "
                       "device to time each layer against dense")
    same = target == "host" or (host.compute_capability == getattr(device, "compute_capability", None)
                                and host.sm_count == getattr(device, "sm_count", None))
    if same:
        return True, f"measured on this GPU ({host.description}, {host.sm_count} SMs)"
    if mode == "on":
        return True, (f"measured on {host.description} ({host.sm_count} SMs), which is NOT the target "
                      f"{target}: the choice may differ there")
    return False, (f"not measured: this GPU ({host.description}, {host.sm_count} SMs) is not the target {target}, "
                   "so the static rule decides; build on the target, or --measure on to time here anyway")


def decide_measured(meas: dict, margin: float = MEASURE_MARGIN) -> tuple[str, str | None]:
    """``(kernel, reason)`` from a ``measure_vs_dense`` result (``edgesdk.kernels.bitmap_linear`` or
    ``edgesdk.kernels.vitbit_gemm``; ``meas["plugin"]`` names it, default ``bitmap``): the plugin only if the
    best dense time is at least ``margin`` × its time."""
    plugin = meas.get("plugin", "bitmap")
    b, d = float(meas[f"{plugin}_us"]), float(meas["dense_us"])
    if d >= margin * b:
        return plugin, None
    return "none", (f"auto: measured on {meas.get('gpu', 'this GPU')} at M={meas.get('m')}: {plugin} {b:.1f} µs vs "
                    f"dense {d:.1f} µs ({meas.get('dense', 'cuBLAS')}): the dense layer is faster"
                    + (" or within the margin" if d >= b else ""))
