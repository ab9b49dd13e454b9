"""The Python side of scripts/device_check.sh (the GPU check): the kit's import check, the gpu tests' JSON, the summary.

    python3 scripts/device_summary.py kit-check                    # deploytk imports; kit/image requirement mismatches
    python3 scripts/device_summary.py junit RESULTS.xml OUT.json   # pytest's JUnit XML -> passed/failed/skipped JSON
    python3 scripts/device_summary.py summary OUTDIR STEPS.tsv [--dry-run]   # stamp each result, summary.json, print

``summary`` reads the steps device_check.sh ran (one ``name, status, exit code, seconds, limit, file`` line each, tab
separated), adds to every result file a ``device_check`` record (GPU name, device, step, status, seconds), replaces a
missing or unreadable result by a JSON error record, writes summary.json with the key numbers and prints them on one
screen, last. It exits 0: the check's exit status is device_check.sh's, from the steps.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from device_kit import read_pins  # noqa: E402  (scripts/device_kit.py: the kit's pins)

ROOT = Path(__file__).resolve().parents[1]


# ---- kit-check --------------------------------------------------------------------------------


def requirement_mismatches() -> list[str]:
    """What the kit's distributions and deploytk require (no extras) that this interpreter does not have at a fitting version."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    environment = {**default_environment(), "extra": ""}
    found = []
    for name in [name for name, _, _ in read_pins()] + ["deploytk"]:
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            found.append(f"{name}: not installed")
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(environment):
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                found.append(f"{name} needs {req}: {req.name} is not installed")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                found.append(f"{name} needs {req}: {req.name} {have} is installed")
    return found


def stale_files(installed: dict[str, Path]) -> list[str]:
    """The tree's .py files that the installed deploytk / deploytk_plugins lack or hold otherwise, and the ones only they
    hold: the kit's wheel was built from another tree (scripts, tests and the CLI would then run different code)."""
    differ = []
    for folder, where in installed.items():
        tree = ROOT / folder
        if where.resolve() == tree.resolve():  # the tree itself (an editable install, the dry run)
            continue
        ours = {p.relative_to(tree) for p in tree.rglob("*.py") if "__pycache__" not in p.parts}
        theirs = {p.relative_to(where) for p in where.rglob("*.py") if "__pycache__" not in p.parts}
        differ += [f"{folder}/{p}" for p in sorted(ours ^ theirs)]
        differ += [f"{folder}/{p}" for p in sorted(ours & theirs) if (tree / p).read_bytes() != (where / p).read_bytes()]
    return differ


def kit_check() -> int:
    """The install step's check: the CLI and the plugins import (from where), the installed deploytk is this tree's, and
    what the image's versions do not fit (printed, not fatal). Exit 1 when the kit's deploytk is not this tree's."""
    import deploytk_plugins

    import deploytk
    import deploytk.cli  # noqa: F401  (imports every command's module: pydantic, fvcore, polygraphy, onnxscript, ...)

    installed = {"deploytk": Path(deploytk.__file__).parent, "plugins": Path(deploytk_plugins.__file__).parent}
    print(f"deploytk {metadata.version('deploytk')} from {installed['deploytk']}; deploytk_plugins from {installed['plugins']}")
    for line in requirement_mismatches():
        print(f"warning: {line}")
    stale = stale_files(installed)
    if stale:
        print(f"error: the kit's deploytk wheel is not this tree's ({len(stale)} files differ: {', '.join(stale[:5])})")
        print("run `make device-kit` again right before the GPU run")
        return 1
    return 0


# ---- junit ------------------------------------------------------------------------------------


