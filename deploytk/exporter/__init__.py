"""ONNX export: the merged reference -> one ONNX file with deploytk custom ops + a manifest (``pipeline``);
``Artifact`` opens an export again; ``baseline`` exports the same weights unmerged."""
