"""The Python API (``deploytk.export`` / ``load`` / ``patch`` / ``Artifact``) from the model object a user holds.

Each model kind round-trips: object -> export -> validate on ONNX Runtime and OpenVINO -> ``deploytk validate DIR``
in a new process (the reference rebuilt from the weights and architecture stored in the artifact) -> the runner's
output equals the reference; the caller's model is unchanged (state dict, class, mode). DeiT-S with 10 classes, as a
user would fine-tune it, runs in the slow tier; the default tier runs small models of each kind.
"""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
import transformers
from timm.models.vision_transformer import VisionTransformer

import deploytk
import deploytk.models as deploytk_models
from deploytk.errors import DeploytkError, ExportNotice, NotRebuildableWarning

from helpers import seeded_images, seeded_init, snapshot

ROOT = Path(__file__).resolve().parents[1]
RECORDED_TOME = np.load(ROOT / "tests" / "data" / "tome_official_logits.npz")


def deploytk_cli(*args) -> subprocess.CompletedProcess:
    """The CLI in a new process: nothing held by this one (the model objects) is visible there."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "deploytk", *map(str, args)], env=env, capture_output=True, text=True, timeout=600)


def state_of(model: torch.nn.Module) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def assert_unchanged(model: torch.nn.Module, before: dict, cls: type, training: bool) -> None:
    after = model.state_dict()
    assert type(model) is cls and model.training is training
    assert list(after) == list(before) and all(torch.equal(after[k], before[k]) for k in before)


def round_trip(model, tmp_path, images: np.ndarray, output_kind=None, **export_args):
    """The acceptance path for one model object; returns the artifact."""
    cls, training, before = type(model), model.training, state_of(model)
    artifact = deploytk.export(model, tmp_path / "art", output_kind=output_kind, **export_args)
    assert_unchanged(model, before, cls, training)
    source = artifact.manifest["model"]["source"]
    assert source["rebuild"] is not None and source["cannot_rebuild"] is None, source
    assert source["files"] and all((artifact.directory / f).is_file() for f in source["files"])

    report = artifact.validate(["ort", "openvino"], num_samples=8, batch_size=4)
    assert report.passed and report.to_dict()["backends"] == ["ort", "openvino"], report

    cli = deploytk_cli("validate", artifact.directory, "--backend", "ort", "--num-samples", 8, "--batch-size", 4, "--json")
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["passed"] is True

    reference = deploytk.patch(model, export_args.get("method", "tome"), export_args.get("r"), output_kind=output_kind)
    with torch.no_grad():
        want = reference(torch.from_numpy(images)).numpy()
    got = artifact.runner("ort")(images)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert_unchanged(model, before, cls, training)
    return artifact


def changed_weights(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The model's weights moved off their init, as fine-tuning would (a rebuild from the name alone would differ)."""
    return seeded_init(model, seed=seed)


def small_timm(**kwargs) -> VisionTransformer:
    return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=64, depth=4, num_heads=2, **kwargs)


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_timm_object_with_its_own_head_round_trips(tmp_path):
    model = changed_weights(small_timm(num_classes=10), seed=5)
    model.train()  # the caller's mode is theirs: export works on an eval copy
    artifact = round_trip(model, tmp_path, seeded_images(2, img=32).numpy(), method="tome", r=4)
    assert artifact.manifest["outputs"][0]["shape"] == ["batch", 10]
    assert artifact.manifest["model"]["source"]["rebuild"]["model_kwargs"]["num_classes"] == 10


def hf_model(name: str, config_class: str, **extra):
    config = getattr(transformers, config_class)(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=2, image_size=32, patch_size=4, **extra
    )
    return changed_weights(getattr(transformers, name)(config), seed=6).eval()


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_transformers_vit_classifier_object_round_trips(tmp_path):
    model = hf_model("ViTForImageClassification", "ViTConfig", intermediate_size=128, num_labels=10)
    artifact = round_trip(model, tmp_path, seeded_images(2, img=32).numpy(), method="tome", r=4)
    assert (artifact.directory / "source" / "config.json").is_file()
    assert artifact.manifest["model"]["class"] == "ViTForImageClassification"


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_a_dinov2_object_exports_patch_features_and_round_trips(tmp_path):
    model = hf_model("Dinov2Model", "Dinov2Config", mlp_ratio=2)
    artifact = round_trip(model, tmp_path, seeded_images(2, img=32).numpy(), output_kind="patch_features", method="tome", r=4)
    assert artifact.manifest["outputs"][0]["kind"] == "patch_features"
    assert artifact.manifest["outputs"][0]["shape"] == ["batch", 64, 64]  # every patch of the 8x8 grid, unmerged


