"""ONNX function body of ``deploytk.TokenAggregate`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def TokenAggregate(
    x: FLOAT,
    weight: FLOAT,
    dest: INT64,
    tokens_out: int,
    normalize: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> FLOAT:
    """A one-hot MatMul sums the [w*x, w] rows into tokens_out + 1 slots (the last is dropped).

    Not ScatterND(reduction="add"): ONNX Runtime's multi-threaded CPU kernel races on duplicate
    indices and returns wrong sums now and then (microsoft/onnxruntime#18048, #23396; measured
    here on 1.31.1).
    """
    one = op.Constant(value_ints=[1])
    zero = op.Constant(value_ints=[0])
    ax1 = op.Constant(value_ints=[1])
    ax2 = op.Constant(value_ints=[2])
    t_out = op.Reshape(op.Constant(value_int=tokens_out), one)
    wf = op.Cast(weight, to=1)  # sums in fp32 whatever x's type; the result is cast back to it
    xw = op.Concat(op.Mul(op.Cast(x, to=1), wf), wf, axis=-1)  # [B, N, C+1]
    c = op.Shape(x, start=2, end=3)
    assign = op.OneHot(dest, op.Add(t_out, one), op.Constant(value_floats=[0.0, 1.0]), axis=1)  # [B, T+1, N]
    acc = op.Slice(op.MatMul(assign, xw), zero, t_out, ax1)
    num = op.Slice(acc, zero, c, ax2)
    den = op.Slice(acc, c, op.Add(c, one), ax2)
    flag = op.Cast(op.Constant(value_int=normalize), to=9)
    return op.CastLike(op.Div(num, op.Where(flag, den, op.Constant(value_float=1.0))), x)
