"""`deploytk visualize`: draw where every patch of a sample went, block by block, from PyTorch's or a runtime's choices.

The sample is an image, a clip or a sound, as the model's input kind reads it (``InputKind.read``, then the family's
eval transform); the kind lays it out for the picture (``InputKind.canvas``: the image; a clip's tubelet groups side by
side; a spectrogram, low frequencies at the bottom) and maps the patches onto it.

The PyTorch reference is run with source tracking (``deploytk.analysis.token_map``). With
``backend="reference"`` its own choices are drawn. With a runtime (``ort``, ``ort-cuda``,
``openvino``) the config is exported (or ``artifacts`` is read), the ``dest`` output of every
deploytk matching/selection node becomes an extra graph output (in memory), the runtime runs the
sample, and its choices replace the reference's in the same source maps: the picture shows what
the deployed graph does.
"""

from __future__ import annotations

import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from deploytk.analysis.token_map import (
    COLORS,
    Sources,
    canvas,
    check_layers_exist,
    choose_layers,
    draw,
    legend,
    load_sample,
    panel_title,
    parse_layers,
    require_matplotlib,
    require_sample_file,
    save_figure,
    track_sources,
    upscaled,
)
from deploytk.backends import BACKENDS, get_backend
from deploytk.config import DeployConfig
from deploytk.errors import DeploytkError
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.pipeline import run_export
from deploytk.exporter.probes import with_matching_outputs
from deploytk.files import claim_file
from deploytk.inputs import NO_PATCH
from deploytk.merging.merged_vit import MergedViT
from deploytk.models import build_reference
from deploytk.ops import OPS
from deploytk.progress import SILENT, Progress

#: the PyTorch reference's own choices
#: the ``backend`` value that draws the PyTorch reference's own choices (not a runtime: TorchBackend's "torch" runs the export's ops)
REFERENCE = "reference"


def backend_names() -> list[str]:
    """What ``backend`` takes: the reference, or a runtime that runs an ONNX graph (its matching nodes' outputs can be read)."""
    return [REFERENCE] + [name for name, b in BACKENDS.items() if b.runs_onnx and b.validates]


def runtime_dests(backend_name: str, artifact: Artifact, image: np.ndarray, sources: Sources) -> list[np.ndarray]:
    """The ``dest`` of every matching node when ``backend_name`` runs ``image`` (one sample [1, ...]) through the artifact's graph."""
    backend = get_backend(backend_name, validating=True)
    proto, _ = backend.graph(artifact)
    probed, probes = with_matching_outputs(proto, matching_from=artifact.onnx_path)
    matches = [r for r in sources.records if r.kind == "match"]
    graph_ops = [OPS[p.op].torch_name for p in probes]
    if graph_ops != [r.op for r in matches]:
        raise DeploytkError(
            f"{artifact.directory}/model.onnx has the matching ops {graph_ops}, the PyTorch reference calls {[r.op for r in matches]}: "
            "the artifact was not exported from this config."
        )
    loaded = backend.load(artifact, [1], probed or proto)
    loaded.activate()
    try:
        outputs = loaded.run(np.ascontiguousarray(image, dtype=np.float32))
    finally:
        loaded.deactivate()
    return [np.asarray(outputs[p.dest])[0] for p in probes]


@dataclass
class Traced:
    """One sample through the reference: the model, the preprocessed sample [1, *input_kind.shape] and where every patch
    went (the reference's choices, or a runtime's in the same structure)."""

    model: MergedViT
    image: torch.Tensor
    sources: Sources
    backend: str


