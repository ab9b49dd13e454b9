"""`deploytk validate`: the backend against the reference rebuilt from the manifest.

Polygraphy runs both runners over the same feeds and does the element-wise tolerance check
(``SimpleCompareFunc``); on top we report what deployment engineers decide by: max
abs/rel error, cosine similarity and top-1 agreement.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from polygraphy.comparator import Comparator, RunResults, SimpleCompareFunc
from polygraphy.logger import G_LOGGER

from deploytk.backends import Backend, ModelRunner, get_backend
from deploytk.backends.torch_backend import TorchModel
from deploytk.data import folder_batches, synthetic_batches
from deploytk.errors import DeploytkError, DeploytkNotice, param
from deploytk.exporter.artifacts import Artifact
from deploytk.exporter.probes import with_matching_outputs
from deploytk.models import build_reference
from deploytk.progress import SILENT, Progress
from deploytk.validate.branches import BranchFlip, choices_reproduced, explain_flips


@dataclass
class Tolerances:
    atol: float = 1e-4
    rtol: float = 1e-4
    min_cosine: float = 0.99999
    min_top1_agreement: float = 1.0
    #: fraction of the matching decisions (one per token per matching call per image) that may differ from the op's own
    #: choice at proven near-ties (see branches.py and PRECISION_TOLERANCES)
    max_flipped_choices: float = 1e-2
    #: deprecated (the bound before max_flipped_choices): fraction of images that may take a different branch at a
    #: near-tie; judged only where given
    max_branch_flips: float | None = None

    @classmethod
    def for_precision(cls, precision: str, **overrides) -> Tolerances:
        """The defaults for a graph of ``precision`` against the fp32 reference; None overrides are ignored."""
        base = PRECISION_TOLERANCES.get(precision)
        if base is None:
            raise DeploytkError(f"no tolerances for precision {precision!r}; allowed: {', '.join(PRECISION_TOLERANCES)}.")
        return cls(**(asdict(base) | {k: v for k, v in overrides.items() if v is not None}))


#: int8 (`deploytk quantize`): every projection is rounded to 8 bits, so the metric and the scores move, and the merge
#: choices differ from the fp32 reference's on most images (that is what a quantized merge is, not an error). The
#: decision is made on cosine similarity and top-1 agreement (measured on the digits ViT's held-out images and on random
#: DeiT-S weights, see docs/results/int8.md), the element-wise bounds only catch gross errors, and any number of images may choose
#: differently (max_flipped_choices 1.0), provided every choice is the op's own on the runtime's inputs and no matching op
#: or input of one is quantized (two checks only int8 artifacts get).
#: The element-wise error is reported, not judged; atol alone decides which top-1 flips are near-ties of logits: two
#: classes whose reference logits are within 2 * atol (random weights' logits are nearly equal: DeiT-S ToMe r=16 int8
#: on 64 synthetic images flips 5 of them, at reference margins 0.02-0.08, mean |logit error| 0.03; the trained digits
#: ViT's int8 flips are at margins 0.49-1.26, and count). The cosine judged is the mean over images: on a small model
#: a few low-confidence images swing far under int8 (digits ViT, ToMe r=4, 256 held-out images: min 0.65-0.70, mean
#: 0.996, top-1 agreement 98%; DeiT-S ToMe r=16, random weights, synthetic images: min 0.992).
INT8_ATOL, INT8_RTOL, INT8_MIN_COSINE, INT8_MIN_TOP1 = 0.1, 0.0, 0.95, 0.9

#: Default tolerances per export.precision (the reference is always fp32). fp16 keeps ~11
#: significant bits, bf16 ~8: logits move by ~1e-3 resp. ~1e-2 of their scale, so the
#: decision is made on cosine similarity and top-1 agreement; the element-wise bounds only
#: catch gross errors. Matching decisions see inputs perturbed by that rounding, so near-tie
#: flips are far more common than in fp32 (measured on the digits ViT, MCTF r=4, fp16: 1 of 64
#: real images, 21 of 64 synthetic noise images); they must still be proven near-ties.
#:
#: max_flipped_choices bounds the share of matching decisions (one per token per matching call per image) that differ at
#: proven near-ties, so that it means the same for 2 clips of 1,568 tokens and for 64 images of 197. Measured with the
#: defaults on ONNX Runtime / OpenVINO CPU, 64 seeded synthetic images unless said (the share, then flipped images):
#: fp32: the digits ViT ToMe r=4 and MCTF r=4, DeiT-T ToMe r=8 and r=16: 0 (no flip); DeiT-T MCTF r=8: 1.8e-5 (1 image);
#: VideoMAE-B (transformers' default init) ToMe r=64 on 2 real clips with flat colour areas, 29,184 decisions: 0.048% /
#: 0.069% (2 / 2 clips; 6-10 decisions a clip, in 3-4 of its 12 calls); PiToMe, where one tied swap in the energy order
#: moves every later match (15-211 decisions a flip): DeiT-T 0.12% / 0.09% (2 / 2), DeiT-S 0.12% / 0.17% (3 / 3), DINOv2-S
#: with registers 0.33% / 0.13% (4 / 2), DINOv2-B 0.15% / 0.12% (4 / 3). So fp32 allows 1%, 3x the largest.
#: fp16: the digits ViT ToMe r=4 on 64 validation digits 0, MCTF r=4 6.3e-5 / 0 (1 / 0) and on noise 0.27% / 0.03%
#: (22 / 5); DeiT-S ToMe r=16 0.16% / 0.06% (7 / 3). bf16 (ONNX Runtime, emulated):
#: the digits ViT ToMe r=4 on digits 0 and on noise 0.12% (5), MCTF r=4 on digits 0 and on noise 1.2% (11: a flipped
#: noise image moves 23-58 of its 495 decisions, in 6-10 of its 11 calls); DeiT-S ToMe r=16 0. So fp16 and bf16 allow
#: 5%, 4x bf16's largest (PiToMe's amplification in fp16 or bf16 was not measured). Any number may flip in int8.
PRECISION_TOLERANCES = {
    "fp32": Tolerances(),
    "fp16": Tolerances(atol=5e-2, rtol=5e-2, min_cosine=0.999, min_top1_agreement=0.99, max_flipped_choices=5e-2),
    "bf16": Tolerances(atol=2e-1, rtol=2e-1, min_cosine=0.995, min_top1_agreement=0.98, max_flipped_choices=5e-2),
    # `deploytk quantize`: see INT8_RULES
    "int8": Tolerances(
        atol=INT8_ATOL, rtol=INT8_RTOL, min_cosine=INT8_MIN_COSINE, min_top1_agreement=INT8_MIN_TOP1, max_flipped_choices=1.0
    ),
}

#: the one-line note a caller of the deprecated bound gets (a ``DeploytkNotice``; the CLI prints it as a note)
BRANCH_FLIPS_DEPRECATED = (
    "`max_branch_flips=` (a fraction of the images) is deprecated and goes in the next release; it is judged as given, "
    "beside `max_flipped_choices=` (a fraction of the matching decisions: one per token per matching op per image)."
)


#: the top-1 check: flips the tolerance explains (judge_top1_flips) are reported but not counted
TOP1_CHECK = "top1_agreement (flips outside tolerance) >= min_top1_agreement"
#: the branch-flip check: every flipped image proven a near-tie at each call it flipped, and the flipped decisions' share
FLIPS_CHECK = "near-tie branch flips proven and flipped_choice_fraction <= max_flipped_choices"
#: the deprecated image-fraction bound, judged only where ``max_branch_flips`` is given
IMAGE_FLIPS_CHECK = "branch-flipped images <= max_branch_flips (deprecated)"


@dataclass
class ValidationReport:
    passed: bool
    backend: str
    num_images: int
    max_abs_diff: float
    max_rel_diff: float
    mean_abs_diff: float
    cosine_similarity_min: float
    #: the mean over images (patches, tokens) of the same cosine: what int8 is judged by
    cosine_similarity_mean: float
    #: fraction of images with the reference's top-1 class (None for an embedding output: no classes)
    top1_agreement: float | None
    elementwise_passed: bool
    tolerances: dict
    checks: dict
    #: images whose top-1 class differs: both classes' reference logits and the reference's margin
    #: between them (a margin within the logits' tolerance is a near-tie of logits, common on random weights)
    top1_flips: list = field(default_factory=list)
    #: images whose matching/selection choice flipped at a near-tie (empty when none failed)
    branch_flips: list = field(default_factory=list)
    #: the matching decisions compared: one per token per matching call per image (0 for a graph without matching ops)
    matching_decisions: int = 0
    #: those that differ from the op's own choice on the failing images (``BranchFlip.choices_flipped`` summed), and
    #: their share of ``matching_decisions``: what ``max_flipped_choices`` bounds
    flipped_choices: int = 0
    flipped_choice_fraction: float = 0.0
    #: the metrics against the reference replayed with the backend's choices on flipped images
    same_branch: dict | None = None
    #: top-1 agreement counting only the flips the tolerance does not explain (what ``min_top1_agreement`` judges)
    top1_agreement_counted: float | None = None
    #: flips whose logits are all within atol/rtol and whose two classes the tolerance lets noise swap
    top1_flips_within_tolerance: int = 0
    #: export.output: logits (top-1 applies), embedding, patch_features or tokens (features: cosine per patch / token)
    output_kind: str = "logits"
    #: the graph's other outputs (token_sizes, patch_to_token): the images where they differ from the reference's
    other_outputs: dict = field(default_factory=dict)
    #: how the runtime was set up (threads, hints, providers)
    runtime_settings: dict = field(default_factory=dict)
    #: export.precision of the graph, or int8 for a `deploytk quantize` artifact (the reference is always fp32)
    precision: str = "fp32"
    #: int8 only: how many images chose differently from the reference, and the choices the op does not reproduce
    #: from the runtime's own inputs (see branches.choices_reproduced); where the graph quantizes a choice's inputs
    choices: dict | None = None
    #: how the backend ran the graph when not as is (bf16 on ONNX Runtime CPU)
    emulation: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def compare_outputs(reference: list[np.ndarray], candidate: list[np.ndarray], classes: bool = True) -> dict:
    """Metrics over all images (rows) of the batched outputs; ``classes=False``: features (no top-1). The cosine is
    taken along the last axis: per image for a pooled output, per patch / per token for patch_features / tokens."""
    ref = np.concatenate(reference).astype(np.float64)
    out = np.concatenate(candidate).astype(np.float64)
    diff = np.abs(out - ref)
    cos = (ref * out).sum(-1) / np.maximum(np.linalg.norm(ref, axis=-1) * np.linalg.norm(out, axis=-1), 1e-30)
    metrics = {
        "num_images": int(ref.shape[0]),
        "max_abs_diff": float(diff.max()),
        # relative to the output's scale: element-wise ratios blow up on values near 0
        "max_rel_diff": float(diff.max() / max(np.abs(ref).max(), 1e-12)),
        "mean_abs_diff": float(diff.mean()),
        "cosine_similarity_min": float(cos.min()),
        "cosine_similarity_mean": float(cos.mean()),
        "top1_agreement": None,
        "top1_flips": [],
    }
    if classes:
        top_ref, top_out = ref.argmax(-1), out.argmax(-1)
        metrics["top1_agreement"] = float((top_ref == top_out).mean())
        metrics["top1_flips"] = [
            {
                "image": int(i),
                "reference_top1": int(top_ref[i]),
                "backend_top1": int(top_out[i]),
                "reference_logits": [float(ref[i, top_ref[i]]), float(ref[i, top_out[i]])],
                "reference_margin": float(ref[i, top_ref[i]] - ref[i, top_out[i]]),
            }
            for i in np.flatnonzero(top_ref != top_out)
        ]
    return metrics


def near_tied_logits(flip: dict, tol: Tolerances) -> bool:
    """A top-1 flip whose two classes' reference logits are closer than the errors the tolerances
    allow on them (element-wise: atol or rtol*|ref|, whichever is larger): logit noise within
    tolerance can swap them, so the flip says nothing the element-wise check has not."""
    a, b = flip["reference_logits"]
    return flip["reference_margin"] <= max(tol.atol, tol.rtol * abs(a)) + max(tol.atol, tol.rtol * abs(b))


def failing_images(reference: list[np.ndarray], candidate: list[np.ndarray], tol: Tolerances) -> list[int]:
    """Images (row indices) failing Polygraphy's rule: max abs diff > atol and max rel diff > rtol (over all of an
    image's values: its logits, or every patch's / token's features)."""
    ref = np.concatenate(reference).astype(np.float64)
    diff = np.abs(np.concatenate(candidate).astype(np.float64) - ref)
    rel = diff / np.maximum(np.abs(ref), 1e-30)
    n = ref.shape[0]
    return [int(i) for i in np.flatnonzero((diff.reshape(n, -1).max(-1) > tol.atol) & (rel.reshape(n, -1).max(-1) > tol.rtol))]


