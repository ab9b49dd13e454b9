"""TensorRT engine building: build options, the ONNX prepared per plugin/native choice, the engine manifest."""
