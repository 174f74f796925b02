"""edgesdk.Engine with device arrays (``__cuda_array_interface__``) on a GPU machine (ONNX Runtime backend)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgesdk.errors import EdgeSDKError
from edgesdk.runtime import Engine

pytestmark = pytest.mark.gpu


def test_device_array_inputs(tmp_path):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    w = rng.standard_normal((11, 6)).astype(np.float32)
    x_vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 11])
    y_vi = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 6])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x_vi], [y_vi],
                          [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), tmp_path / "m.onnx")
    x = rng.standard_normal((5, 11)).astype(np.float32)
    side = torch.cuda.Stream()
    with Engine(tmp_path / "m.onnx", backend="onnxruntime") as eng:
        with torch.cuda.stream(side):  # produced on a side stream still running: its CAI names it
            big = torch.randn(4096, 4096, device="cuda") @ torch.randn(4096, 4096, device="cuda")
            xd = torch.from_numpy(x).cuda(non_blocking=True) + 0 * big[:5, :11]
            y = eng.infer({"x": xd})["y"]
        np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-5, atol=1e-5)
        y2 = eng.infer({"x": torch.from_numpy(x).cuda()})["y"]  # default stream
        np.testing.assert_allclose(y2, y, rtol=0, atol=0)
        with pytest.raises(EdgeSDKError, match="not C-contiguous"):
            eng.infer({"x": torch.from_numpy(np.ascontiguousarray(x.T)).cuda().T})
        with pytest.raises(EdgeSDKError, match="float16"):
            eng.infer({"x": xd.half()})