def judge_top1_flips(
    metrics: dict, reference: list[np.ndarray], candidate: list[np.ndarray], tol: Tolerances, elementwise: bool = True
) -> None:
    """Mark each top-1 flip ``within_tolerance`` when every logit of the image is within atol/rtol and the
    reference's margin between the two classes is one the tolerance lets noise close (``near_tied_logits``):
    such a flip is reported but the element-wise check has already judged it, so it is not counted
    against ``min_top1_agreement``. ``elementwise=False`` (int8, where the element-wise error is not judged): the margin alone
    decides. Adds ``top1_flips_within_tolerance`` and ``top1_agreement_counted``."""
    outside = set(failing_images(reference, candidate, tol)) if elementwise else set()
    for flip in metrics["top1_flips"]:
        flip["within_tolerance"] = flip["image"] not in outside and near_tied_logits(flip, tol)
    tolerated = sum(f["within_tolerance"] for f in metrics["top1_flips"])
    metrics["top1_flips_within_tolerance"] = tolerated
    counted = len(metrics["top1_flips"]) - tolerated
    n = metrics["num_images"]
    metrics["top1_agreement_counted"] = None if metrics["top1_agreement"] is None else (n - counted) / n


def judge_branch_flips(flips: list[BranchFlip], decisions: int, num_images: int, tol: Tolerances) -> dict[str, bool]:
    """The branch-flip checks (none where no image flipped): every flip proven a near-tie at each call it flipped, and the
    flipped decisions at most ``max_flipped_choices`` of the ``decisions`` (one per token per matching call per image),
    so 1 flip of 2 long clips and 6 of 64 short images are judged alike; the deprecated image fraction
    ``max_branch_flips`` as well, where given."""
    if not flips:
        return {}
    flipped = sum(f.choices_flipped for f in flips)
    checks = {FLIPS_CHECK: all(f.explained for f in flips) and flipped <= tol.max_flipped_choices * decisions}
    if tol.max_branch_flips is not None:
        checks[IMAGE_FLIPS_CHECK] = len(flips) <= tol.max_branch_flips * num_images
    return checks


