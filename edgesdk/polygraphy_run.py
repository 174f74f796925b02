"""``polygraphy run`` extension: run edgesdk build folders' models with Polygraphy.

A processed ``model.onnx`` holds plugin nodes (domain ``edgesdk``) that neither plain ONNX Runtime nor
TensorRT's ONNX parser know by themselves, so ``polygraphy run model.onnx --onnxrt`` fails with
"edgesdk:EdgeBitmapLinear(-1) is not a registered function/op". Installing edgesdk registers this module
under Polygraphy's ``polygraphy.run.plugins`` entry point, which adds two runners to ``polygraphy run``:

``--edgesdk-onnxrt``
    ONNX Runtime on the CPU through :func:`edgesdk.ort.make_session`: graph optimizations off (as
    ``edgesdk build`` verifies) and the plugin nodes running edgesdk's numpy reference ops.
``--edgesdk-trt``
    Polygraphy's TensorRT runner (every ``--trt`` option applies) with edgesdk's TensorRT plugin creators
    registered before the model is parsed. Processed models are in explicit Q/DQ form: add
    ``--strongly-typed``, as ``edgesdk build`` builds them.

For example, on the Jetson::

    polygraphy run out/digits/model.onnx --edgesdk-trt --strongly-typed --edgesdk-onnxrt

and on any machine, against the original model's outputs::

    polygraphy run model.onnx --onnxrt --save-outputs ref.json
    polygraphy run out/digits/model.onnx --edgesdk-onnxrt --load-outputs ref.json \
        --check-error-stat mean --atol 0.1 --rtol 0.1    # as `edgesdk build` judges (INT8 vs float)

Both runners take the model given to ``polygraphy run``; ``--onnx-outputs`` and the other ONNX loader
options apply to ``--edgesdk-onnxrt`` as they do to ``--onnxrt``.
"""

from __future__ import annotations

from polygraphy import util
from polygraphy.backend.base import BaseLoader
from polygraphy.logger import G_LOGGER
from polygraphy.tools.args import ModelArgs, OnnxLoadArgs, TrtRunnerArgs
from polygraphy.tools.args.base import BaseRunnerArgs
from polygraphy.tools.script import make_invocable


class SessionFromEdgeOnnx(BaseLoader):
    """An ONNX Runtime session for a model that may hold edgesdk plugin nodes (:func:`edgesdk.ort.make_session`).

    Args:
        model (Union[str, bytes, onnx.ModelProto, Callable]): A path, the model, or a loader returning one.
        threads (int): ONNX Runtime intra-op threads; default ONNX Runtime's.
    """

    def __init__(self, model, threads: int | None = None):
        self._model = model
        self._threads = threads

    def call_impl(self):
        from edgesdk.ort import make_session

        model, _ = util.invoke_if_callable(self._model)
        return make_session(model, self._threads)


def register_trt_plugins() -> list[str]:
    """:func:`edgesdk.trt.registry.register_plugins`, failing as Polygraphy fails (a message, no traceback)."""
    from edgesdk.errors import EdgeSDKError
    from edgesdk.trt.registry import register_plugins

    try:
        return register_plugins()
    except EdgeSDKError as e:
        G_LOGGER.critical(f"--edgesdk-trt: {e.problem}\n  fix: install TensorRT >= 10.3 (JetPack 6.1+ ships it) "
                          "and run this again, or leave --edgesdk-trt out and run --edgesdk-onnxrt alone")


class EdgeOnnxrtRunnerArgs(BaseRunnerArgs):
    """
    ONNX-Runtime with edgesdk ops: running models with edgesdk plugin nodes on ONNX Runtime (CPU).

    Depends on:

        - ModelArgs
        - OnnxLoadArgs
    """

    def get_name_opt_impl(self):
        return "ONNX-Runtime (edgesdk ops)", "edgesdk-onnxrt"

    def add_to_script_impl(self, script):
        if self.arg_groups[OnnxLoadArgs].must_use_onnx_loader():
            model = self.arg_groups[OnnxLoadArgs].add_to_script(script, serialize_model=True)
        else:
            model = self.arg_groups[ModelArgs].path
        script.add_import(imports=["SessionFromEdgeOnnx"], frm="edgesdk.polygraphy_run")
        script.add_import(imports=["OnnxrtRunner"], frm="polygraphy.backend.onnxrt")
        session = script.add_loader(make_invocable("SessionFromEdgeOnnx", model), "build_edgesdk_onnxrt_session")
        script.add_runner(make_invocable("OnnxrtRunner", session))


class EdgeTrtRunnerArgs(BaseRunnerArgs):
    """
    TensorRT with edgesdk plugins: Polygraphy's TensorRT runner, edgesdk's plugin creators registered first.

    Depends on:

        - TrtRunnerArgs
    """

    def get_name_opt_impl(self):
        return "TensorRT (edgesdk plugins)", "edgesdk-trt"

    def add_to_script_impl(self, script):
        # runs where the script defines its loaders, before any runner parses the model
        script.add_import(imports=["register_trt_plugins"], frm="edgesdk.polygraphy_run")
        script.add_loader(make_invocable("register_trt_plugins"), "edgesdk_plugins")
        self.arg_groups[TrtRunnerArgs].add_to_script_impl(script)


def export_argument_groups():
    """The ``polygraphy.run.plugins`` entry point (``pyproject.toml``)."""
    return [EdgeOnnxrtRunnerArgs(), EdgeTrtRunnerArgs()]
