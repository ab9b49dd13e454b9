"""The Triton kernels natively on a CUDA GPU (marker ``gpu``: skipped without one).

The CPU suite runs them in Triton's interpreter, which executes a program's block operations
one after another and so cannot show races between a program's threads; these tests are
where the matching kernels' barriers are exercised.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from helpers import digits_config

pytestmark = pytest.mark.gpu

METHODS = [
    "digits_vit_tome_r4",
    "digits_vit_mctf_r4",
    "digits_vit_atm_calibrated",
    "digits_vit_evit_k70",
    "digits_vit_crucial_k70",
    "digits_vit_topk_k70",
]


def test_native_selftest_passes_for_every_op_and_dtype():
    from deploytk.ops import OPS

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", "from deploytk.cli import main; main()", "selftest", "--json"], capture_output=True, text=True, env=env
    )
    report = json.loads(result.stdout)
    failed = [c for c in report["cases"] if not c["passed"]]
    assert result.returncode == 0 and report["passed"], failed[:5]
    assert report["environment"]["mode"] == "gpu"
    assert {c["op"] for c in report["cases"]} == set(OPS)
    assert {c["dtype"] for c in report["cases"]} == {"fp32", "fp16", "bf16"}
    assert max(c["shape"]["N"] for c in report["cases"] if "N" in c["shape"]) >= 577  # ViT-B/16 at 384 px


@pytest.fixture(scope="module")
def digit_batch(tmp_path_factory):
    from deploytk.data import folder_batches
    from deploytk.evaluation.digits import write_digits_imagefolder
    from deploytk.models import create_model

    root = tmp_path_factory.mktemp("digits") / "digits"
    write_digits_imagefolder(root, img_size=32)
    family = create_model(digits_config("digits_vit_tome_r4"))
    (batch,) = folder_batches(root / "val", 32, 32, family.eval_transform(), family.input_kind)
    return torch.from_numpy(batch)


@pytest.fixture
def no_tf32(monkeypatch):
    """fp32 convolutions and matmuls in full fp32 (cuDNN convolutions default to TF32), so the
    CUDA run's matching inputs agree with the CPU reference's at float32 rounding level."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


@pytest.mark.parametrize("stem", METHODS)
def test_merged_model_on_cuda_runs_the_kernels_and_matches_the_cpu_reference(stem, digit_batch, monkeypatch, no_tf32):
    """The trained digits ViT per method: the CUDA path dispatches every deploytk op to its
    Triton kernel; each matching kernel makes the CPU reference op's choice on the same inputs
    (or one the reference makes at float32 rounding level: a proven near-tie, as in
    ``deploytk selftest``); and the CPU reference replayed with the CUDA run's choices gives
    its logits and top-1."""
    from deploytk.models import build_reference
    from deploytk.ops import OPS
    from deploytk.ops.ties import rounding_ties

    model = build_reference(digits_config(stem))
    calls, cuda_calls = {}, []
    for spec in OPS.values():  # count every kernel launch the CUDA dispatch makes
        kernel, name = spec.kernel_module(), spec.torch_name
        real = kernel.launch
        monkeypatch.setattr(
            kernel, "launch", lambda *a, _real=real, _name=name, **k: calls.__setitem__(_name, calls.get(_name, 0) + 1) or _real(*a, **k)
        )
    with torch.no_grad():
        cpu_dests = []
        model.dest_hook = lambda op, args, dest: cpu_dests.append(dest) or dest
        want = model(digit_batch)

        def record(op, args, dest):
            cuda_calls.append((op, [a.cpu() if isinstance(a, torch.Tensor) else a for a in args], dest.cpu()))
            return dest

        model.cuda().dest_hook = record
        got = model(digit_batch.cuda()).cpu()
        replayed = iter(dest for _, _, dest in cuda_calls)
        model.cpu().dest_hook = lambda op, args, dest: next(replayed)
        replay = model(digit_batch)
    assert calls.get("token_aggregate") and any(
        calls.get(m) for m in ("tome_match", "mctf_match", "size_split_match", "topk_select", "crucial_match")
    )
    assert len(cuda_calls) == len(cpu_dests) > 0
    for op, args, dest in cuda_calls:  # each kernel against the CPU reference op on the same inputs
        reference = getattr(torch.ops.deploytk, op)
        ties = rounding_ties(lambda *a, _ref=reference: _ref(*a), args, dest, None if op == "topk_select" else 0)
        assert ties is not None, f"{op}: the kernel's choice is not the reference's, nor a near-tie of it"
    scale = max(1.0, float(replay.abs().max()))
    assert (got - replay).abs().max() <= 1e-3 * scale and torch.equal(got.argmax(-1), replay.argmax(-1))
    flips = sum(not torch.equal(a, d) for a, (_, _, d) in zip(cpu_dests, cuda_calls, strict=True))
    if flips == 0:  # no near-tie flipped: the CUDA run is the CPU reference itself
        assert (got - want).abs().max() <= 1e-3 * max(1.0, float(want.abs().max())) and torch.equal(got.argmax(-1), want.argmax(-1))