@dataclass
class _Candidate:
    """A backend loaded for judging: its runner's model, the matching probes it outputs and how it emulates."""

    backend: Backend
    loaded: object
    probes: list
    emulation: str | None


def _load_candidate(backend: Backend, artifact: Artifact, batch_sizes: list[int], progress: Progress) -> _Candidate:
    graph, probes, emulation = None, [], None
    if backend.runs_onnx:  # validate the graph with the matching ops' choices as extra outputs (see branches.py)
        proto, emulation = backend.graph(artifact)
        if emulation:
            progress.step(f"{backend.name}: {emulation}")
        probed, probes = with_matching_outputs(proto, matching_from=artifact.onnx_path)  # validate the graph that made them
        graph = probed if probed is not None else proto
    return _Candidate(backend, backend.load(artifact, batch_sizes, graph, progress), probes, emulation)


def validate(
    directory: Path,
    backend: str | Backend,
    batches: list[np.ndarray] | None,
    tol: Tolerances,
    progress: Progress = SILENT,
    reference=None,
) -> ValidationReport:
    """Run ``batches`` (default: 64 seeded synthetic images) through the backend and the fp32 reference and judge the difference."""
    return validate_each(directory, [backend], batches, tol, progress, reference)[0]


#: Polygraphy's comparator prints its own per-output verdict (``[E] FAILED ... Pass Rate: 50.00%``) where deploytk's
#: report, which judges the same comparison and proves near-tie flips, may say passed: its lines are shown only where
#: this logger is enabled for DEBUG (the CLI does so when asked to be verbose; in Python, ``logging.getLogger(COMPARATOR_LOG.name)
#: .setLevel(logging.DEBUG)``). Nothing is logged to it: it is the switch (cli/quiet.py names it too).
COMPARATOR_LOG = logging.getLogger("deploytk.validate.comparator")


