"""`deploytk quantize` with `backend=openvino`: NNCF post-training quantization of the graph OpenVINO reads.

OpenVINO reads the inlined graph (its ONNX reader takes no custom-domain functions, see backends/openvino_backend.py),
so the deploytk ops arrive as plain ops under their own names (``ToMeMatch/...``); NNCF is told to leave those alone
(``ignored_scope``: every deploytk op's body, and every MatMul without a weight), so the same ops as on ONNX Runtime
are int8 (the projections, the MLP, the patch embedding and the head) and the discrete choices, their inputs and the
attention products stay fp32. The result is saved as IR with every TopK stable, as the openvino backend runs graphs.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from deploytk.backends.openvino_backend import fake_quantized_choices, stable_topk
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import BASELINE_DIR, IR_FILE, IR_WEIGHTS_FILE, MODEL_FILE, Artifact
from deploytk.exporter.baseline import quantized_baseline_path
from deploytk.exporter.inline import inline_deploytk_functions
from deploytk.exporter.manifest import sha256_file
from deploytk.exporter.onnx_io import runnable
from deploytk.ops import DOMAIN
from deploytk.optional import nncf_version, openvino_version, require_nncf
from deploytk.quantize.base import Quantizer

SETTINGS = {
    "api": "nncf.quantize",
    "model_type": "TRANSFORMER",
    "preset": "MIXED (NNCF's default for transformers: symmetric weights, asymmetric activations)",
    "weights": "int8, per output channel",
    "activations": "int8, per tensor",
}


def _activation_matmuls(model) -> list[str]:
    """MatMuls whose inputs are both computed (attention products, the matching ops' similarities): kept fp32."""
    names = []
    for node in model.get_ordered_ops():
        if node.get_type_name() == "MatMul":
            if not any(_is_weight(node.input_value(i).get_node()) for i in range(2)):
                names.append(node.get_friendly_name())
    return names


def _is_weight(node) -> bool:
    """A Constant, or a Convert of one (fp16-compressed weights)."""
    if node.get_type_name() == "Constant":
        return True
    return node.get_type_name() == "Convert" and node.input_value(0).get_node().get_type_name() == "Constant"


def quantize_openvino(source: Path, target: Path, batches: list[np.ndarray], keep_choices_fp32: bool = True) -> dict:
    """Quantize the ONNX file ``source`` with NNCF and save the IR at ``target`` (model.xml; model.bin beside it).

    ``keep_choices_fp32=False`` only for the test that shows validation catching a broken quantization: it lets NNCF
    quantize the matching ops' own similarity products."""
    import nncf  # optional: quantize with `backend=openvino` (pip install deploytk[int8])
    import openvino as ov

    proto = onnx.load(str(source))
    ops = sorted({f.name for f in proto.functions if f.domain == DOMAIN})
    if ops:
        proto = inline_deploytk_functions(proto)
    core = ov.Core()
    with runnable(proto) as data:
        model = core.read_model(io.BytesIO(data) if isinstance(data, bytes) else data)
    stable_topk(model)
    kept = _activation_matmuls(model)
    patterns = [f"^{op}/.*" for op in ops]
    if not keep_choices_fp32:
        kept = [name for name in kept if "Match/" not in name and "Select/" not in name]
        patterns = [p for p in patterns if "Match" not in p and "Select" not in p]
    items = [batch[i : i + 1] for batch in batches for i in range(len(batch))]
    nncf.set_log_level(logging.WARNING)  # its INFO lines list every node it skips, on stdout
    with contextlib.redirect_stdout(sys.stderr):  # its progress bars: stdout is the CLI's JSON's
        quantized = nncf.quantize(
            model,
            nncf.Dataset(items),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(items),
            ignored_scope=nncf.IgnoredScope(names=kept, patterns=patterns, validate=False),
        )
    stable_topk(quantized)
    found = fake_quantized_choices(quantized) if keep_choices_fp32 else []
    if found:
        raise DeploytkError("internal: NNCF quantized inputs of the matching ops: " + ", ".join(found[:4]))
    ov.save_model(quantized, str(target), compress_to_fp16=False)
    fq_users = Counter(
        user.get_node().get_type_name()
        for node in quantized.get_ordered_ops()
        if node.get_type_name() == "FakeQuantize"
        for user in node.output(0).get_target_inputs()
        if user.get_node().get_type_name() in ("MatMul", "Convolution")
    )
    return {"fake_quantize_nodes": sum(fq_users.values()), "quantized_ops": dict(fq_users)}


class NncfQuantizer(Quantizer):
    """model.xml / model.bin (int8 IR) beside a copy of the fp32 model.onnx (the tensor names validate probes), and the dense
    baseline quantized the same way as DIR/.baseline/dense-<sha>.xml."""

    name = backend = "openvino"
    settings = SETTINGS

    def require(self) -> None:
        require_nncf("quantize with `backend=openvino`")

    def tool(self) -> str:
        return f"nncf {nncf_version()} on openvino {openvino_version()}"

    def check(self, source: Artifact) -> None:
        proto = onnx.load(str(source.onnx_path), load_external_data=False)
        loops = sorted({f.name for f in proto.functions if any(n.op_type == "Loop" for n in f.node)})
        loops += ["the graph"] if any(n.op_type == "Loop" for n in proto.graph.node) else []
        if loops:  # NNCF 3.4's OpenVINO graph builder looks for a Loop's body nodes in the outer graph and stops
            raise DeploytkError(
                f"NNCF cannot quantize {source.directory}: it has Loop ops ({', '.join(loops)}), whose bodies NNCF's OpenVINO "
                'graph builder does not take ("Could not find a node ... in NNCFGraph").',
                hint="Quantize it for ONNX Runtime instead (`backend=ort`), or choose a method without iterative rounds.",
            )

    def quantize(self, source: Artifact, dense: Path, folder: Path, batches: list[np.ndarray], keep_choices_fp32: bool = True) -> dict:
        shutil.copyfile(source.onnx_path, folder / MODEL_FILE)
        summary = quantize_openvino(source.onnx_path, folder / IR_FILE, batches, keep_choices_fp32)
        quantize_openvino(dense, folder / BASELINE_DIR / quantized_baseline_path(source).with_suffix(".xml").name, batches)
        weights = {"file": IR_WEIGHTS_FILE, "sha256": sha256_file(folder / IR_WEIGHTS_FILE)}
        return summary | {
            "manifest": {
                "openvino_ir": {"file": IR_FILE, "sha256": sha256_file(folder / IR_FILE), "weights": weights},
                "onnx_role": "the fp32 graph model.xml was quantized from (its tensor names are what validate probes)",
            }
        }


OPENVINO = NncfQuantizer()
