"""What the stand-in backends share: one execute() that runs a dynamic batch as one call, as the C++ backends do.

The harness copies this file beside each stand-in's model.py (the Python backend puts that folder on sys.path).
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

#: a folder set by TritonServer(hold_loads=...): while it holds a file named ``hold``, every model's load waits there
HOLD_LOADS = "DEPLOYTK_STANDIN_HOLD_LOADS"


def wait_while_held(model: str) -> None:
    """For a test that stops the server mid-load: say that this model's load began (``<model>.loading`` in the folder),
    then wait while the ``hold`` file is there. Without the variable, nothing."""
    folder = os.environ.get(HOLD_LOADS)
    if not folder:
        return
    (Path(folder) / f"{model}.loading").touch()
    while (Path(folder) / "hold").exists():
        time.sleep(0.05)


class BatchedModel:
    """A Triton Python model that concatenates the requests of a dynamic batch, runs them once and splits the result."""

    default_file = ""

    def load(self, path):
        """(a function from {input name: array} to the outputs in ``self.output_names`` order, {input name: shape},
        {output name: shape}); a shape lists ints, -1 where the model leaves the size open."""
        raise NotImplementedError

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        wait_while_held(self.name)
        self.input_names = [t["name"] for t in config["input"]]
        self.output_names = [t["name"] for t in config["output"]]
        file = config.get("default_model_filename") or self.default_file
        path = Path(args["model_repository"]) / args["model_version"] / file
        if not path.is_file():
            raise pb_utils.TritonModelException(f"{path} does not exist: the {self.default_file} this backend loads")
        self.run, inputs, outputs = self.load(path)
        batch = [-1] if config.get("max_batch_size", 0) > 0 else []
        for kind, tensors, found in (("input", config["input"], inputs), ("output", config["output"], outputs)):
            check_tensors(self.name, kind, {t["name"]: batch + [int(d) for d in t["dims"]] for t in tensors}, found, path)

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


def check_tensors(model: str, kind: str, configured: dict, found: dict, path) -> None:
    """The config's tensors are the model file's, with the same rank and every fixed size equal: what the C++ backends
    check when they load a model (a config that disagrees with its model file fails to load, naming the tensor)."""
    if sorted(configured) != sorted(found):
        raise pb_utils.TritonModelException(
            f"model '{model}': the configuration's {kind}s {sorted(configured)} are not the model file's {kind}s {sorted(found)} ({path})"
        )
    for name, want in configured.items():
        have = found[name]
        if len(want) != len(have) or any(w != h and -1 not in (w, h) for w, h in zip(want, have, strict=False)):
            raise pb_utils.TritonModelException(
                f"model '{model}', {kind} '{name}': the model file has shape {have} but the configuration specifies {want} "
                f"(-1: any size; the first is the batch dimension when max_batch_size > 0) ({path})"
            )
