"""Latency and throughput through a real Triton Inference Server, per concurrency, for models `deploytk package` wrote.

The server is nvidia-pytriton's `tritonserver` (serving/tritonserver.py, `make serve-env`) on 127.0.0.1; the model
files run in the stand-in backends (ONNX Runtime's and OpenVINO's Python APIs in Triton's Python backend), so the
numbers are this machine's CPU runtimes behind a real server, its gRPC front end and its dynamic batcher, not
Triton's C++ backends. Each model: DeiT-S and the digits ViT exported (random weights for DeiT-S: latency does not
depend on them), packaged unchanged, then at each concurrency ``--requests`` one-image gRPC requests from that many
client threads (after a warm-up), with every request's latency, the wall time, the errors, and the average batch the
server executed (from its statistics). DeiT-S dense (r=0) is packaged the same way: ToMe's gain under load.

    python benchmarks/triton_load.py                         # ~10 min on a 2-core CPU
    python benchmarks/triton_load.py --smoke --output /tmp/x.json   # digits only, few requests: does it run
    python benchmarks/triton_load.py --markdown benchmarks/results/triton_load_amd_epyc.json   # the table in docs/results/serving.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import cpu_result_output, deploytk, write_result  # noqa: E402
from deploytk.machine import host  # noqa: E402
from serving.tritonserver import TritonServer, settled_statistics  # noqa: E402

#: served model name -> (export config, export overrides, package options)
MODELS = {
    "deit_s_tome_r16": ("deit_small_tome_r16", [], []),
    "deit_s_dense": ("deit_small_tome_r16", ["--r", "0"], []),
    "digits_tome_r4": ("digits_vit_tome_r4", [], []),
    "digits_tome_r4_openvino": ("digits_vit_tome_r4", [], ["--backend", "openvino"]),
}
SMOKE_MODELS = ("digits_tome_r4", "digits_tome_r4_openvino")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="1,8,32", help="client threads, comma-separated")
    p.add_argument("--requests", type=int, default=None, help="requests per concurrency [default: 2000 digits, 400 DeiT-S]")
    p.add_argument("--warmup", type=int, default=20, help="requests before each measured run")
    p.add_argument("--smoke", action="store_true", help="the digits models, 64 requests: checks the script, measures little")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None, metavar="JSON", help="Print the table of an earlier run's JSON and exit.")
    return p.parse_args(argv)


def load(client, grpcclient, model: str, images: np.ndarray, requests: int, concurrency: int) -> dict:
    """``requests`` one-image requests from ``concurrency`` threads: latencies, wall time, errors, executed batches."""

    def statistics() -> dict:
        return client.get_inference_statistics(model, as_json=True)["model_stats"][0]

    def one(i: int) -> tuple[float, str | None]:
        request = grpcclient.InferInput("input", [1, *images.shape[1:]], "FP32")
        request.set_data_from_numpy(images[i % len(images) : i % len(images) + 1])
        t0 = time.perf_counter()
        try:
            client.infer(model, [request])
        except Exception as e:  # counted, not raised: the point is how many
            return time.perf_counter() - t0, str(e)
        return time.perf_counter() - t0, None

    before = statistics()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as workers:
        done = list(workers.map(one, range(requests)))
    wall = time.perf_counter() - t0
    after = settled_statistics(statistics, int(before.get("inference_count", 0)) + requests)
    latencies = np.array([d[0] for d in done]) * 1000
    errors = [d[1] for d in done if d[1]]
    inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    return {
        "concurrency": concurrency,
        "requests": requests,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": round(wall, 3),
        "throughput_per_s": round(requests / wall, 2),
        "latency_ms": {q: round(float(np.percentile(latencies, p)), 2) for q, p in (("p50", 50), ("p90", 90), ("p99", 99))},
        "server_inferences": inferences,
        "server_executions": executions,
        "average_batch": round(inferences / executions, 2) if executions else None,
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return
    import tritonclient.grpc as grpcclient  # the `serve`/`test` extra

    out = cpu_result_output("triton_load", "triton_load.py", args.output)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    names = SMOKE_MODELS if args.smoke else tuple(MODELS)
    results = {}
    with tempfile.TemporaryDirectory(prefix="deploytk-triton-load-") as folder:
        folder, repo = Path(folder), Path(folder) / "repo"
        for name in names:
            config, overrides, options = MODELS[name]
            artifact = folder / name
            deploytk("export", str(ROOT / "export_configs" / f"{config}.yaml"), "--output", str(artifact), *overrides)
            deploytk("package", str(artifact), "--triton", str(repo), "--name", name, *options)
        with contextlib.closing(TritonServer(repo).start()) as server:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            for name in names:
                shape = json.loads((folder / name / "manifest.json").read_text())["inputs"][0]["shape"][1:]  # after the batch axis
                images = np.random.default_rng(0).standard_normal((64, *shape), dtype=np.float32)
                requests = 64 if args.smoke else args.requests or (2000 if name.startswith("digits") else 400)
                results[name] = []
                for concurrency in concurrencies:
                    load(client, grpcclient, name, images, min(args.warmup, requests), concurrency)
                    row = load(client, grpcclient, name, images, requests, concurrency)
                    print(json.dumps({"model": name, **row}), flush=True)
                    results[name].append(row)
            server_version = client.get_server_metadata(as_json=True)["version"]
    write_result(
        out,
        {
            "smoke": args.smoke,
            "environment": {**host(), "tritonserver": server_version},
            "setup": "nvidia-pytriton's tritonserver on 127.0.0.1, stand-in backends (serving/backends), gRPC, one image per request",
            "models": {name: {"config": MODELS[name][0], "export": MODELS[name][1], "package": MODELS[name][2]} for name in names},
            "results": results,
        },
    )


def markdown(result: dict) -> str:
    """The table in docs/results/serving.md: per model and concurrency, throughput, p50/p99 latency, average executed batch, errors."""
    lines = [
        "| model | concurrency | requests | errors | throughput (img/s) | p50 ms | p99 ms | average executed batch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in result["results"].items():
        for r in rows:
            lines.append(
                f"| {name} | {r['concurrency']} | {r['requests']} | {r['errors']} | {r['throughput_per_s']:.1f} | "
                f"{r['latency_ms']['p50']:.1f} | {r['latency_ms']['p99']:.1f} | {r['average_batch']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
