"""TensorRT plugins for the deploytk custom ops; installed as ``deploytk_plugins``.

``definitions`` holds one plugin definition per op; ``aot`` compiles the ops' Triton kernels
(their own launch plans) to PTX ahead of time (``deploytk plugins compile``);
``tensorrt_plugins`` registers them with TensorRT as quickly-deployable AOT plugins
(import-guarded: TensorRT is optional). Without a registered plugin, TensorRT's ONNX parser
inlines the node's standard-op function body.
"""
