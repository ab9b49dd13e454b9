"""Shared helpers: deterministic weights that do not depend on timm's or torch's init code."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "2")


def seeded_init(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter from numpy's generator (norm weights around 1, the rest ~N(0, 0.05))."""
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            values = rng.standard_normal(tuple(p.shape)).astype(np.float32) * 0.05
            if "norm" in name and name.endswith("weight"):
                values += 1.0
            p.copy_(torch.from_numpy(values))
    return model.eval()


def official_learned_layout(method: str, dim: int, counts: list[int]) -> dict[str, tuple[int, ...]]:
    """The learned layers' checkpoint keys and shapes, as "Which Tokens to Use?"'s model classes name them
    (``models/dyvit.py``, ``patchmerger.py``, ``sit.py``, ``sinkhorn.py``, ``dpcknn.py``), written out here by hand so that
    tests do not take them from deploytk. ``counts``: the tokens out of each reducing layer."""
    layout = {}
    for s, k in enumerate(counts):
        if method == "dynamicvit":
            p = f"score_predictor.{s}"
            layout |= {f"{p}.in_conv.0.weight": (dim,), f"{p}.in_conv.0.bias": (dim,)}
            layout |= {f"{p}.in_conv.1.weight": (dim, dim), f"{p}.in_conv.1.bias": (dim,)}
            for j, (o, i) in zip((0, 2, 4), [(dim // 2, dim), (dim // 4, dim // 2), (2, dim // 4)], strict=True):
                layout |= {f"{p}.out_conv.{j}.weight": (o, i), f"{p}.out_conv.{j}.bias": (o,)}
        elif method == "patchmerger":
            p = f"cluster_layers.{s}"
            layout |= {f"{p}.norm.weight": (dim,), f"{p}.norm.bias": (dim,), f"{p}.queries": (k, dim)}
        elif method == "sit":
            p = f"cluster_layers.{s}"
            layout |= {f"{p}.weight.0.weight": (dim,), f"{p}.weight.0.bias": (dim,)}
            layout |= {f"{p}.weight.1.weight": (dim // 2, dim), f"{p}.weight.1.bias": (dim // 2,)}
            layout |= {f"{p}.weight.3.weight": (k, dim // 2), f"{p}.weight.3.bias": (k,), f"{p}.scale": (1, 1, 1)}
        elif method == "sinkhorn":
            layout |= {f"cluster_layers.{s}.v": (k, dim)}
        elif method == "dpcknn":  # without --equal_weight: the CTM module's token score
            layout |= {f"cluster_layers.{s}.score.weight": (1, dim), f"cluster_layers.{s}.score.bias": (1,)}
        else:
            raise ValueError(method)
    return layout


def seeded_learned_state(layout: dict[str, tuple[int, ...]], seed: int = 3) -> dict[str, torch.Tensor]:
    """Deterministic values for a learned layout: LayerNorm weights and SiT's scale around 1, matrices
    ~N(0, 1/fan_in) (activations keep their scale), biases ~N(0, 0.05), Sinkhorn's centres ~N(0, 1)."""
    rng = np.random.default_rng(seed)
    state = {}
    for key, shape in sorted(layout.items()):
        values = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 1 and key.endswith(("in_conv.0.weight", "norm.weight", "weight.0.weight")):
            values = 1.0 + 0.05 * values
        elif key.endswith(".scale"):
            values = 1.0 + 0.1 * values
        elif key.endswith((".weight", ".queries")):
            values = values / np.sqrt(shape[-1])
        elif key.endswith(".bias"):
            values = 0.05 * values
        state[key] = torch.from_numpy(values)
    return state


def seeded_images(n: int, img: int = 224, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((n, 3, img, img)).astype(np.float32))


def digits_config(stem: str, **overrides):
    """A config of export_configs/ with its checkpoint path made absolute (tests may run from anywhere)."""
    from pathlib import Path

    from deploytk.config import apply_overrides, load_config

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "export_configs" / f"{stem}.yaml")
    overrides = {"checkpoint": str(root / cfg.checkpoint) if cfg.checkpoint else None, **overrides}
    return apply_overrides(cfg, **overrides)


def export_config(stem: str, out, **overrides):
    """Export export_configs/<stem>.yaml (with overrides) to ``out`` and return ``out``."""
    from deploytk.export.pipeline import run_export

    run_export(digits_config(stem, **overrides), out)
    return out


def tome_model(vit, r_spec, prop_attn: bool = True):
    """ToMe on ``vit`` at ``r_spec`` (int, per-block list or (r, inflection)): the reference most tests use."""
    from deploytk.merging.merged_vit import build_merged
    from deploytk.methods import get_method

    method = get_method("tome")
    return build_merged(method, vit, r_spec, prop_attn, method.parse_options({}))


def assert_every_deploytk_node_builds_as_a_plugin(model):
    """What `deploytk build` hands TensorRT: every deploytk node a plugin node, its types among those the plugin declares."""
    import onnx
    from deploytk_plugins.tensorrt_plugins import PLUGIN_OPS, type_combinations
    from onnx import TensorProto

    from deploytk.build.graph import prepare_for_build
    from deploytk.build.options import BuildOptions

    prepared, used = prepare_for_build(model, BuildOptions(), PLUGIN_OPS)
    nodes = [n for n in prepared.graph.node if n.domain == "deploytk"]
    assert used == sorted({n.op_type for n in nodes})
    assert all(any(a.name == "plugin_namespace" for a in n.attribute) for n in nodes)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}
    trt_name = {TensorProto.FLOAT: "FP32", TensorProto.FLOAT16: "FP16", TensorProto.BFLOAT16: "BF16", TensorProto.INT64: "INT64"}
    for n in nodes:
        assert ", ".join(trt_name[types[t]] for t in [*n.input, *n.output]) in type_combinations(n.op_type), n.op_type


def has_gpu() -> bool:
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    from deploytk.optional import tensorrt_version

    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; none is visible to torch on this machine")
    skip_trt = pytest.mark.skip(reason="needs TensorRT (libnvinfer), which is not installed here")
    for item in items:
        if "gpu" in item.keywords and not has_gpu():
            item.add_marker(skip_gpu)
        if "trt" in item.keywords and tensorrt_version() is None:
            item.add_marker(skip_trt)


def snapshot(root) -> dict:
    """Every entry under ``root`` (and root itself): kind, mode, mtime and bytes; what "the file system is unchanged" means."""
    import stat
    from pathlib import Path

    root = Path(root)
    entries = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        data = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        entries[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_mode, st.st_mtime_ns, data)
    return entries
