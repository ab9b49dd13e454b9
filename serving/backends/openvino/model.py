"""Stand-in for Triton's C++ openvino backend, run by Triton's Python backend (a "Python-based backend").

Triton loads this file for every model whose config says ``backend: "openvino"``. It compiles the version
folder's IR (``model.xml`` + ``model.bin``) with OpenVINO's Python API on the CPU, as the real backend
does with its C++ API; the server around it is the real one.
"""

from standin_common import BatchedModel


class TritonPythonModel(BatchedModel):
    default_file = "model.xml"

    def load(self, path):
        import openvino  # the serving environment's, not the server's

        compiled = openvino.Core().compile_model(str(path), "CPU")
        request = compiled.create_infer_request()

        def run(feeds):
            results = request.infer(feeds)
            return [results[compiled.output(name)] for name in self.output_names]

        def name(port, wanted):  # a tensor may carry several names; the one the config uses, if it is among them
            return next((n for n in wanted if n in port.get_names()), port.get_any_name())

        def shapes(ports, wanted):
            return {name(p, wanted): [d.get_length() if d.is_static else -1 for d in p.get_partial_shape()] for p in ports}

        return run, shapes(compiled.inputs, self.input_names), shapes(compiled.outputs, self.output_names)
