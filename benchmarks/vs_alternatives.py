"""deploytk against what a user would otherwise run on a CPU: the adoption question of issue 44.

Rows are model x method x batch size (default DeiT-S and DeiT-B, ToMe r=16 and MCTF r=16, batch 1 and 8). Each row
runs in its own child process (this script re-invoked with ``--row``), so one row's compiled code and thread pools never
touch the next. In a row: a seeded timm model, ``deploytk.export`` of that object, then every contender of
``CONTENDERS`` (one line each):

- deploytk on ONNX Runtime (the export's fused copy, ``fmt='onnx-ort'``, and model.onnx as exported) and OpenVINO
  (loaded as ``deploytk profile`` loads them), and int8 on each runtime (``Artifact.quantize`` calibrated on synthetic
  images: the JSON says so);
- the official code in eager PyTorch and under ``torch.compile``: the ToMe patch (facebookresearch/ToMe) in ToMe rows,
  MCTF's own DeiT class with the timm model's weights (mlvlab/MCTF) in MCTF rows. It is never part of this repository:
  the script looks in ``--official-tome PATH`` / ``--official-mctf PATH`` or ``$DEPLOYTK_OFFICIAL_TOME`` /
  ``$DEPLOYTK_OFFICIAL_MCTF`` and records a skip saying where it looked when the code is not there; where no official
  contender got ready on a runtime, deploytk's own PyTorch reference (``deploytk.patch``) takes its place;
- the dense model under ``torch.compile``, the dense ONNX through ONNX Runtime's transformers optimizer as a user would
  call it (its fused operator counts recorded), the dense ONNX fused as deploytk fuses its own (the ``deploytk_ort``
  speedup's baseline) and the plain dense ONNX on ONNX Runtime and OpenVINO.

All of them share the process's two cores in turn. ONNX Runtime's intra-op threads do not spin between runs, and
OpenVINO's threads are not pinned to cores (``ENABLE_CPU_PINNING`` off): pinned, they slowed the next torch.compile run
of DeiT-T at batch 1 1.8x (31.6 -> 57.0 ms, ``/tmp`` experiment of 2026-11-27, see the issue 44 note), a handicap of
the alternation, not of torch. torch's own OpenMP threads keep their default (spinning) policy, which if anything
slows the runtimes that run after it.

Before timing, every contender's output is compared with the PyTorch reference (reduced or dense): fp32 within 1e-3
max abs diff, else the contender is recorded as differing and not timed; int8 records top-1 agreement and cosine.
Timing: warm-up, then alternating rounds over the contenders (the start rotates each round), medians; compile and
setup times apart. Ratios: each median over deploytk's best fp32 and best int8 path (> 1: deploytk is that much
faster), speedup over the dense model on the same runtime and ``efficiency`` = speedup / FLOPs ratio.

    python benchmarks/vs_alternatives.py --official-tome ~/src/ToMe --official-mctf ~/src/MCTF   # everything
    python benchmarks/vs_alternatives.py --models deit_small_patch16_224 --methods tome --batch-sizes 8
    python benchmarks/vs_alternatives.py --markdown benchmarks/results/vs_alternatives_amd_epyc.json
    python benchmarks/vs_alternatives.py --smoke --output /tmp/v.json       # tiny ViT, one iteration: does it run
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import cpu_result_output, write_result  # noqa: E402

#: where the official code of a method is looked for: (environment variable, a file the checkout has, its repository)
OFFICIAL = {
    "tome": ("DEPLOYTK_OFFICIAL_TOME", "tome/patch/timm.py", "facebookresearch/ToMe"),
    "mctf": ("DEPLOYTK_OFFICIAL_MCTF", "models/deit.py", "mlvlab/MCTF"),
}
#: fp32 contenders must match their PyTorch reference this closely (max abs diff of the logits) to be timed
TOLERANCE = 1e-3
#: the tiny timm ViT of --smoke: 32x32 images, 4x4 patches, two blocks (65 tokens)
SMOKE_MODEL = {"name": "vit_tiny_patch16_224", "kwargs": {"img_size": 32, "patch_size": 4, "depth": 2, "num_classes": 10}}
SMOKE_R = 8  # enough merging that the reduced logits differ from the dense ones by several times TOLERANCE
#: the packages whose versions the JSON records (beyond deploytk's manifest list)
VERSIONED = ("torch", "timm", "onnxruntime", "openvino", "nncf", "onnx")
ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


class Skip(Exception):
    """A contender that cannot run here, with the reason the JSON records."""


@dataclass
class Ready:
    """A contender loaded: ``run(x)`` -> first output as numpy, ``timer()`` -> seconds of one run of the row's batch."""

    run: Callable
    timer: Callable[[], float]
    info: dict = field(default_factory=dict)


