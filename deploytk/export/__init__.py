"""ONNX export: the merged reference -> one ONNX file with deploytk custom ops + a manifest."""
