"""The generated model matrix: models built the way users build them, drawn with a seed (tests/helpers/variants.py).

For each drawn variant (a family's model with the constructor options users set, the library's own or a larger seeded
initialisation, a method and a schedule): export the object with the Python API; with no reduction, deploytk's
reference equals the model's own forward; the export validates on ONNX Runtime and OpenVINO with default tolerances, in
this process and again in a new one that has only the artifact; a variant deploytk cannot support is refused at export
with one paragraph naming the option, and nothing is written. A failure prints the variant as code to paste.

Size and seed: ``DEPLOYTK_MATRIX_SIZE`` variants in the default suite (6: one per family), ``DEPLOYTK_MATRIX_SLOW_SIZE`` more in
the slow tier (38, the same stream continued), drawn from ``DEPLOYTK_MATRIX_SEED`` (53).
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch

import deploytk
from deploytk.errors import DeploytkError, DeploytkNotice

from helpers.fresh_process import FreshProcess
from helpers.variants import Variant, draw

SIZE = int(os.environ.get("DEPLOYTK_MATRIX_SIZE", "6"))
SLOW_SIZE = int(os.environ.get("DEPLOYTK_MATRIX_SLOW_SIZE", "38"))
SEED = int(os.environ.get("DEPLOYTK_MATRIX_SEED", "53"))
_DRAWN = draw(SIZE + SLOW_SIZE, SEED)
DEFAULT, SLOW = _DRAWN[:SIZE], _DRAWN[SIZE:]
BACKENDS = ["ort", "openvino"]
#: inputs per validation: enough to see a wrong graph, few enough for dozens of variants
NUM_INPUTS = 4


@pytest.fixture(scope="session")
def fresh(tmp_path_factory):
    """The other process (one per test worker), working in a folder of its own."""
    process = FreshProcess(tmp_path_factory.mktemp("another-working-folder"))
    yield process
    process.close()


def _fail(variant: Variant, what: str) -> None:
    pytest.fail(f"{what}\n\nthe variant, to reproduce:\n\n{variant.reproduction()}\n", pytrace=False)


def _failed_checks(report: dict) -> str:
    return "; ".join(
        f"{r['backend']}: {', '.join(k for k, ok in r['checks'].items() if not ok)}" for r in report["reports"] if not r["passed"]
    )


def check_variant(variant: Variant, out, fresh: FreshProcess) -> None:
    model = variant.build()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DeploytkNotice)
            artifact = deploytk.export(model, out, method=variant.method, **variant.export_arguments)
    except DeploytkError as err:
        if variant.refusal is None or variant.refusal not in str(err):
            _fail(variant, f"export refused the variant: {err}")
        assert not out.exists(), f"a refused export left {sorted(p.name for p in out.iterdir())} in {out}"
        assert "\n" not in err.message, "a refusal is one paragraph"
        return
    if variant.refusal is not None:
        _fail(variant, f"export accepted a variant it cannot run (expected a refusal naming {variant.refusal!r})")

    # no reduction: deploytk's reference is the model's own forward, read as users read it
    merged = deploytk.patch(model, "tome", r=0)
    x = torch.from_numpy(merged.family.input_kind.synthetic(2, np.random.default_rng(0)))
    with torch.no_grad():
        want, got = eval(variant.call, {"model": model, "x": x}), merged(x)
    got = got[0] if isinstance(got, tuple) else got
    if want.shape != got.shape or not float((want - got).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max())):
        _fail(variant, f"with r=0 the reference differs from `{variant.call}`: shapes {list(got.shape)} / {list(want.shape)}")

    # a model built by its library rebuilds elsewhere, decided at export; a capped schedule is recorded as it runs, and said
    if not artifact.rebuildable:
        _fail(variant, f"export stored nothing that rebuilds the model in another process: {artifact.rebuild_problem}")
    notices = [str(w.message) for w in caught if issubclass(w.category, DeploytkNotice)]
    schedule = artifact.manifest["schedule"]
    if schedule["capped"] != any("capped" in n for n in notices):
        _fail(variant, f"the schedule was {'' if schedule['capped'] else 'not '}capped, and export said: {notices}")
    if schedule["capped"] and artifact.manifest["config"]["merge"]["r"] != schedule["effective_r"]:
        _fail(variant, f"the manifest's r {artifact.manifest['config']['merge']['r']} is not the r that runs {schedule['effective_r']}")

    report = artifact.validate(BACKENDS, num_samples=NUM_INPUTS, batch_size=2).to_dict()
    if not report["passed"]:
        _fail(variant, f"validate failed in the exporting process: {_failed_checks(report)}")
    answer = fresh.validate(artifact.directory, BACKENDS, NUM_INPUTS)
    if "error" in answer:
        _fail(variant, f"a new process could not validate the artifact: {answer['error']}")
    if not answer["passed"]:
        _fail(variant, f"validate failed in a new process: {_failed_checks(answer['report'])}")


@pytest.mark.parametrize("variant", DEFAULT, ids=[v.id for v in DEFAULT])
def test_drawn_variant_exports_and_validates_or_is_refused(variant, tmp_path, fresh):
    check_variant(variant, tmp_path / "out", fresh)


@pytest.mark.slow
@pytest.mark.parametrize("variant", SLOW, ids=[v.id for v in SLOW])
def test_more_drawn_variants(variant, tmp_path, fresh):
    check_variant(variant, tmp_path / "out", fresh)


def test_the_draw_covers_every_family_and_is_reproducible():
    again = draw(SIZE + SLOW_SIZE, SEED)
    assert [v.id for v in again] == [v.id for v in _DRAWN]
    assert {v.family for v in DEFAULT} == {v.family for v in _DRAWN}
    assert len({v.method for v in _DRAWN}) >= 10 and {v.init.split(":")[0] for v in _DRAWN} == {"default", "seeded"}