def trace(
    cfg: DeployConfig,
    image: Path,
    *,
    backend: str = REFERENCE,
    artifacts: Path | None = None,
    layers: list[int] | None = None,
    config_name: str = "the config",
    progress: Progress = SILENT,
) -> Traced:
    """Run ``image`` (an image, a clip or a sound file: the model's input kind) through ``cfg``'s reference with source
    tracking; with a runtime ``backend``, replace the reference's choices by the ones the exported graph (``artifacts``,
    or a temporary export) makes on that runtime. ``layers``: the blocks that will be drawn, checked against the model
    before anything is exported."""
    if backend not in backend_names():
        raise DeploytkError(f"`backend={backend!r}`: allowed {', '.join(backend_names())}.")
    if artifacts is not None and backend == REFERENCE:
        raise DeploytkError(
            "`artifacts=` is read by a runtime (`backend=ort`, ...); `backend=reference` draws the PyTorch reference's own choices."
        )
    artifact = Artifact.open(Path(artifacts)) if artifacts is not None else None
    progress.step("building the PyTorch reference")
    model = build_reference(cfg).eval()
    kind = model.family.input_kind
    if not kind.drawn:
        raise DeploytkError(f"visualize does not draw {kind.nouns} yet: {cfg.model} takes {kind.nouns} ({kind.describe()}).")
    require_sample_file(image, kind)
    if artifact is not None:
        artifact.require_exported_from(cfg, config_name, model.family.img_size)
    if not model.blocks_run:
        raise DeploytkError(
            f"`export.feature_layer` = {cfg.export.feature_layer}: the graph ends at the embedding, before any block; there is "
            "no merge to draw.",
            hint="Set a later `export.feature_layer`, or visualize a config without it.",
        )
    check_layers_exist(layers, model.blocks_run)  # before any export; a feature-layer output runs fewer blocks
    x = load_sample(image, model.family)
    progress.step("tracking every patch through the reference")
    sources = track_sources(model, x)
    if backend != REFERENCE:
        if any(r.kind == "soft" for r in sources.records):
            raise DeploytkError(
                f"method {cfg.merge.method} makes no discrete choice in the graph (its tokens are learned soft mixtures of all "
                f"patches, computed with standard ONNX ops): `backend={backend}` has nothing of its own to show; use `backend={REFERENCE}`."
            )
        temporary = tempfile.TemporaryDirectory(prefix="deploytk-visualize-") if artifact is None else contextlib.nullcontext()
        with temporary as tmp:
            if artifact is None:
                progress.step("exporting to a temporary directory")
                run_export(cfg, Path(tmp) / "artifact", progress)
                artifact = Artifact.open(Path(tmp) / "artifact", verify=False)
            progress.step(f"running the {kind.noun} on {backend} with the matching ops' choices as outputs")
            sources = sources.with_dests(runtime_dests(backend, artifact, x.numpy(), sources), f"{backend}'s graph")
    return Traced(model, x, sources, backend)


def picture(traced: Traced, chosen: list[int], colors: str = "mean") -> tuple[list[np.ndarray], list[str], str]:
    """(panels: the input then one per chosen block, uint8 RGB; their titles; the caption)."""
    sources = traced.sources
    laid_out = canvas(traced.model.family, traced.image)
    panels = [draw(laid_out, sources, b, colors) for b in chosen]
    titles = [laid_out.title] + [panel_title(sources, b) for b in chosen]
    model = traced.model
    if model.output_kind == "tokens" and chosen[-1] == model.blocks_run - 1:  # the last block run: what the graph outputs
        prefix = "" if model.output.keep_prefix_tokens else f" (prefix token{'s' if model.protected > 1 else ''} dropped)"
        titles[-1] += f"\n= output tokens, K = {model.output_tokens}{prefix}"
    method = traced.model.reduction
    who = "the PyTorch reference" if traced.backend == REFERENCE else f"{traced.backend} (the exported graph)"
    uncovered = bool((laid_out.patch == NO_PATCH).any())
    return [upscaled(laid_out), *panels], titles, legend(method.name, method.kind, sources, chosen, colors, who, uncovered)


def visualize(
    cfg: DeployConfig,
    image: Path,
    *,
    output: Path,
    layers: str | None = None,
    backend: str = REFERENCE,
    artifacts: Path | None = None,
    colors: str = "mean",
    config_name: str = "the config",
    progress: Progress = SILENT,
) -> dict:
    """Draw, for each chosen block, the sample (``image``: an image, a clip or a sound file) with every patch in the colour
    of the token it belongs to; write ``output`` (a PNG, atomically) and return a summary (layers, tokens left, output,
    backend). See the module doc."""
    if colors not in COLORS:
        raise DeploytkError(f"`colors={colors!r}`: allowed {', '.join(COLORS)}.")
    with claim_file(Path(output), "deploytk visualize") as picture_out:
        if picture_out.path.suffix.lower() != ".png":
            raise DeploytkError(f"`output={output}`: visualize writes a PNG; give a file name ending in .png.")
        requested = parse_layers(layers)
        require_matplotlib()
        traced = trace(cfg, image, backend=backend, artifacts=artifacts, layers=requested, config_name=config_name, progress=progress)
        sources = traced.sources
        chosen = choose_layers(requested, sources)
        progress.step("drawing")
        panels, titles, caption = picture(traced, chosen, colors)
        width, height = save_figure(panels, titles, caption, picture_out)
        method = cfg.merge.reduction
        return {
            "config": config_name,
            "image": str(image),
            "output": str(output),
            "png_size": [width, height],
            "backend": backend,
            "artifacts": str(artifacts) if artifacts is not None else None,
            "method": method.name,
            "kind": method.kind,
            "patches": sources.patches,
            "protected_tokens": sources.protected,
            "tokens_per_block": [sources.tokens(b) for b in range(sources.depth)],
            "reducing_blocks": sources.reducing_blocks,
            "layers": [sources.summary(b) for b in chosen],
            "colors": colors,
            "caption": caption,
        }
