"""ONNX function body of ``deploytk.DPCKNNAssign`` (standard ops only)."""

from onnxscript import FLOAT, INT64, script

from deploytk.ops.onnx_common import deploytk_opset, op


@script(deploytk_opset, default_opset=op)
def DPCKNNAssign(
    dist: FLOAT,
    clusters: int,
    neighbors: int,
    plugin_namespace: str = "deploytk",
    plugin_version: str = "1",
) -> INT64:
    """TopK for the densities, a masked ReduceMin for the peak distances, TopK for the centres, ArgMin to assign."""
    one = op.Constant(value_ints=[1])
    last = op.Constant(value_ints=[-1])
    k1 = op.Reshape(op.Constant(value_int=clusters), one)
    dist = op.Cast(dist, to=1)  # decided in fp32 whatever the input type
    nearest, _ = op.TopK(dist, op.Reshape(op.Constant(value_int=neighbors), one), axis=-1, largest=0, sorted=1)
    density = op.Exp(op.Neg(op.ReduceMean(op.Mul(nearest, nearest), last, keepdims=0)))  # [B, M]
    higher = op.Greater(op.Unsqueeze(density, one), op.Unsqueeze(density, last))  # [B, i, j]: j denser than i
    dist_max = op.ReduceMax(dist, op.Constant(value_ints=[1, 2]), keepdims=1)  # [B, 1, 1]
    peak = op.ReduceMin(op.Where(higher, dist, dist_max), last, keepdims=0)
    _, centres = op.TopK(op.Mul(peak, density), k1, axis=-1, largest=1, sorted=1)  # [B, K]
    gather_shape = op.Concat(op.Shape(dist, start=0, end=1), k1, op.Shape(dist, start=2, end=3), axis=0)  # [B, K, M]
    to_centre = op.GatherElements(dist, op.Expand(op.Unsqueeze(centres, last), gather_shape), axis=1)  # dist[centre, token]
    assign = op.ArgMin(to_centre, axis=1, keepdims=0, select_last_index=0)
    own = op.Expand(op.Range(op.Constant(value_int=0), op.Constant(value_int=clusters), op.Constant(value_int=1)), op.Shape(centres))
    return op.ScatterElements(assign, centres, own, axis=1)
