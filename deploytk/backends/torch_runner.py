"""A Polygraphy runner for a PyTorch module, so the reference plugs into Polygraphy's Comparator."""

from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np
import torch
from polygraphy.backend.base import BaseRunner
from polygraphy.common import TensorMetadata

from deploytk.export.onnx_export import INPUT_NAME, OUTPUT_NAME


class TorchRunner(BaseRunner):
    def __init__(self, model: torch.nn.Module, img_size, name: str = "pytorch-reference"):
        super().__init__(name=name, prefix="torch-runner")
        self.model = model.eval()
        self.img_size = tuple(img_size)

    def get_input_metadata_impl(self):
        return TensorMetadata().add(INPUT_NAME, dtype=np.float32, shape=("batch", 3, *self.img_size))

    def activate_impl(self):
        pass

    def deactivate_impl(self):
        pass

    def infer_impl(self, feed_dict):
        start = time.perf_counter()
        with torch.no_grad():
            out = self.model(torch.from_numpy(np.ascontiguousarray(feed_dict[INPUT_NAME])))
        self.inference_time = time.perf_counter() - start
        return OrderedDict([(OUTPUT_NAME, out.numpy())])
