"""ONNX function body of ``deploytk.KMedoidsSelect`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def KMedoidsSelect(
    dist: FLOAT,
    weight: FLOAT,
    clusters: int,
    iterations: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> INT64:
    """TopK for the first medoids, then a Loop of (ArgMin to the nearest medoid, masked ArgMin of the cost per cluster)."""
    one = op.Constant(value_ints=[1])
    k1 = op.Reshape(op.Constant(value_int=clusters), one)
    dist = op.Cast(dist, to=1)  # decided in fp32 whatever the input type
    weight = op.Cast(weight, to=1)
    cost = op.ReduceSum(op.Mul(dist, op.Unsqueeze(weight, op.Constant(value_ints=[-1]))), op.Constant(value_ints=[-1]), keepdims=0)
    _, medoids = op.TopK(weight, k1, axis=-1, largest=1, sorted=1)  # [B, K]
    slots = op.Range(op.Constant(value_int=0), op.Constant(value_int=clusters), op.Constant(value_int=1))  # [K]
    rows = op.Shape(dist, start=0, end=2)  # [B, M]
    tokens = op.Range(op.Constant(value_int=0), op.Squeeze(op.Shape(dist, start=1, end=2)), op.Constant(value_int=1))  # [M]
    gather_shape = op.Concat(rows, k1, axis=0)  # [B, M, K]
    inf = op.Constant(value_float=float("inf"))
    for _ in range(iterations):
        nearest = op.GatherElements(dist, op.Expand(op.Unsqueeze(medoids, one), gather_shape), axis=2)  # [B, M, K]
        assign = op.ArgMin(nearest, axis=2, keepdims=0, select_last_index=0)  # [B, M]
        members = op.Equal(op.Unsqueeze(assign, one), op.Unsqueeze(slots, op.Constant(value_ints=[0, 2])))  # [B, K, M]
        medoids = op.ArgMin(op.Where(members, op.Unsqueeze(cost, one), inf), axis=2, keepdims=0, select_last_index=0)
    hit = op.Equal(op.Unsqueeze(medoids, op.Constant(value_ints=[2])), tokens)  # [B, K, M]
    slot = op.ArgMax(op.Cast(hit, to=6), axis=1, keepdims=0, select_last_index=0)  # first cluster of a medoid
    is_medoid = op.Cast(op.ReduceMax(op.Cast(hit, to=6), one, keepdims=0), to=9)
    return op.Where(is_medoid, slot, op.Cast(k1, to=7))
