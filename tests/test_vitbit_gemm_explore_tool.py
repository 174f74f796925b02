"""tools/vitbit_gemm_explore.py on the CPU: the Orin residency model and the timing-only (no epilogue) source."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import vitbit_gemm_explore  # noqa: E402


@pytest.fixture(scope="module")
def tool():
    return vitbit_gemm_explore


def test_orin_blocks_per_sm(tool):
    """Blocks an sm_87 SM holds: 164 KB of shared memory (+1 KB per block), 64 K registers in 256-register warp
    units, 1536 threads, 16 blocks. Figures for the persistent kernels at round 7 (registers from nvcc 13.0)."""
    kb = 1024
    assert tool.orin_blocks(128, 256, 96 * kb) == 1  # tp_128x128: shared memory (two would need 194 KB)
    assert tool.orin_blocks(255, 128, 64 * kb) == 2  # tp_128x128w4s2: 2 x 65 KB, 2 x 32 K registers
    assert tool.orin_blocks(231, 128, 96 * kb) == 1  # tp_128x128w4
    assert tool.orin_blocks(168, 128, 72 * kb) == 2  # tp_64x128: shared memory (three by registers)
    assert tool.orin_blocks(122, 128, 64 * kb) == 2  # tp_64x64
    assert tool.orin_blocks(255, 256, 144 * kb) == 1  # tp_256x128
    assert tool.orin_blocks(32, 1024, 0) == 1  # threads: 1536 // 1024
    assert tool.orin_blocks(16, 32, 0) == 16  # the block limit
    assert tool.orin_blocks(255, 256, 0) == 1  # registers: 8 warps x 8192 = 64 K
    assert tool.orin_blocks(64, 128, 200 * kb) == 0  # does not fit at all


def test_ablated_source_skips_exactly_the_persistent_epilogue(tool):
    src = (ROOT / "plugins" / "vitbit_gemm" / "vitbit_gemm.cu").read_text()
    out = tool.ablated_source(src)
    assert out.count("if (o.M < 0) regs_epilogue_any") == 1
    assert len(out) == len(src) + len("if (o.M < 0) ")
    with pytest.raises(RuntimeError, match="not found once"):
        tool.ablated_source(src.replace("regs_epilogue_any", "renamed_epilogue"))


def test_parse_shapes(tool):
    assert tool.parse_shapes("768:2304,384:384,") == [(768, 2304), (384, 384)]
    for bad in ("768x2304", "768:", "0:384", ""):
        with pytest.raises(SystemExit):
            tool.parse_shapes(bad)