@pytest.mark.slow
def test_deit_small_with_ten_classes_round_trips(tmp_path):
    """The issue's case: a DeiT-S fine-tuned to 10 classes, in memory."""
    model = changed_weights(timm.create_model("deit_small_patch16_224", num_classes=10), seed=7)
    artifact = round_trip(model, tmp_path, seeded_images(2).numpy(), method="tome", r=8)
    assert artifact.manifest["model"]["source"]["rebuild"]["model"] == "deit_small_patch16_224"


class Renamed(VisionTransformer):
    """A subclass of the caller's own, adding nothing to the forward: runnable, but timm cannot build it by name."""

    note = "mine"


def test_an_object_that_cannot_be_rebuilt_validates_in_its_process_and_the_cli_says_why_later(tmp_path):
    model = Renamed(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2, num_classes=10)
    with pytest.warns(NotRebuildableWarning) as warned:
        artifact = deploytk.export(model, tmp_path / "art", r=2)
    assert not artifact.rebuildable and "its class test_api.Renamed is not one timm builds by name" in artifact.rebuild_problem
    assert [str(w.message) for w in warned] == artifact.notes and len(artifact.notes) == 1
    assert artifact.notes[0].startswith("the model object (test_api.Renamed) cannot be rebuilt in another process: its class")
    source = artifact.manifest["model"]["source"]
    assert source["rebuild"] is None and "is not one timm builds by name" in source["cannot_rebuild"]
    assert source["files"] == {} and not (artifact.directory / "source").exists()
    assert artifact.validate(num_samples=4, batch_size=4).passed  # this process holds the reference
    cli = deploytk_cli("validate", artifact.directory, "--num-samples", 4)
    assert cli.returncode == 2
    message = " ".join(cli.stderr.split())
    assert "was exported from a Python object (test_api.Renamed) that cannot be rebuilt in another process" in message
    assert "Validate it there (`artifact.validate()` on what deploytk.export returned)" in message


def as_in_another_process(monkeypatch, artifact) -> None:
    """What a new process sees of ``artifact``, without starting one: nothing holds the model object it was exported from,
    so its reference is rebuilt from the files stored in it (``deploytk validate DIR`` elsewhere takes the same path)."""
    monkeypatch.delitem(deploytk_models._HELD, artifact.manifest["config"]["model"])


def test_an_avg_pooled_timm_object_validates_in_another_process(tmp_path, monkeypatch):
    """Issue 53: `global_pool='avg'` puts the final norm after the pool (fc_norm); the recipe stored in the artifact rebuilt
    a model without it, and `deploytk validate` in a new process refused what the exporting process validated."""
    model = changed_weights(small_timm(num_classes=10, global_pool="avg", class_token=False), seed=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportNotice)  # nothing to say about this export
        artifact = deploytk.export(model, tmp_path / "art", method="tome", r=2)
    assert artifact.rebuildable and artifact.rebuild_problem is None and artifact.notes == []
    kwargs = artifact.manifest["model"]["source"]["rebuild"]["model_kwargs"]
    assert (kwargs["global_pool"], kwargs["class_token"], kwargs["num_classes"]) == ("avg", False, 10)
    as_in_another_process(monkeypatch, artifact)
    report = deploytk.load(artifact.directory).validate(num_samples=4, batch_size=4)
    assert report.passed and report["backends"] == ["ort"], report