@dataclass
class Row:
    """What a row's contenders share: the seeded model, the export, the input, the caches of loaded runtimes."""

    spec: dict
    model: object
    artifact: object  # deploytk.Artifact
    x: object  # numpy [batch, 3, H, W]
    tmp: Path
    cache: dict = field(default_factory=dict)

    def once(self, key, make):
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


# ---- the contenders' factories -------------------------------------------------------------------------------------


def _cpu_threads() -> int:
    from deploytk.backends.openvino_backend import cpu_threads

    return cpu_threads()


def _loaded(row: Row, runtime: str, int8: bool):
    """(merged, dense) as ``deploytk profile`` loads them (ORT sessions with spinning off; OpenVINO static batch)."""

    def make():
        from deploytk.backends import get_backend
        from deploytk.exporter.artifacts import Artifact

        t0 = time.perf_counter()
        directory = row.artifact.directory
        info = {}
        if int8:
            quantized = row.artifact.quantize(runtime, output=row.tmp / f"int8-{runtime}", synthetic=row.spec["calibration_images"])
            directory = quantized.directory
            info["quantize_s"] = round(time.perf_counter() - t0, 1)
        art = Artifact.open(directory)
        merged, dense = get_backend(runtime).load_for_timing(art, [row.spec["batch"]])
        from deploytk.backends.openvino_backend import OpenVinoModel

        if isinstance(merged, OpenVinoModel):  # its pinned threads slowed torch.compile's batch-1 runs in this process (docstring)
            for model in (merged, dense):
                model.config["ENABLE_CPU_PINNING"] = False
                model.batch_size = model.compiled = None  # compiled again, unpinned, at the next request
                model.request(row.spec["batch"])
        info["setup_s"] = round(time.perf_counter() - t0, 1)
        return merged, dense, art.output_name, info

    return row.once((runtime, int8), make)


def ort_plain(dense: bool = False):
    """model.onnx (or the plain dense export) on ONNX Runtime, without the fused copy the row's export also has."""

    def factory(row: Row) -> Ready:
        from deploytk.backends.ort import OrtModel, ort_session
        from deploytk.exporter.artifacts import Artifact
        from deploytk.exporter.baseline import baseline_onnx

        art = Artifact.open(row.artifact.directory)
        path = baseline_onnx(art) if dense else art.onnx_path
        model = OrtModel(ort_session(path, "ort", spinning=False), art.input_kind, file=path.name)
        return Ready(lambda x: model.run(x)[art.output_name], model.timer(row.spec["batch"]), {"settings": model.settings()})

    return factory


def deploytk_runtime(runtime: str, int8: bool = False, dense: bool = False):
    def factory(row: Row) -> Ready:
        merged, baseline, output, info = _loaded(row, runtime, int8)
        model = baseline if dense else merged
        return Ready(lambda x: model.run(x)[output], model.timer(row.spec["batch"]), {**info, "settings": model.settings()})

    return factory


