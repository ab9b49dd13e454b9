"""Stand-in for Triton's C++ onnxruntime backend, run by Triton's Python backend (a "Python-based backend").

Triton loads this file for every model whose config says ``backend: "onnxruntime"``, so a repository that
`deploytk package` wrote loads unchanged. It runs the version folder's model file with ONNX Runtime's
Python API on the CPU. Everything around it is the real server: config parsing, the HTTP/gRPC front ends,
the shape, dtype and name checks of each request, the dynamic batcher and its statistics.
"""

from standin_common import BatchedModel


class TritonPythonModel(BatchedModel):
    default_file = "model.onnx"

    def load(self, path):
        import onnxruntime  # the serving environment's, not the server's

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        run = lambda feeds: session.run(self.output_names, feeds)  # noqa: E731

        def shapes(tensors):
            return {t.name: [d if isinstance(d, int) else -1 for d in t.shape] for t in tensors}

        return run, shapes(session.get_inputs()), shapes(session.get_outputs())