def test_an_object_whose_stored_recipe_does_not_rebuild_it_is_said_at_export_without_the_temporary_folder(tmp_path, monkeypatch):
    """A module added after `timm.create_model` (here an fc_norm timm would not build for a token pool) is in the weights,
    not in the recipe: export says so at once (warning, artifact fields), and the refusal in a later process names the
    reason, never the temporary folder the rebuild was tried in."""
    model = small_timm(num_classes=3)
    model.fc_norm = torch.nn.LayerNorm(64)
    with pytest.warns(NotRebuildableWarning, match=r"cannot be rebuilt in another process: rebuilding it from its stored"):
        artifact = deploytk.export(model, tmp_path / "art", r=2)
    why = artifact.rebuild_problem
    assert not artifact.rebuildable
    assert why == (
        "rebuilding it from its stored weights and architecture failed: checkpoint model.safetensors does not match model "
        "VisionTransformer: 2 unexpected parameter(s), e.g. ['fc_norm.bias', 'fc_norm.weight']"
    )
    assert "deploytk-source" not in json.dumps(artifact.manifest)
    as_in_another_process(monkeypatch, artifact)
    before = snapshot(tmp_path)
    with pytest.raises(DeploytkError) as refused:
        deploytk.load(artifact.directory).validate(num_samples=4)
    assert f"cannot be rebuilt in another process: {why}; its PyTorch reference existed only" in refused.value.message
    assert "deploytk-source" not in str(refused.value) and snapshot(tmp_path) == before


def test_a_capped_r_is_recorded_as_it_runs_and_said_at_export(tmp_path):
    """Issue 53: r=200 on a 65-token model ran capped per block while the manifest recorded r=200, without a word."""
    model = small_timm(num_classes=3)  # 32x32, patch 4: 64 patches + the class token, 4 blocks
    with pytest.warns(ExportNotice) as warned:
        artifact = deploytk.export(model, tmp_path / "art", method="tome", r=200)
    effective = [32, 16, 8, 4]
    assert artifact.manifest["config"]["merge"]["r"] == effective
    schedule = artifact.manifest["schedule"]
    assert schedule["effective_r"] == effective and schedule["requested_r"] == [200] * 4 and schedule["configured_r"] == 200
    assert (
        [str(w.message) for w in warned]
        == artifact.notes
        == [
            f"r = 200 (`merge.r`) capped to {effective} per block: a block cannot merge away more than half of its tokens "
            "(ToMe's rule, protected tokens not counted); the manifest records the capped r, the schedule that runs"
        ]
    )
    assert not isinstance(warned[0].message, NotRebuildableWarning) and artifact.rebuildable
    assert f"r={effective}" in repr(artifact)
    inspected = artifact.inspect()  # the recorded config rebuilds the same schedule, now uncapped
    assert inspected["r"] == effective and inspected["effective_r"] == effective and inspected["capped"] is False
    assert inspected["tokens_per_layer"] == schedule["tokens_per_layer"] == [65, 33, 17, 9]


def test_a_subclass_that_overrides_forward_is_refused_and_nothing_is_written(tmp_path):
    class Doubled(VisionTransformer):
        def forward(self, x):
            return 2 * super().forward(x)

    model = Doubled(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=2, num_classes=10)
    before = snapshot(tmp_path)
    with pytest.raises(DeploytkError, match=r"Doubled overrides VisionTransformer.forward"):
        deploytk.export(model, tmp_path / "art")
    assert snapshot(tmp_path) == before


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_changed_stored_weights_are_refused_when_the_reference_is_rebuilt(tmp_path):
    artifact = deploytk.export(small_timm(num_classes=3), tmp_path / "art", r=2)
    weights = artifact.directory / "source" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    cli = deploytk_cli("validate", artifact.directory, "--num-samples", 4)
    assert cli.returncode == 2
    assert "the stored weights of the model object" in cli.stderr and "was changed after export" in " ".join(cli.stderr.split())


@pytest.mark.parametrize(
    "key, name, r",
    [("deit_tiny_r13", "deit_tiny_patch16_224", 13), ("deit_tiny_distilled_r8_inflect", "deit_tiny_distilled_patch16_224", (8, -1.0))],
)
def test_patch_equals_the_official_tome_patch(key, name, r):
    """deploytk.patch against the logits recorded from facebookresearch/ToMe's `tome.patch.timm` on the same weights."""
    model = seeded_init(timm.create_model(name), seed=1)
    before = state_of(model)
    merged = deploytk.patch(model, "tome", r=r)
    with torch.no_grad():
        got = merged(seeded_images(2, seed=2)).numpy()
    np.testing.assert_allclose(got, RECORDED_TOME[key], rtol=0, atol=1e-4)
    assert_unchanged(model, before, type(model), False)