def _torch_ready(module, row: Row, compiled: bool, info: dict | None = None) -> Ready:
    import torch

    x = torch.from_numpy(row.x)
    info = {**(info or {}), "torch_threads": torch.get_num_threads()}
    if compiled:
        module = torch.compile(module)
        t0 = time.perf_counter()
        with torch.inference_mode():
            module(x)
        info["compile_s"] = round(time.perf_counter() - t0, 1)

    def run(batch):
        with torch.inference_mode():
            out = module(torch.from_numpy(batch))
        return _first_tensor(out).numpy()

    def timer() -> float:
        with torch.inference_mode():
            t0 = time.perf_counter()
            module(x)
            return time.perf_counter() - t0

    return Ready(run, timer, info)


def official_path(spec: dict, method: str) -> Path:
    """The checkout of ``method``'s official code to import (``--official-tome``/``--official-mctf`` or their environment
    variables), or Skip saying where the script looked."""
    env, marker, repo = OFFICIAL[method]
    flag = f"--official-{method}"
    where = spec["official"].get(method)
    if not where:
        raise Skip(f"official {method} code not given: pass {flag} PATH or set {env} (a checkout of {repo})")
    if not (Path(where) / marker).is_file():
        raise Skip(f"official {method} code not found: {where}/{marker} does not exist ({flag} / {env})")
    return Path(where)


def official_tome(compiled: bool):
    def factory(row: Row) -> Ready:
        sys.path.insert(0, str(official_path(row.spec, "tome")))
        import tome  # the official code, from the folder above; never part of this repository

        model = copy.deepcopy(row.model)
        tome.patch.timm(model)
        model.r = row.spec["r"]
        return _torch_ready(model, row, compiled, {"official": "facebookresearch/ToMe: tome.patch.timm(model); model.r = r"})

    return factory


#: the official MCTF code's DeiT constructors, by timm name
MCTF_MODELS = {"deit_tiny_patch16_224": "deit_tiny", "deit_small_patch16_224": "deit_small", "deit_base_patch16_224": "deit_base"}


def official_mctf(compiled: bool):
    """mlvlab/MCTF's own DeiT class (models/deit.py) with the timm model's weights, set as its run/eval_deit_*_mctf.sh
    evaluate: r in blocks 1..depth-1, prop. attention, one-step-ahead 1, taus (1, 20, 40), bidirectional, pooling 1."""

    def factory(row: Row) -> Ready:
        import torch

        path = official_path(row.spec, "mctf")
        if row.spec["model"] not in MCTF_MODELS:
            raise Skip(f"the official MCTF code defines {', '.join(MCTF_MODELS)} only, not {row.spec['model']}")
        sys.path.insert(0, str(path))
        from models import deit  # the official code, from the folder above; never part of this repository

        depth, r = len(row.model.blocks), row.spec["r"]
        settings = {"mctf_type": [r, 0, 0, 1, 1, 1, 20, 40, 1, 1, 0], "task_type": [1, 0, 0, 0], "activate_layer": list(range(1, depth))}
        official = getattr(deit, MCTF_MODELS[row.spec["model"]])(use_mctf=True, **settings).eval()
        official.load_state_dict(row.model.state_dict())  # strict: the same parameter names as timm's

        class WithR(torch.nn.Module):  # the official forward takes r as an argument (r_eval)
            def __init__(self):
                super().__init__()
                self.official = official

            def forward(self, x):
                return self.official(x, r_eval=r)

        return _torch_ready(WithR().eval(), row, compiled, {"official": f"mlvlab/MCTF at {path}", "official_settings": settings})

    return factory


def deploytk_reference(compiled: bool):
    def factory(row: Row) -> Ready:
        import deploytk

        return _torch_ready(deploytk.patch(row.model, row.spec["method"], r=row.spec["r"]).eval(), row, compiled)

    return factory


def dense_torch(compiled: bool):
    def factory(row: Row) -> Ready:
        return _torch_ready(copy.deepcopy(row.model), row, compiled)

    return factory