@contextlib.contextmanager
def _polygraphy_quiet():
    """Polygraphy's lines while deploytk runs its comparator: its INFO lines never; its [E] lines (a FAILED verdict
    deploytk's own may overrule) only where ``COMPARATOR_LOG`` is enabled for DEBUG. Its level is put back afterwards."""
    before = G_LOGGER.module_severity
    floor = G_LOGGER.ERROR if COMPARATOR_LOG.isEnabledFor(logging.DEBUG) else G_LOGGER.CRITICAL
    G_LOGGER.module_severity = max(floor, before.get())
    try:
        yield
    finally:
        G_LOGGER.module_severity = before


def validate_each(
    directory: Path,
    backends: list[str | Backend],
    batches: list[np.ndarray] | None,
    tol: Tolerances,
    progress: Progress = SILENT,
    reference=None,
) -> list[ValidationReport]:
    """``validate`` on each backend, with the fp32 reference run once: on a CPU the reference is most of a
    validation's time (CLIP-L/336, 64 images: 140 s of 190 s), so a second runtime costs only its own run."""
    backends = [get_backend(b, validating=True) if isinstance(b, str) else b for b in backends]
    names = [b.name for b in backends]
    if len(set(names)) != len(names):
        raise DeploytkError(f"backend given twice: {', '.join(names)}; name each runtime once.")
    artifact = Artifact.open(directory)
    kind = artifact.input_kind
    batches = batches if batches is not None else synthetic_batches(64, 8, kind)
    batch_sizes = sorted({len(b) for b in batches})
    candidates = [_load_candidate(b, artifact, batch_sizes, progress) for b in backends]  # refuses a stale engine before any work
    if reference is None:
        progress.step("rebuilding the PyTorch reference from the manifest")
        reference = build_reference(artifact.reference_config)
    reference_model = TorchModel(reference, kind, "cpu", artifact.output_names)
    feeds = [{kind.onnx_name: b} for b in batches]
    images = sum(len(b) for b in batches)
    progress.start(images, f"running {images} {kind.nouns} through the PyTorch reference")
    with contextlib.redirect_stdout(sys.stderr), _polygraphy_quiet():  # Polygraphy logs to stdout; keep it for the CLI's JSON
        reference_results = Comparator.run(
            [ModelRunner(reference_model, kind, "pytorch-reference", on_batch=progress.advance)], data_loader=feeds
        )
    reports = []
    for candidate in candidates:
        progress.start(images, f"running {images} {kind.nouns} through {candidate.backend.name}")
        with contextlib.redirect_stdout(sys.stderr), _polygraphy_quiet():
            runner = ModelRunner(candidate.loaded, kind, candidate.backend.name, on_batch=progress.advance)
            own = Comparator.run([runner], data_loader=feeds)
            results = RunResults(list(reference_results.items()) + list(own.items()))
            accuracy = Comparator.compare_accuracy(
                results, compare_func=SimpleCompareFunc(atol=tol.atol, rtol=tol.rtol, check_error_stat="max")
            )
        reports.append(_judge(artifact, candidate, reference, batches, results, bool(accuracy), tol, progress))
    return reports