def junit_to_json(xml_path: Path) -> dict:
    """{passed, failed, errors, skipped, tests: [{name, outcome, seconds, message}]} from pytest's --junitxml file."""
    if not xml_path.is_file():
        return {"error": f"no JUnit XML at {xml_path}: pytest did not finish (see device_check.log)"}
    tests, counts = [], {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        outcome, message = "passed", None
        for tag, name in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
            element = case.find(tag)
            if element is not None:
                outcome = name
                text = (element.text or "").strip()
                message = element.get("message") or ""
                if tag != "skipped" and text:
                    message = f"{message}\n{text[-1500:]}".strip()
                break
        counts[outcome] += 1
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        tests.append({"name": name, "outcome": outcome, "seconds": float(case.get("time") or 0), "message": message})
    return {**counts, "tests": tests}


# ---- summary ----------------------------------------------------------------------------------


def device_info() -> dict:
    """The GPU (torch.cuda.get_device_name) or the CPU, and the versions that ran."""
    info = {"gpu": None, "device": "cpu", "python": platform.python_version()}
    try:
        import torch

        info |= {"torch": torch.__version__, "cuda": torch.version.cuda}
        if torch.cuda.is_available():
            info |= {"gpu": torch.cuda.get_device_name(), "device": "cuda"}
            info["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    except Exception as exc:  # the summary still comes out
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    for name in ("triton", "deploytk"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        info["commit"] = commit.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info


def read_steps(path: Path) -> list[dict]:
    steps = []
    for line in path.read_text().splitlines():
        name, status, rc, seconds, limit, file = line.split("\t")
        steps.append(
            {"name": name, "status": status, "exit": int(rc), "seconds": float(seconds), "limit_s": int(limit), "file": file or None}
        )
    return steps


def step_log(log: Path, name: str, lines: int = 40) -> str:
    """The end of one step's part of device_check.log (from its ``== NAME (limit`` line to its ``== NAME:`` line)."""
    if not log.is_file():
        return ""
    text = log.read_text(errors="replace")
    start = text.find(f"== {name} (limit")
    if start < 0:
        return ""
    end = text.find(f"== {name}: ", start)
    return "\n".join(text[start : end if end >= 0 else None].splitlines()[-lines:])


def load_result(path: Path) -> dict:
    """A step's JSON, or an error record saying why there is none (the file's end kept if it is not JSON)."""
    if not path.is_file():
        return {"error": "no result: the step wrote no file"}
    text = path.read_text(errors="replace")
    if not text.strip():
        return {"error": "no result: the step printed nothing"}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return {
            "error": f"not JSON ({exc.msg} at line {exc.lineno}); the step's output ends with the text below",
            "output_tail": text[-3000:],
        }
    return data if isinstance(data, dict) else {"result": data}


def key_numbers(results: dict) -> dict:
    """What summary.json and the printed summary report from each step's result."""
    out = {}
    doctor = results.get("doctor", {})
    if "error" not in doctor:
        keys = ("gpu", "compute_capability", "torch_cuda_build", "triton", "plugin_kernels_for_this_gpu", "onnxruntime_providers")
        out["doctor"] = {k: doctor.get(k) for k in keys}
    selftest = results.get("selftest", {})
    if "cases" in selftest:
        cases = selftest["cases"]
        out["selftest"] = {
            "mode": selftest.get("environment", {}).get("mode"),
            "cases": len(cases),
            "passed_cases": sum(c["passed"] for c in cases),
            "passed": selftest.get("passed"),
            "ops": len({c["op"] for c in cases}),
            "dtypes": sorted({c["dtype"] for c in cases}),
            "near_ties": sum(c.get("near_ties", 0) for c in cases),
            "failed": [f"{c['op']} {c['dtype']} {c['shape']}" for c in cases if not c["passed"]][:10],
            "seconds_by_op": seconds_by_op(cases),
        }
    tests = results.get("gpu_tests", {})
    if "tests" in tests:
        out["gpu_tests"] = {k: tests[k] for k in ("passed", "failed", "errors", "skipped")}
        out["gpu_tests"]["not_passed"] = [t["name"] for t in tests["tests"] if t["outcome"] in ("failed", "errors")]
    bandwidth = results.get("kernel_bandwidth", {})
    if "cases" in bandwidth:
        out["kernel_bandwidth"] = {
            "peak_bandwidth_gbs": bandwidth.get("peak_bandwidth_gbs"),
            "dtype": bandwidth["cases"][0]["dtype"] if bandwidth["cases"] else None,
            "x_bound": {c["op"]: c["x_bound"] for c in bandwidth["cases"]},
            "ms": {c["op"]: c["ms"] for c in bandwidth["cases"]},
            "pytorch_ms": {c["op"]: v for c in bandwidth["cases"] for k, v in c.items() if k.startswith("pytorch_")},
            "merge_within_2x_of_bound": bandwidth.get("merge_within_2x_of_bound"),
        }
    latency = results.get("end_to_end_latency", {})
    if "results" in latency:
        rows = [
            {
                "model": row["model"],
                "batch": row["batch"],
                "dtype": row["dtype"],
                "dense_ms": row["median_ms"].get("dense"),
                "speedup": {k.removeprefix("speedup_"): v for k, v in row.items() if k.startswith("speedup_")},
                "cuda_graph_dense_ms": row.get("cuda_graph_median_ms", {}).get("dense"),
                "cuda_graph_speedup": row.get("cuda_graph_speedup", {}),
                "host_syncs_per_forward": row.get("host_syncs_per_forward", {}),
            }
            for row in latency["results"]
        ]
        out["end_to_end_latency"] = {"kernels": latency.get("kernels"), "rows": rows, "failed": latency.get("failed", {})}
    return out


def seconds_by_op(cases: list[dict]) -> dict:
    """Each op's selftest seconds (kernel compiles included), slowest first; empty for a selftest that timed none."""
    total: dict[str, float] = {}
    for c in cases:
        if "seconds" in c:
            total[c["op"]] = total.get(c["op"], 0.0) + c["seconds"]
    return {op: round(sec, 1) for op, sec in sorted(total.items(), key=lambda item: -item[1])}


def render(summary: dict) -> str:
    """The one-screen text of summary.json."""
    info, lines = summary["device"], []
    where = info["gpu"] or "no GPU: CPU"
    mode = "DRY RUN (CPU, Triton interpreter, small shapes, few iterations)" if summary["dry_run"] else "GPU run"
    lines.append(f"deploytk GPU check, {mode}: {where}" + (f" (sm {info['compute_capability']})" if info.get("compute_capability") else ""))
    lines.append(
        f"torch {info.get('torch')} (CUDA {info.get('cuda')})  triton {info.get('triton')}  python {info['python']}  "
        f"deploytk {info.get('deploytk')}  commit {info.get('commit')}"
    )
    lines.append(f"{'step':20s} {'status':8s} {'seconds':>8s} {'limit':>6s}  file")
    for step in summary["steps"]:
        lines.append(f"{step['name']:20s} {step['status']:8s} {step['seconds']:8.1f} {step['limit_s']:6d}  {step['file'] or '-'}")
    numbers = summary["numbers"]
    if "selftest" in numbers:
        s = numbers["selftest"]
        lines.append(
            f"selftest: {s['passed_cases']}/{s['cases']} cases passed ({s['mode']}; {s['ops']} ops; {', '.join(s['dtypes'])}; "
            f"{s['near_ties']} near-ties)" + (f"; failed: {'; '.join(s['failed'][:3])}" if s["failed"] else "")
        )
        slowest = list(s.get("seconds_by_op", {}).items())[:4]
        if slowest:
            lines.append("selftest seconds, slowest ops: " + ", ".join(f"{op} {sec:.1f}" for op, sec in slowest))
    if "gpu_tests" in numbers:
        t = numbers["gpu_tests"]
        lines.append(
            f"gpu tests: {t['passed']} passed, {t['failed']} failed, {t['errors']} errors, {t['skipped']} skipped"
            + (f"; not passed: {', '.join(t['not_passed'][:4])}" if t["not_passed"] else "")
        )
    if "kernel_bandwidth" in numbers:
        k = numbers["kernel_bandwidth"]
        lines.append(f"kernel bandwidth ({k['dtype']}, peak copy {k['peak_bandwidth_gbs']} GB/s): x bound = kernel ms / bandwidth-bound ms")
        for op, x in k["x_bound"].items():
            ref = f"  pytorch {k['pytorch_ms'][op]} ms" if op in k["pytorch_ms"] else ""
            lines.append(f"  {op:22s} x_bound {x:10.2f}  kernel {k['ms'][op]:9.4f} ms{ref}")
    if "end_to_end_latency" in numbers:
        e = numbers["end_to_end_latency"]
        lines.append(f"end to end (speedup over dense; kernels: {e['kernels']})")
        for row in e["rows"]:
            speedups = ", ".join(f"{k} {v:.2f}x" for k, v in row["speedup"].items())
            lines.append(f"  {row['model']} b={row['batch']} {row['dtype']} dense {row['dense_ms']} ms: {speedups}")
            if row.get("cuda_graph_speedup"):
                graphed = ", ".join(f"{k} {v:.2f}x" for k, v in row["cuda_graph_speedup"].items())
                syncs = ", ".join(f"{k} {v}" for k, v in row["host_syncs_per_forward"].items() if v)
                lines.append(f"    as CUDA graphs: dense {row['cuda_graph_dense_ms']} ms: {graphed}; host syncs: {syncs or 'none'}")
        lines += [f"  failed: {k}: {v}" for k, v in e["failed"].items()]
    lines += [f"kit: {m}" for m in summary["requirement_mismatches"]]
    failed, count = [s["name"] for s in summary["steps"] if s["status"] != "ok"], len(summary["steps"])
    verdict = f"{len(failed)} of {count} steps not ok: {', '.join(failed)}" if failed else f"all {count} steps ok"
    lines.append(f"result: {verdict}; files in {summary['outdir']}")
    return "\n".join(lines)


def summarize(outdir: Path, steps_file: Path, dry_run: bool) -> dict:
    info = device_info()
    steps = read_steps(steps_file)
    results = {}
    for step in steps:
        if not step["file"]:
            continue
        path = outdir / step["file"]
        data = load_result(path)
        if "error" in data:  # why, from the log
            data["log_tail"] = step_log(outdir / "device_check.log", step["name"])
        stamp = {"gpu": info["gpu"], "device": info["device"], "step": step["name"], "status": step["status"], "seconds": step["seconds"]}
        data = {**{k: v for k, v in data.items() if k != "device_check"}, "device_check": {**stamp, "dry_run": dry_run}}
        path.write_text(json.dumps(data, indent=2) + "\n")
        results[step["name"]] = data
    try:
        mismatches = requirement_mismatches()
    except Exception as exc:  # the summary still comes out
        mismatches = [f"could not check the requirements: {type(exc).__name__}: {exc}"]
    summary = {
        "device_check": {"gpu": info["gpu"], "device": info["device"], "step": "summary", "dry_run": dry_run},
        "dry_run": dry_run,
        "device": info,
        "outdir": str(outdir),
        "passed": all(s["status"] == "ok" for s in steps),
        "steps": steps,
        "numbers": key_numbers(results),
        "requirement_mismatches": mismatches,
    }
    summary["text"] = render(summary)
    (outdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("kit-check", help="import deploytk's CLI; print requirement mismatches")
    junit = sub.add_parser("junit", help="pytest's JUnit XML -> JSON")
    junit.add_argument("xml", type=Path)
    junit.add_argument("output", type=Path)
    summary = sub.add_parser("summary", help="stamp the results, write summary.json, print the summary")
    summary.add_argument("outdir", type=Path)
    summary.add_argument("steps", type=Path)
    summary.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "kit-check":
        return kit_check()
    if args.command == "junit":
        args.output.write_text(json.dumps(junit_to_json(args.xml), indent=2) + "\n")
        return 0
    print(summarize(args.outdir.resolve(), args.steps, args.dry_run)["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
