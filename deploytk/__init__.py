"""deploytk: deploy token-merging Vision Transformers (ToMe and kin) to ONNX Runtime and TensorRT."""

__version__ = "0.1.0"