def test_method_options_are_keywords_checked_by_the_method(tmp_path):
    model = small_timm(num_classes=3)
    before = snapshot(tmp_path)
    with pytest.raises(DeploytkError) as bad:
        deploytk.export(model, tmp_path / "a", method="evit", keep_rate=3.0)
    assert "invalid arguments to deploytk.export(): `keep_rate=3.0`: Input should be less than or equal to 1" in str(bad.value)
    with pytest.raises(DeploytkError, match=r"unknown option `bogus` for method tome"):
        deploytk.export(model, tmp_path / "a", bogus=1)
    with pytest.raises(DeploytkError, match=r"`r=-1`: r must not be negative"):
        deploytk.export(model, tmp_path / "a", r=-1)
    with pytest.raises(DeploytkError, match=r"`img_size=64`, but the model object is built for 32x32"):
        deploytk.export(model, tmp_path / "a", img_size=64)
    with pytest.raises(DeploytkError, match=r"`model` is a dict"):
        deploytk.export({"not": "a model"}, tmp_path / "a")
    assert snapshot(tmp_path) == before


def test_names_configs_and_config_objects_are_models_too(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("model: vit_tiny_patch16_224\nmodel_kwargs: {depth: 2}\nmerge: {method: tome, r: 4}\nexport: {img_size: 32}\n")
    from_yaml = deploytk.inspect(config)
    assert from_yaml["model"] == "vit_tiny_patch16_224" and from_yaml["r"] == 4
    overridden = deploytk.inspect(config, r="2,2")  # the CLI's r syntax works too
    assert overridden["r"] == [2, 2]
    switched = deploytk.inspect(config, method="evit", keep_rate=0.5, layers=[1])  # the config's r was tome's: evit drops it
    assert switched["method"] == "evit" and switched["r"] is None and switched["method_options"]["keep_rate"] == 0.5
    with pytest.raises(DeploytkError, match=r"invalid arguments to deploytk.inspect\(\): method evit does not use `r`"):
        deploytk.inspect(config, method="evit", r=4)
    # a keyword left out keeps the config's value
    assert deploytk.inspect(deploytk.api.inputs.resolve(config, "t")[0])["r"] == 4


def test_reports_print_a_line_and_a_table(tmp_path):
    report = deploytk.inspect(small_timm(num_classes=3), r=2)
    assert repr(report).startswith("InspectReport(model='memory:VisionTransformer-") and "gflops=" in repr(report)
    assert "<table>" in report._repr_html_() and "flop_reduction" in report._repr_html_()
    methods = deploytk.methods()
    assert "tome" in methods.names() and methods.to_dict() == {"methods": list(methods)}
    assert "timm" in deploytk.families().names()


def test_load_refuses_what_is_not_an_artifact(tmp_path):
    with pytest.raises(DeploytkError, match=r"does not exist"):
        deploytk.load(tmp_path / "missing")


def test_import_deploytk_is_light_and_names_the_api():
    code = "import sys, deploytk; print(sorted(m for m in ('torch', 'onnx', 'timm') if m in sys.modules)); print('export' in dir(deploytk))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.split() == ["[]", "True"], out.stderr


def docstring_examples() -> list[tuple[str, str]]:
    """(where, code) of every ```python block in the docstrings of deploytk/ (the API's are the ones that have them)."""
    import ast
    import re

    found = []
    for path in sorted((ROOT / "deploytk").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True) or ""
                for block in re.findall(r"^```python\n(.*?)^```", doc, flags=re.M | re.S):
                    found.append((f"{path.relative_to(ROOT)}:{getattr(node, 'name', '<module>')}", block))
    return found


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_every_docstring_example_runs(tmp_path):
    examples = docstring_examples()
    assert {where.split(":")[1] for where, _ in examples} >= {"export", "patch"}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for where, code in examples:
        done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"the example in {where} failed:\n{code}\n{done.stderr[-3000:]}"


def test_deploytk_lazily_names_exactly_the_api():
    """deploytk/__init__.py lists the API's names by hand (importing deploytk.api there would load torch): the list must
    stay deploytk.api's, and each name must resolve to the API's object."""
    import deploytk.api

    assert sorted(set(deploytk.__all__) - {"__version__"}) == sorted(deploytk.api.__all__)
    assert all(getattr(deploytk, name) is getattr(deploytk.api, name) for name in deploytk.api.__all__)
