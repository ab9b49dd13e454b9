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
    """A weighted assignment matrix A[b, t, n] = weight[b, n] where dest[b, n] == t (else 0) and one
    MatMul: out = A @ x, normalised by A's row sums. The drop slot ``tokens_out`` matches no row.

    Not ScatterND(reduction="add"): ONNX Runtime's multi-threaded CPU kernel races on duplicate
    indices and returns wrong sums now and then (microsoft/onnxruntime#18048, #23396; measured
    here on 1.31.1); ScatterElements(add) is exact there but 2x slower than this MatMul. The
    weights sit in A rather than on x (one [T, N] Where instead of a [N, C] Mul, a Concat and three
    Slices of the former [w*x, w] form): the products w*x and their sums are the same.
    Equal, not OneHot: an index outside OneHot's depth is not defined the same by every runtime.
    """
    one = op.Constant(value_ints=[1])
    slots = op.Unsqueeze(
        op.Range(op.Constant(value_int=0), op.Constant(value_int=tokens_out), op.Constant(value_int=1)), op.Constant(value_ints=[0, 2])
    )  # [1, T, 1]
    wf = op.Reshape(op.Cast(weight, to=1), op.Constant(value_ints=[0, 1, -1]))  # [B, 1, N], fp32 whatever x's type
    assign = op.Where(op.Equal(op.Unsqueeze(dest, one), slots), wf, op.Constant(value_float=0.0))  # [B, T, N]
    num = op.MatMul(assign, op.Cast(x, to=1))  # sums in fp32; the result is cast back to x's type
    den = op.ReduceSum(assign, op.Constant(value_ints=[-1]), keepdims=1)  # [B, T, 1]
    flag = op.Cast(op.Constant(value_int=normalize), to=9)
    return op.CastLike(op.Div(num, op.Where(flag, den, op.Constant(value_float=1.0))), x)
