"""Export every config in export_configs/ and run `deploytk validate` on it with default settings, per runtime.

Default settings: 64 seeded synthetic images, the artifact's precision's tolerances, no flags.
A bf16 graph on OpenVINO is refused by design (its bf16 precision also lowers the graph's fp32
parts) and recorded as "refused", not as a failure. Writes
benchmarks/results/validate_all_configs.json and prints a summary; exit 1 if any validation failed.

    python scripts/validate_all_configs.py                             # every config, ort + openvino (about 30 min on 2 cores)
    python scripts/validate_all_configs.py --configs 'deit_tiny_*' --backends openvino
"""

from __future__ import annotations

import argparse
import fnmatch
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deploytk.config import load_config  # noqa: E402
from deploytk.errors import DeploytkError  # noqa: E402
from deploytk.exporter.pipeline import run_export  # noqa: E402
from deploytk.files import claim_file  # noqa: E402
from deploytk.validate.validator import run_validation  # noqa: E402


def summarize(report) -> dict:
    return {
        "passed": report.passed,
        "max_abs_diff": report.max_abs_diff,
        "cosine_similarity_min": report.cosine_similarity_min,
        "top1_agreement": report.top1_agreement,
        "top1_agreement_counted": report.top1_agreement_counted,
        "top1_flips": len(report.top1_flips),
        "top1_flips_within_tolerance": report.top1_flips_within_tolerance,
        "branch_flips": len(report.branch_flips),
        "failed_checks": [k for k, v in report.checks.items() if not v],
        "emulation": report.emulation,
    }


def validate_config(config: Path, backends: list[str], workdir: Path) -> dict:
    cfg = load_config(config)
    if cfg.checkpoint and not Path(cfg.checkpoint).is_absolute():  # digits configs name their weights relative to the repo
        cfg = cfg.model_copy(update={"checkpoint": str(ROOT / cfg.checkpoint)})
    out = workdir / config.stem
    t0 = time.perf_counter()
    run_export(cfg, out)
    record = {"config": config.name, "precision": cfg.export.precision, "export_seconds": round(time.perf_counter() - t0, 1)}
    for backend in backends:
        t0 = time.perf_counter()
        try:
            report, _ = run_validation(out, backend)
            record[backend] = summarize(report) | {"seconds": round(time.perf_counter() - t0, 1)}
        except DeploytkError as err:
            refused = backend == "openvino" and cfg.export.precision == "bf16"
            record[backend] = {"passed": None if refused else False, "refused" if refused else "error": str(err)[:300]}
    return record


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="*", help="Globs over export_configs/ stems, comma-separated.")
    p.add_argument("--backends", default="ort,openvino")
    p.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "validate_all_configs.json")
    args = p.parse_args(argv)
    patterns = args.configs.split(",")
    configs = [c for c in sorted((ROOT / "export_configs").glob("*.yaml")) if any(fnmatch.fnmatch(c.stem, p) for p in patterns)]
    backends = args.backends.split(",")
    out = claim_file(args.output, "deploytk scripts/validate_all_configs.py")  # before the run: a file deploytk did not write is refused
    records, t_start = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="deploytk-validate-all-") as tmp:
        for i, config in enumerate(configs, 1):
            record = validate_config(config, backends, Path(tmp))
            records.append(record)
            status = ", ".join(
                f"{b}: {'refused' if record[b].get('refused') else 'PASS' if record[b]['passed'] else 'FAIL'}" for b in backends
            )
            print(f"[{i}/{len(configs)}] {config.stem}: {status}", flush=True)
            shutil.rmtree(Path(tmp) / config.stem, ignore_errors=True)  # DeiT-B artifacts are 350 MB each
    failed = [(r["config"], b) for r in records for b in backends if r[b]["passed"] is False]
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": "deploytk validate DIR --backend B (defaults: 64 synthetic images, the precision's tolerances)",
        "seconds": round(time.perf_counter() - t_start, 1),
        "failed": [f"{c} on {b}" for c, b in failed],
        "configs": records,
    }
    out.write_json(result)
    print(f"wrote {args.output}; {len(records)} configs x {len(backends)} runtimes, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
