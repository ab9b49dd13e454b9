"""The one vocabulary of deploytk's CLI options and Python keywords: every name a command or an API call takes, what it
means, and the old spellings that still work for one release.

A CLI option is the keyword with dashes for underscores (``flag``); the same name means the same thing on every
command and in every API call. ``tests/test_vocabulary.py`` walks every command's parameters and every
API function's and fails on a name outside ``TERMS``; the CLI reference prints the table. A rename goes in
``RENAMED``: the CLI rewrites the old flag (and ``deploytk.api`` the old keyword) with a one-line deprecation note.
"""

from __future__ import annotations

#: name -> what it means, wherever it appears
TERMS: dict[str, str] = {
    # what a command acts on (positional on the CLI)
    "config": "an export config: a YAML file or a ready-made config's name",
    "model": "the model: a timm name, hf:<folder or Hub id>, a config, or (Python) a model object; as an override, the config's model",
    "directory": "an export's folder (what export wrote)",
    "path": "the folder clean looks in",
    "contains": "configs: the text a listed config's name, model or method contains",
    # the config overrides (any command that reads a config)
    "method": "the token-reduction method (deploytk methods)",
    "r": "tokens merged per block: an int, one per block (8,8,4,...) or r:inflection",
    "precision": "the graph's precision: fp32, fp16 or bf16",
    "output_kind": "what the graph outputs: logits, embedding, patch_features or tokens",
    "img_size": "the input size, one int or H,W",
    "feature_layer": "patch_features / tokens: the hidden state after this many blocks (negative: from the end)",
    "checkpoint": "the weights: a .safetensors / .pth state dict or a JAX .npz",
    "options": "(Python) method options as a dict",
    "method_options": "(Python) method options as keywords",
    "prop_attn": "(Python) proportional attention on or off",
    # inputs
    "data": "a folder of inputs: images, clips or sounds as the model takes (eval, tune: one subfolder per class)",
    "image": "visualize: the one input file drawn",
    "images": "(Python) Artifact.preprocess: the images to preprocess",
    "inputs": "(Python) a runner's input: images, or the model's own float input",
    "preprocess": "(Python) export: the input pipeline to record (a record as Artifact.preprocessing shows one)",
    "synthetic": "this many seeded synthetic inputs instead of data",
    "num_samples": "how many inputs are used",
    # sizes and runs
    "batch_size": "one batch size",
    "batch_sizes": "several batch sizes (a list, or 1,8,32); build: the engine profile min,opt,max",
    "max_batch": "package: Triton's max_batch_size",
    "warmup": "untimed runs before timing",
    "iterations": "timed runs",
    "seed": "the seed of drawn inputs",
    # where it runs
    "backend": "the runtime: ort, ort-cuda, openvino, torch or trt (package: the Triton backend, quantize: the int8 target)",
    "artifacts": "eval, visualize: an export of the config to use instead of a temporary one",
    # what it writes
    "output": "what the command creates: a folder (export, quantize), a file (calibrate, tune, visualize)",
    "fmt": "export: the files written (onnx, onnx-inlined, onnx-ort); the CLI's format option",
    "force": "replace an earlier output of the same command",
    "triton": "package: the Triton model repository",
    "name": "package: the model's name in the repository",
    "cache": "tune: the measurement cache file",
    "dry_run": "clean: list only",
    "json_out": "print the result as one JSON object (the CLI's json option)",
    "markdown": "methods: print the README's Markdown table",
    "progress": "(Python) where progress is reported",
    "command_line": "(Python) tune: how the report's reproducing command is spelt",
    "config_name": "(Python) how reports name the model",
    # validate's tolerances
    "atol": "validate: absolute tolerance",
    "rtol": "validate: relative tolerance",
    "min_cosine": "validate: smallest per-input cosine similarity",
    "min_top1_agreement": "validate: smallest top-1 agreement (the CLI's min-top1 option)",
    "max_flipped_choices": "validate: largest share of matching decisions flipped at proven near-ties",
    "max_branch_flips": "validate: deprecated, the largest share of images with a flip",
    # the other commands' own
    "budget_ms": "tune: the latency budget",
    "percentile": "tune: the latency statistic held to the budget (p50, p90, p99)",
    "inflections": "tune: the inflections tried (tome, mctf)",
    "quantile": "calibrate: the per-layer quantile of ATM's r",
    "layers": "visualize: the blocks drawn",
    "schedules": "(Python) inspect: several r schedules in one run (the CLI gives r several times)",
    "colors": "visualize: how a token's patches are coloured",
    "merge_impl": "build: plugin or native merging ops",
    "attention_impl": "build: plugin or native attention",
    "opt_level": "build: TensorRT's builder optimisation level",
    "timing_cache": "build: TensorRT's timing cache file",
    "baseline": "build: also build the dense baseline engine",
    "arch": "plugins compile: the GPU architecture",
    "version": "print deploytk's version",
    "verbose": "let the libraries' warnings through",
}

#: command -> {old name: new name}: old spellings that still work for one release, with a deprecation note
RENAMED: dict[str, dict[str, str]] = {
    "validate": {"images": "data", "num_images": "num_samples"},
    "calibrate": {"images": "data", "num_images": "num_samples"},
    "quantize": {"runtime": "backend", "num_images": "num_samples"},
    "package": {"runtime": "backend", "images": "data"},
    "eval": {"limit": "num_samples"},
    "tune": {"batch": "batch_size", "limit": "num_samples"},
    "build": {"batch": "batch_sizes"},
}

#: (command, new name) -> {old value: new value}: values renamed with their option
RENAMED_VALUES: dict[tuple[str, str], dict[str, str]] = {("package", "backend"): {"onnxruntime": "ort", "tensorrt": "trt"}}


def flag(name: str) -> str:
    """The CLI option of keyword ``name``."""
    return "--" + name.replace("_", "-")


def note(command: str, old: str, new: str) -> str:
    return f"{flag(old)} is now {flag(new)} on `deploytk {command}` (the old name goes in the next release)"
