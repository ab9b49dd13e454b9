"""Deterministic weights and images that do not depend on timm's or torch's init code."""

from __future__ import annotations

import numpy as np
import torch


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


#: the seeded CLIP tower VisionZip's official outputs were recorded on (scripts/record_visionzip_official.py):
#: LLaVA-1.5's geometry (336 px, patch 14: 576 patches), small width and depth
VISIONZIP_TOWER = dict(image_size=336, patch_size=14, hidden_size=64, num_attention_heads=2, num_hidden_layers=4, intermediate_size=128)
#: output tokens -> (dominant incl. the class token, contextual), as VisionZip's README and configs set them for LLaVA-1.5
VISIONZIP_BUDGETS = {64: (54, 10), 128: (108, 20), 192: (162, 30)}