def dense_ort_optimized(row: Row) -> Ready:
    """deploytk's dense ONNX through onnxruntime.transformers.optimizer (model_type vit: attention, LayerNorm, GELU fused)."""
    from onnxruntime.transformers.optimizer import optimize_model

    from deploytk.backends.ort import OrtModel, ort_session
    from deploytk.exporter.artifacts import Artifact
    from deploytk.exporter.baseline import baseline_onnx

    art = Artifact.open(row.artifact.directory)
    t0 = time.perf_counter()
    dense = baseline_onnx(art)
    attn = row.model.blocks[0].attn
    optimized = optimize_model(str(dense), model_type="vit", num_heads=attn.num_heads, hidden_size=row.model.embed_dim)
    path = row.tmp / "dense_ort_optimized.onnx"
    optimized.save_model_to_file(str(path))
    stats = dict(optimized.get_fused_operator_statistics())  # zeros kept: an unfused Attention shows as 0
    model = OrtModel(ort_session(path, "ort", spinning=False), art.input_kind)
    info = {"setup_s": round(time.perf_counter() - t0, 1), "fused_operators": stats, "settings": model.settings()}
    info["optimizer"] = {
        "model_type": "vit",
        "num_heads": attn.num_heads,
        "hidden_size": row.model.embed_dim,
        "opt_level": "default (1 for vit)",
    }
    return Ready(lambda x: model.run(x)[art.output_name], model.timer(row.spec["batch"]), info)


@dataclass(frozen=True)
class Contender:
    factory: Callable[[Row], Ready]
    precision: str  # fp32 or int8
    runtime: str
    reference: str  # the PyTorch model its outputs are held to: "reduced" or "dense"
    deploytk: bool = False  # one of deploytk's own paths (the ratios' denominators)
    baseline: str | None = None  # the dense contender on the same runtime: speedup and efficiency
    methods: tuple[str, ...] | None = None  # only rows of these methods (None: every row)
    official: bool = False  # the method's official code
    fallback: bool = False  # only where no official contender on the same runtime got ready in this row
    compiles: bool = False  # torch.compile: left out of --smoke


#: every contender, one line each; the order is the table's
CONTENDERS: dict[str, Contender] = {
    "deploytk_ort": Contender(deploytk_runtime("ort"), "fp32", "onnxruntime", "reduced", True, "dense_ort_fused"),
    "deploytk_ort_plain": Contender(ort_plain(), "fp32", "onnxruntime", "reduced", True, "dense_ort"),
    "deploytk_openvino": Contender(deploytk_runtime("openvino"), "fp32", "openvino", "reduced", True, "dense_openvino"),
    "deploytk_ort_int8": Contender(deploytk_runtime("ort", int8=True), "int8", "onnxruntime", "reduced", True, "dense_ort_int8"),
    "deploytk_openvino_int8": Contender(
        deploytk_runtime("openvino", int8=True), "int8", "openvino", "reduced", True, "dense_openvino_int8"
    ),
    "tome_official_eager": Contender(official_tome(False), "fp32", "torch eager", "reduced", methods=("tome",), official=True),
    "tome_official_compile": Contender(
        official_tome(True), "fp32", "torch.compile", "reduced", baseline="dense_compile", methods=("tome",), official=True, compiles=True
    ),
    "mctf_official_eager": Contender(official_mctf(False), "fp32", "torch eager", "reduced", methods=("mctf",), official=True),
    "mctf_official_compile": Contender(
        official_mctf(True), "fp32", "torch.compile", "reduced", baseline="dense_compile", methods=("mctf",), official=True, compiles=True
    ),
    "deploytk_reference_eager": Contender(deploytk_reference(False), "fp32", "torch eager", "reduced", fallback=True),
    "deploytk_reference_compile": Contender(
        deploytk_reference(True), "fp32", "torch.compile", "reduced", baseline="dense_compile", fallback=True, compiles=True
    ),
    "dense_compile": Contender(dense_torch(True), "fp32", "torch.compile", "dense", compiles=True),
    "dense_ort_optimized": Contender(dense_ort_optimized, "fp32", "onnxruntime", "dense"),
    "dense_ort_fused": Contender(deploytk_runtime("ort", dense=True), "fp32", "onnxruntime", "dense"),
    "dense_ort": Contender(ort_plain(dense=True), "fp32", "onnxruntime", "dense"),
    "dense_openvino": Contender(deploytk_runtime("openvino", dense=True), "fp32", "openvino", "dense"),
    "dense_ort_int8": Contender(deploytk_runtime("ort", int8=True, dense=True), "int8", "onnxruntime", "dense"),
    "dense_openvino_int8": Contender(deploytk_runtime("openvino", int8=True, dense=True), "int8", "openvino", "dense"),
}


