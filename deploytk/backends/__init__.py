"""Backends that run a model on a batch: PyTorch (reference), ONNX Runtime, TensorRT (guarded)."""

BACKENDS = ("ort", "trt", "torch")