def _judge(
    artifact: Artifact,
    candidate: _Candidate,
    reference,
    batches: list[np.ndarray],
    results: RunResults,
    elementwise_passed: bool,
    tol: Tolerances,
    progress: Progress,
) -> ValidationReport:
    """The report on one backend's outputs against the reference's (Polygraphy's element-wise verdict given)."""
    backend, loaded, probes = candidate.backend, candidate.loaded, candidate.probes
    (_, ref_iters), (_, out_iters) = results[0], results[1]
    name = artifact.output_name  # the first output is judged; Polygraphy's element-wise check covered all of them
    ref_out = [it[name] for it in ref_iters]
    backend_out = [it[name] for it in out_iters]
    classes = artifact.output_kind == "logits"
    metrics = compare_outputs(ref_out, backend_out, classes)
    judge_top1_flips(metrics, ref_out, backend_out, tol, elementwise=not artifact.quantization)
    flips, same_branch = [], None
    failing = failing_images(ref_out, backend_out, tol)
    choices = None
    if artifact.quantization:  # int8: the choices differ from fp32's by design; each must still be the op's own
        progress.step("int8: checking every merge / selection choice against the op run on the runtime's own inputs")
        choices = choices_reproduced(reference, probes, list(batches), list(out_iters)) if probes else {}
        choices["quantized_inputs"] = loaded.quantized_choices()
    if failing and probes and not artifact.quantization:
        progress.step(f"diagnosing {len(failing)} image(s) outside tolerance: replaying the reference with the backend's choices")
        flips, replayed = explain_flips(reference, probes, list(batches), list(out_iters), failing, tol.atol, tol.rtol, name)
    checked = metrics
    if flips:
        effective = np.concatenate(ref_out).copy()
        for image, row in replayed.items():
            effective[image] = row
        same_branch = compare_outputs([effective], backend_out, classes)
        judge_top1_flips(same_branch, [effective], backend_out, tol)
        checked = same_branch
        elementwise_passed = not set(failing_images([effective], backend_out, tol))
    checks = {} if artifact.quantization else {"max_abs_diff <= atol (+ rtol*|ref|, element-wise)": elementwise_passed}
    if artifact.quantization:
        checks["int8: cosine_similarity_mean >= min_cosine"] = checked["cosine_similarity_mean"] >= tol.min_cosine
    else:
        checks["cosine_similarity_min >= min_cosine"] = checked["cosine_similarity_min"] >= tol.min_cosine
    if classes:  # an embedding has no classes: top-1 does not apply
        checks[TOP1_CHECK] = checked["top1_agreement_counted"] >= tol.min_top1_agreement
    explained = {f.image for f in flips if f.explained}
    other_outputs = {}
    for other in artifact.output_names[1:]:  # token_sizes, patch_to_token: exact, except where a proven near-tie moved tokens
        ref_rows, out_rows = (np.concatenate([it[other] for it in iters]) for iters in (ref_iters, out_iters))
        differ = [i for i in range(len(ref_rows)) if not np.array_equal(ref_rows[i], out_rows[i])]
        other_outputs[other] = {"images_differing": differ, "all_at_explained_branch_flips": set(differ) <= explained}
    if other_outputs:
        checks["other outputs equal the reference's exactly (but at explained branch flips)"] = all(
            o["all_at_explained_branch_flips"] for o in other_outputs.values()
        )
    if choices is not None:
        checks["int8: no matching op or input of one is quantized"] = not choices["quantized_inputs"]
        checks["int8: every choice is the op's own on the runtime's inputs"] = not choices.get("unreproduced")
    decisions = metrics["num_images"] * sum(out_iters[0][p.dest].shape[1] for p in probes) if probes else 0
    checks.update(judge_branch_flips(flips, decisions, metrics["num_images"], tol))
    flipped = sum(f.choices_flipped for f in flips)
    fraction = flipped / decisions if decisions else 0.0
    return ValidationReport(
        passed=all(checks.values()),
        backend=backend.name,
        elementwise_passed=elementwise_passed,
        tolerances=asdict(tol),
        checks=checks,
        branch_flips=[f.to_dict() for f in flips],
        matching_decisions=int(decisions),
        flipped_choices=flipped,
        flipped_choice_fraction=fraction,
        same_branch=same_branch,
        precision=artifact.numerics,
        choices=choices,
        emulation=candidate.emulation or loaded.emulation,
        output_kind=artifact.output_kind,
        other_outputs=other_outputs,
        runtime_settings=loaded.settings(),
        **metrics,
    )


