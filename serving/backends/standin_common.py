"""What the stand-in backends share: one execute() that runs a dynamic batch as one call, as the C++ backends do.

The harness copies this file beside each stand-in's model.py (the Python backend puts that folder on sys.path).
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class BatchedModel:
    """A Triton Python model that concatenates the requests of a dynamic batch, runs them once and splits the result."""

    default_file = ""

    def load(self, path):
        """(a function from {input name: array} to the outputs in ``self.output_names`` order, the model's input names,
        its output names)."""
        raise NotImplementedError

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input_names = [t["name"] for t in config["input"]]
        self.output_names = [t["name"] for t in config["output"]]
        file = config.get("default_model_filename") or self.default_file
        path = Path(args["model_repository"]) / args["model_version"] / file
        if not path.is_file():
            raise pb_utils.TritonModelException(f"{path} does not exist: the {self.default_file} this backend loads")
        self.run, inputs, outputs = self.load(path)
        for kind, config_names, model_names in (("input", self.input_names, inputs), ("output", self.output_names, outputs)):
            if sorted(config_names) != sorted(model_names):  # what the C++ backends check when they load a model
                raise pb_utils.TritonModelException(
                    f"model configuration {kind}s {sorted(config_names)} do not match the model file's {kind}s "
                    f"{sorted(model_names)} ({path})"
                )

    def execute(self, requests):
        feeds = {name: [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests] for name in self.input_names}
        counts = [len(a) for a in feeds[self.input_names[0]]]
        outputs = self.run({name: np.concatenate(arrays) for name, arrays in feeds.items()})
        ends = np.cumsum(counts)
        responses = []
        for end, count in zip(ends, counts, strict=True):
            tensors = [
                pb_utils.Tensor(name, np.ascontiguousarray(out[end - count : end]))
                for name, out in zip(self.output_names, outputs, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