# ---- one row, in its own process -----------------------------------------------------------------------------------


def _first_tensor(out):
    if isinstance(out, dict):
        out = next(iter(out.values()))
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out


def _compare(out, reference, precision: str) -> dict:
    import numpy as np

    out, reference = np.asarray(out, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if out.shape != reference.shape:
        return {"ok": False, "shape": list(out.shape), "reference_shape": list(reference.shape)}
    diff = float(np.abs(out - reference).max())
    cosine = float((out * reference).sum() / (np.linalg.norm(out) * np.linalg.norm(reference) + 1e-30))
    top1 = float((out.argmax(-1) == reference.argmax(-1)).mean())
    if precision == "fp32":
        return {"ok": diff <= TOLERANCE, "max_abs_diff": diff, "tolerance": TOLERANCE}
    return {"ok": True, "top1_agreement": top1, "cosine": round(cosine, 6), "max_abs_diff": diff}


def run_row(spec: dict) -> dict:
    import numpy as np
    import timm
    import torch

    import deploytk
    from deploytk.backends.base import seeded_batch

    torch.set_num_threads(_cpu_threads())
    torch.manual_seed(spec["seed"])
    model = timm.create_model(spec["model"], **spec["model_kwargs"]).eval()
    result = {k: spec[k] for k in ("model", "method", "r", "batch")}
    # the 1/5/15-minute load averages before and after: on a shared machine, other work shows up here (and in the samples)
    result["load_average"] = {"before": [round(v, 2) for v in os.getloadavg()]}
    with tempfile.TemporaryDirectory(prefix="deploytk-vs-alt-") as tmp:
        os.environ["DEPLOYTK_CACHE"] = str(Path(tmp) / "cache")  # dense baselines of this row, removed with it
        t0 = time.perf_counter()
        artifact = deploytk.export(
            model, Path(tmp) / "export", method=spec["method"], r=spec["r"], batch_size=spec["batch"], fmt="onnx-ort"
        )
        result["export_s"] = round(time.perf_counter() - t0, 1)
        manifest = artifact.manifest
        result |= {"gflops": round(manifest["gflops"], 3), "dense_gflops": round(manifest["dense_gflops"], 3)}
        result["flops_ratio"] = round(manifest["dense_gflops"] / manifest["gflops"], 3)
        row = Row(spec, model, artifact, seeded_batch(spec["batch"], artifact.input_kind), Path(tmp))
        with torch.inference_mode():
            references = {"dense": _first_tensor(model(torch.from_numpy(row.x))).numpy()}
            references["reduced"] = _first_tensor(
                deploytk.patch(model, spec["method"], r=spec["r"]).eval()(torch.from_numpy(row.x))
            ).numpy()
        # how far the reduced model is from the dense one: the scale against which the contenders' differences are small
        result["reduced_vs_dense_max_abs_diff"] = float(np.abs(references["reduced"] - references["dense"]).max())
        contenders, ready = {}, {}
        for name in spec["contenders"]:
            c = CONTENDERS[name]
            entry = {"precision": c.precision, "runtime": c.runtime, "reference": c.reference, "deploytk": c.deploytk}
            contenders[name] = entry
            if c.methods and spec["method"] not in c.methods:
                entry["status"] = f"not in {spec['method']} rows"
                continue
            if c.fallback and any(CONTENDERS[n].official and CONTENDERS[n].runtime == c.runtime for n in ready):
                entry["status"] = "not needed: the official code ran on this runtime"
                continue
            if c.compiles and spec["smoke"]:
                entry["status"] = "skipped: --smoke leaves torch.compile out (tens of seconds per model)"
                continue
            t0 = time.perf_counter()
            try:
                loaded = c.factory(row)
                entry |= loaded.info
                entry["compared"] = _compare(loaded.run(row.x), references[c.reference], c.precision)
            except Skip as err:
                entry["status"] = f"skipped: {err}"
                continue
            except Exception as err:  # noqa: BLE001 (one contender failing must not lose the others)
                entry["status"] = f"failed: {type(err).__name__}: {str(err).strip()[:300]}"
                continue
            entry["load_s"] = round(time.perf_counter() - t0, 1)
            if not entry["compared"]["ok"]:
                entry["status"] = "outputs differ from the reference: not timed"
                continue
            entry["status"] = "timed"
            ready[name] = loaded
            print(f"  {name}: ready in {entry['load_s']} s, {entry['compared']}", file=sys.stderr, flush=True)
        times = {name: [] for name in ready}
        order = list(ready)
        for _ in range(spec["warmup"]):
            for name in order:
                ready[name].timer()
        for i in range(spec["iterations"] if order else 0):  # alternating rounds, the first contender rotating
            for name in order[i % len(order) :] + order[: i % len(order)]:
                times[name].append(ready[name].timer() * 1e3)
        for name, samples in times.items():
            contenders[name] |= {
                "median_ms": round(float(np.median(samples)), 3),
                "min_ms": round(min(samples), 3),
                "samples_ms": [round(s, 2) for s in samples],
            }
    result["load_average"]["after"] = [round(v, 2) for v in os.getloadavg()]
    result["contenders"] = contenders
    result["ratios"] = ratios(result)
    return result


def ratios(row: dict) -> dict:
    """Per timed contender: its median over deploytk's best fp32 / int8 median (> 1: deploytk is faster), and for the
    reduced ones with a dense contender on the same runtime, the speedup over it and speedup / FLOPs ratio."""
    timed = {n: c for n, c in row["contenders"].items() if "median_ms" in c}
    best = {}
    for precision in ("fp32", "int8"):
        own = {n: c["median_ms"] for n, c in timed.items() if c["deploytk"] and c["precision"] == precision}
        if own:
            name = min(own, key=own.get)
            best[precision] = {"contender": name, "median_ms": own[name]}
    out = {"deploytk_best": best, "contenders": {}}
    for name, c in timed.items():
        r = {f"x_vs_best_{p}": round(c["median_ms"] / b["median_ms"], 3) for p, b in best.items()}
        baseline = CONTENDERS[name].baseline
        if baseline in timed:
            speedup = timed[baseline]["median_ms"] / c["median_ms"]
            r |= {"dense_baseline": baseline, "speedup_vs_dense": round(speedup, 3), "efficiency": round(speedup / row["flops_ratio"], 3)}
        if name == "deploytk_ort" and "dense_ort_optimized" in timed:  # against the dense model as a user would optimize it
            r["speedup_vs_dense_ort_optimized"] = round(timed["dense_ort_optimized"]["median_ms"] / c["median_ms"], 3)
        out["contenders"][name] = r
    return out


# ---- the parent: rows as child processes, the JSON, the table ------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="deit_small_patch16_224,deit_base_patch16_224")
    p.add_argument("--methods", default="tome,mctf", help="Comma-separated merge.method names.")
    p.add_argument("--r", type=int, default=16)
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--contenders", default=",".join(CONTENDERS), help=f"Comma-separated subset of: {', '.join(CONTENDERS)}.")
    p.add_argument("--warmup", type=int, default=2, help="Rounds over every contender before timing.")
    p.add_argument("--iterations", type=int, default=12, help="Alternating timed rounds (>= 10).")
    p.add_argument("--calibration-images", type=int, default=64, help="Synthetic (seeded noise) images for the int8 calibration.")
    for method, (env, _, repo) in OFFICIAL.items():
        p.add_argument(f"--official-{method}", default=os.environ.get(env), metavar="PATH", help=f"A checkout of {repo} (default ${env}).")
    p.add_argument(
        "--smoke", action="store_true", help="A tiny timm ViT, ToMe r=8, batch 1, 1 iteration, no torch.compile: measures nothing."
    )
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: one row's spec (JSON), run in this process
    p.add_argument("--row-output", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def specs(args) -> list[dict]:
    unknown = sorted(set(args.contenders.split(",")) - set(CONTENDERS))
    if unknown:
        raise SystemExit(f"unknown contender(s) {', '.join(unknown)}; known: {', '.join(CONTENDERS)}")
    base = {
        "contenders": args.contenders.split(","),
        "official": {m: str(Path(p).expanduser().resolve()) if p else None for m in OFFICIAL if (p := getattr(args, f"official_{m}"))}
        | {m: None for m in OFFICIAL if not getattr(args, f"official_{m}")},
        "calibration_images": 8 if args.smoke else args.calibration_images,
        "warmup": 0 if args.smoke else args.warmup,
        "iterations": 1 if args.smoke else args.iterations,
        "smoke": args.smoke,
        "seed": 0,
    }
    if args.smoke:
        return [base | {"model": SMOKE_MODEL["name"], "model_kwargs": SMOKE_MODEL["kwargs"], "method": "tome", "r": SMOKE_R, "batch": 1}]
    return [
        base | {"model": m, "model_kwargs": {}, "method": method, "r": args.r, "batch": int(b)}
        for m in args.models.split(",")
        for method in args.methods.split(",")
        for b in args.batch_sizes.split(",")
    ]


def run_child(spec: dict, tmp: Path, i: int) -> dict:
    out = tmp / f"row{i}.json"
    t0 = time.perf_counter()
    # a fresh Inductor cache per row: torch.compile's on-disk cache would otherwise carry one row's (or run's) compiled code
    # into the next, and compile_s would time a cache hit
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp / f"row{i}-inductor")}
    command = [sys.executable, __file__, "--row", json.dumps(spec), "--row-output", str(out)]
    done = subprocess.run(command, stderr=subprocess.PIPE, text=True, env=env)
    seconds = round(time.perf_counter() - t0, 1)
    if done.returncode != 0 or not out.is_file():
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return {k: spec[k] for k in ("model", "method", "r", "batch")} | {
            "error": f"exit {done.returncode}: {tail[0][:300]}",
            "row_s": seconds,
        }
    return json.loads(out.read_text()) | {"row_s": seconds}


