"""A rectangular input (`export.img_size: [H, W]`) exports and validates, with ToMe's token counts as the official code
computes them."""

import pytest

from deploytk.config import config_from_dict
from deploytk.errors import DeploytkError
from deploytk.exporter.pipeline import run_export
from deploytk.models import build_reference
from deploytk.validate.validator import run_validation


def official_tome_tokens(tokens: int, r: int, depth: int, protected: int = 1) -> list[int]:
    """Tokens entering each block under the official ToMe: each block merges min(r, (tokens - protected) // 2)."""
    out = []
    for _ in range(depth):
        out.append(tokens)
        tokens -= min(r, (tokens - protected) // 2)
    return out


def rectangular(**merge):
    export = {"img_size": [224, 320], "batch_size": 2}
    return config_from_dict({"model": "deit_tiny_patch16_224", "model_kwargs": {"depth": 4}, "export": export, "merge": merge})


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_rectangular_input_exports_and_validates(tmp_path):
    cfg = rectangular(method="tome", r=40)
    model = build_reference(cfg)
    assert model.family.grid_size == (14, 20)
    assert model.schedule.tokens == official_tome_tokens(1 + 14 * 20, 40, 4)
    manifest = run_export(cfg, tmp_path / "a")
    assert manifest["model"]["img_size"] == [224, 320] and manifest["inputs"][0]["shape"] == ["batch", 3, 224, 320]
    for backend in ("ort", "openvino"):
        report, _ = run_validation(tmp_path / "a", backend, num_samples=4, batch_size=2)
        assert report.passed, (backend, report.to_dict())


def test_bad_rectangles_are_refused_with_the_reason():
    with pytest.raises(DeploytkError, match=r"`export.img_size.0` = 8: Input should be greater than or equal to 16"):
        config_from_dict({"model": "deit_tiny_patch16_224", "export": {"img_size": [8, 224]}})
    with pytest.raises(DeploytkError, match=r"\[224, 250\] is not a multiple of deit_tiny_patch16_224's patch size 16") as err:
        odd = {"model": "deit_tiny_patch16_224", "model_kwargs": {"depth": 1}, "export": {"img_size": [224, 250]}}
        build_reference(config_from_dict(odd))
    assert err.value.hint == "Use 240 or 256 for that side."
    with pytest.raises(DeploytkError, match="heuristic needs a square patch grid"):
        build_reference(rectangular(method="heuristic", options={"layers": [1]}))
