"""Triton GPU kernels of the deploytk ops.

The same kernels serve the CUDA implementation of the torch ops (``launch``) and, compiled
ahead of time to PTX, the TensorRT plugins in ``plugins/``. ``deploytk selftest`` holds each
one to the PyTorch reference.
"""