def cpuinfo_flags() -> list[str]:
    """The ISA flags of ISA_FLAGS that /proc/cpuinfo lists (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    flags = set(line.split(":", 1)[-1].split())
    return [f for f in ISA_FLAGS if f in flags]


def environment() -> dict:
    from importlib import metadata

    from deploytk.exporter.manifest import package_versions
    from deploytk.machine import host

    versions = package_versions()
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {**host(), "cpuinfo_flags": cpuinfo_flags(), "threads": _cpu_threads(), "versions": versions}


PROTOCOL = {
    "process": "one child process per row (model x method x batch)",
    "threads": "torch.set_num_threads(usable CPUs); ONNX Runtime sessions as deploytk profile opens them (one intra-op pool of "
    "the physical cores, spinning off); OpenVINO LATENCY hint, INFERENCE_NUM_THREADS = usable CPUs, static batch",
    "compared": f"every contender's first output against the PyTorch reference on the row's seeded batch before timing: fp32 max abs "
    f"diff <= {TOLERANCE} or not timed; int8: top-1 agreement and cosine recorded",
    "torch_compile": "default mode, a fresh Inductor cache per row (compile_s: a cold compile, the first call)",
    "timing": "warm-up rounds, then alternating rounds over the timed contenders (the first one rotating), medians",
    "ratios": "x_vs_best_fp32/int8 = contender median / deploytk's best fp32/int8 median (> 1: deploytk is that much faster); "
    "speedup_vs_dense = dense contender on the same runtime / contender; efficiency = speedup_vs_dense / FLOPs ratio (fvcore)",
    "int8_calibration": "synthetic: seeded standard-normal images (Artifact.quantize(synthetic=N)); ranges are not learned from "
    "real data, so the int8 accuracy figures mean nothing beyond agreement on this batch",
    "weights": "random (timm init under torch.manual_seed(0)): latency does not depend on them",
}


def markdown(result: dict) -> str:
    """One line per row and timed contender: median, ratios to deploytk's best paths, speedup over its dense baseline."""
    lines = [
        "| model | method | batch | contender | runtime | median ms | / best fp32 | / best int8 "
        "| speedup vs dense (efficiency) | outputs |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---|",
    ]
    notes = []
    for row in result["rows"]:
        head = [row["model"].replace("_patch16_224", ""), f"{row['method']} r={row['r']}", str(row["batch"])]
        if "error" in row:
            notes.append(f"{' '.join(head)}: {row['error']}")
            continue
        for name, c in row["contenders"].items():
            if "median_ms" not in c:
                if not c["status"].startswith("not in"):
                    notes.append(f"{' '.join(head)} {name}: {c['status']}")
                continue
            r = row["ratios"]["contenders"][name]
            compared = c["compared"]
            outputs = f"diff {compared['max_abs_diff']:.1e}" if c["precision"] == "fp32" else f"top-1 {compared['top1_agreement']:.2f}"
            speedup = f"{r['speedup_vs_dense']:.2f}x ({r['efficiency']:.2f})" if "speedup_vs_dense" in r else ""
            cells = [name, c["runtime"] + (" int8" if c["precision"] == "int8" else ""), f"{c['median_ms']:.1f}"]
            cells += [f"{r[k]:.2f}x" if k in r else "" for k in ("x_vs_best_fp32", "x_vs_best_int8")] + [speedup, outputs]
            lines.append("| " + " | ".join(head + cells) + " |")
    text = "\n".join(lines)
    return text + ("\n\nNot timed: " + "; ".join(notes) + "." if notes else "")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.row:
        result = run_row(json.loads(args.row))
        args.row_output.write_text(json.dumps(result))
        return 0
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    if not args.smoke and args.iterations < 10:
        raise SystemExit("--iterations must be >= 10 (medians of fewer alternating runs are too noisy on a shared machine)")
    rows_to_run = specs(args)
    out = cpu_result_output("vs_alternatives", "vs_alternatives.py", args.output)  # claimed before the run
    t0 = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="deploytk-vs-alt-rows-") as tmp:
        for i, spec in enumerate(rows_to_run):
            print(f"[{i + 1}/{len(rows_to_run)}] {spec['model']} {spec['method']} r={spec['r']} batch {spec['batch']}", flush=True)
            rows.append(run_child(spec, Path(tmp), i))
            print(f"    {rows[-1]['row_s']} s" + (f", {rows[-1]['error']}" if "error" in rows[-1] else ""), flush=True)
    result = {
        "smoke": args.smoke,
        "environment": environment(),
        "official_code": rows_to_run[0]["official"],
        "protocol": PROTOCOL | {"warmup": rows_to_run[0]["warmup"], "iterations": rows_to_run[0]["iterations"]},
        "calibration_images": rows_to_run[0]["calibration_images"],
        "rows": rows,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_result(out, result)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
