"""TensorRT integration: Python plugins (``IPluginV3``), plugin registration, engine build.

* :func:`edgesdk.trt.registry.register_plugins`: register every plugin creator (call before
  parsing and before deserializing; the build and ``edgesdk.Engine`` do it themselves).
* :func:`edgesdk.trt.engine.build_engine`: ONNX → ``model.plan`` (strongly typed).
* :mod:`edgesdk.trt._logic`: the plugins' shape/dtype/format/field/tactic logic, TensorRT-free.
* :mod:`edgesdk.trt.plugins`: the ``IPluginV3`` / ``IPluginCreatorV3One`` classes (need TensorRT).

Importing this package never imports TensorRT.
"""
