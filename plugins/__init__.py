"""TensorRT plugins for the deploytk custom ops (TokenMerge, ProportionalAttention).

Not implemented yet: the ONNX nodes already carry plugin_namespace="deploytk" and
plugin_version="1", so once plugins are registered here TensorRT's parser will use them;
without them it inlines the nodes' standard-op function bodies.
"""
