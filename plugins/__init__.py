"""TensorRT plugins for the deploytk custom ops.

``plugins.aot`` compiles the Triton kernels of ``deploytk.kernels`` to PTX ahead of time
(``deploytk plugins compile``); ``plugins.tensorrt_plugins`` registers them with TensorRT as
quickly-deployable AOT plugins (import-guarded: TensorRT is optional). Without a registered
plugin, TensorRT's ONNX parser inlines the node's standard-op function body.
"""