def run_validation(
    directory: Path,
    backend: str | Backend,
    *,
    data: Path | None = None,
    num_samples: int = 64,
    batch_size: int = 8,
    progress: Progress = SILENT,
    **tolerances,
) -> tuple[ValidationReport, Tolerances]:
    """`deploytk validate` on one backend (``run_validations``)."""
    reports, tol = run_validations(
        directory, [backend], data=data, num_samples=num_samples, batch_size=batch_size, progress=progress, **tolerances
    )
    return reports[0], tol


def run_validations(
    directory: Path,
    backends: list[str | Backend],
    *,
    data: Path | None = None,
    num_samples: int = 64,
    batch_size: int = 8,
    progress: Progress = SILENT,
    **tolerances,
) -> tuple[list[ValidationReport], Tolerances]:
    """`deploytk validate`: tolerances from the artifact's precision (overridden where given), then ``validate_each``
    on ``num_samples`` inputs of ``data`` (the model family's own preprocessing) or seeded synthetic ones."""
    if num_samples < 1 or batch_size < 1:
        raise DeploytkError("`num_samples=` and `batch_size=` must be >= 1.")
    if not backends:
        raise DeploytkError("no backend to validate on; name at least one.")
    for name in ("max_flipped_choices", "max_branch_flips"):
        value = tolerances.get(name)
        if value is not None and not 0 <= value <= 1:
            raise DeploytkError(f"{param(name, value)} must be a fraction in [0, 1].")
    if tolerances.get("max_branch_flips") is not None:
        warnings.warn(DeploytkNotice(BRANCH_FLIPS_DEPRECATED), stacklevel=2)
    backends = [get_backend(b, validating=True) if isinstance(b, str) else b for b in backends]
    artifact = Artifact.open(directory, verify=False)  # validate_each() checks the hash
    tol = Tolerances.for_precision(artifact.numerics, **tolerances)
    reference = None
    if data is not None:  # the reference's own model decides the preprocessing
        progress.step("rebuilding the PyTorch reference from the manifest")
        reference = build_reference(artifact.reference_config)
        transform = artifact.input_transform(reference.family)
        batches = folder_batches(data, num_samples, batch_size, transform, artifact.input_kind, "data")
    else:
        batches = synthetic_batches(num_samples, batch_size, artifact.input_kind)
    return validate_each(directory, backends, batches, tol, progress, reference), tol
