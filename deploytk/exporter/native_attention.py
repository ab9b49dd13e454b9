"""Rewrite ``deploytk.ProportionalAttention`` nodes into the standard ONNX ``Attention`` op (opset 23).

Why: TensorRT's parser builds a plugin for each ``deploytk.ProportionalAttention`` node
(``plugin_namespace="deploytk"``, ``plugin_version="1"``), but it fuses attention natively
(its own flash/fused MHA kernels) only for the standard ``Attention`` op of opset 23, with an
additive float mask broadcastable to [B, H, Sq, Skv] and the scale applied to Q before the
first MatMul. Each build picks one path, plugin or native; this module produces the native
graph from an exported one.

ProportionalAttention(q, k, v, size; scale) = softmax((Q * scale) K^T + log(size)) V with
q, k, v [B, H, N, D] and size [B, N, 1]; it becomes

    q_scaled = Mul(q, CastLike(scale, q))
    mask     = CastLike(Expand(Unsqueeze(Log(Squeeze(Cast(size, fp32), [2])), [1, 2]), [1, 1, Nq, 1]), q)
    out      = Attention(q_scaled, k, v, mask; scale=1.0)           # 4-D inputs, opset 23

The mask is computed in fp32 (log of token sizes) and cast to q's element type, so fp32 and
fp16 graphs both work; the casts are left out where q is known to be fp32.

The mask is expanded from [B, 1, 1, Nkv] to [B, 1, Nq, Nkv]: ONNX Runtime 1.31's CPU
``Attention`` kernel requires ``attn_mask.shape[-2] == Sq`` (it does not broadcast the query
axis, although the ONNX spec allows it). [B, 1, Nq, Nkv] is still broadcastable for TensorRT;
pass ``expand_mask=False`` for the compact [B, 1, 1, Nkv] mask.

In fp16/bf16 graphs the node asks for an fp32 softmax (``softmax_precision``), as
ProportionalAttention computes it. TensorRT's ONNX parser refuses an ``Attention`` node that
sets ``softmax_precision`` (onnx-tensorrt's Attention op checker: "Setting softmax precision is
not supported in TensorRT Attention"), so a TensorRT build passes ``softmax_precision=False``
and the softmax precision is then TensorRT's choice.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import TensorProto, defs, helper, numpy_helper

from deploytk.errors import DeploytkError
from deploytk.exporter.onnx_io import infer_shapes
from deploytk.ops import DOMAIN

OP_NAME = "ProportionalAttention"
#: the first ai.onnx opset with the ``Attention`` op
ATTENTION_OPSET = 23

# Attributes added between opset 18 and 23 that keep the old behaviour for every type the old
# opset had (Cast/CastLike ``saturate`` only affects float8 types, which opset 18 lacked).
_SAFE_NEW_ATTRIBUTES = {("Cast", "saturate"), ("CastLike", "saturate")}


def use_native_attention(model: onnx.ModelProto, *, expand_mask: bool = True, softmax_precision: bool = True) -> onnx.ModelProto:
    """A copy of ``model`` with every ``deploytk.ProportionalAttention`` node as a standard ``Attention``.

    Each node's output keeps its name. The ai.onnx opset import is raised to 23 if lower, in the
    model and in its local functions (onnx.checker requires them to agree). The bump is checked
    op by op (``_check_opset_bump``): every standard op must keep its inputs, outputs and
    attributes (type, default) at opset 23, apart from additions that do not change old
    behaviour; for the exported ViTs (opset 18) the newer Reshape, Squeeze, Unsqueeze, Shape,
    Pad, ReduceMax, Conv, Transpose, Constant, Cast, CastLike only add types or modes, or
    Cast's float8-only ``saturate``. ``onnx.version_converter`` is deliberately not used: it
    drops the model-local functions (the bodies of the remaining deploytk nodes such as
    ToMeMatch and TokenAggregate) while keeping the nodes.

    The ProportionalAttention local function is dropped once no node calls it.
    Raises DeploytkError when the model has no ProportionalAttention node.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    targets = [i for i, n in enumerate(graph.node) if _is_prop_attn(n)]
    if not targets:
        raise DeploytkError(
            f"The model has no {DOMAIN}.{OP_NAME} node to replace with native Attention.",
            hint="Export with proportional attention enabled (`merge.prop_attn: true` and a merging method "
            "with r > 0); a dense or prop_attn-free export already uses standard attention ops.",
        )

    old_opset = _ai_onnx_version(out.opset_import)
    if old_opset < ATTENTION_OPSET:
        _check_opset_bump(_all_nodes(graph.node), old_opset, ATTENTION_OPSET, "the graph")
    # onnx.checker requires every local function to import the model's ai.onnx version.
    bumped = [f for f in out.functions if 0 < _ai_onnx_version(f.opset_import) < ATTENTION_OPSET]
    for f in bumped:
        _check_opset_bump(_all_nodes(f.node), _ai_onnx_version(f.opset_import), ATTENTION_OPSET, f"function {f.domain}.{f.name}")

    names = _NameSource(out)
    elem_types = _elem_types(model)
    new_inits: list[TensorProto] = []
    shared: dict[str, str] = {}

    def const(key: str, array: np.ndarray) -> str:
        """An initializer shared by all rewritten nodes."""
        if key not in shared:
            shared[key] = names.fresh(f"native_attn_{key}")
            new_inits.append(numpy_helper.from_array(array, shared[key]))
        return shared[key]

    new_nodes: list[onnx.NodeProto] = []
    targets_set = set(targets)
    for i, node in enumerate(graph.node):
        if i not in targets_set:
            new_nodes.append(node)
            continue
        if len(node.input) != 4 or len(node.output) != 1:
            raise DeploytkError(
                f"internal: {OP_NAME} node {node.name!r} has {len(node.input)} inputs / {len(node.output)} outputs; "
                "expected (q, k, v, size) -> out."
            )
        q, k, v, size = node.input
        (y,) = node.output
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if "scale" not in attrs:
            raise DeploytkError(f"internal: {OP_NAME} node {node.name!r} has no `scale` attribute.")
        base = node.name or f"{OP_NAME}_{i}"
        q_is_fp32 = elem_types.get(q) == TensorProto.FLOAT
        size_is_fp32 = elem_types.get(size) == TensorProto.FLOAT

        def tmp(suffix: str, base: str = base) -> str:
            return names.fresh(f"{base}/native_{suffix}")

        def add(op_type: str, inputs: list[str], suffix: str, base: str = base, **kwargs) -> str:
            result = tmp(suffix)
            new_nodes.append(helper.make_node(op_type, inputs, [result], name=names.fresh_node(f"{base}/native_{suffix}"), **kwargs))
            return result

        scale = names.fresh(f"{base}/native_scale")
        new_inits.append(numpy_helper.from_array(np.array(float(attrs["scale"]), np.float32), scale))
        if not q_is_fp32:
            scale = add("CastLike", [scale, q], "scale_cast")
        q_scaled = add("Mul", [q, scale], "q_scaled")

        s = size if size_is_fp32 else add("Cast", [size], "size_fp32", to=TensorProto.FLOAT)
        s = add("Squeeze", [s, const("axes_2", np.array([2], np.int64))], "size_bn")  # [B, N]
        s = add("Log", [s], "log_size")
        mask = add("Unsqueeze", [s, const("axes_1_2", np.array([1, 2], np.int64))], "mask_b11n")  # [B, 1, 1, N]
        if expand_mask:
            nq = add("Shape", [q], "nq", start=2, end=3)
            shape = add("Concat", [const("ones_2", np.ones(2, np.int64)), nq, const("ones_1", np.ones(1, np.int64))], "mask_shape", axis=0)
            mask = add("Expand", [mask, shape], "mask_b1nn")  # [B, 1, Nq, N]
        if not q_is_fp32:
            mask = add("CastLike", [mask, q], "mask_cast")
        # low precision: the softmax stays fp32 (Attention-23's softmax_precision), as in ProportionalAttention
        precision = {"softmax_precision": TensorProto.FLOAT} if softmax_precision and not q_is_fp32 else {}
        new_nodes.append(
            helper.make_node(
                "Attention", [q_scaled, k, v, mask], [y], name=names.fresh_node(f"{base}/native_attention"), scale=1.0, **precision
            )
        )

    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(new_inits)
    for f in bumped:
        _set_ai_onnx_version(f.opset_import, ATTENTION_OPSET)
    _set_ai_onnx_version(out.opset_import, max(old_opset, ATTENTION_OPSET))

    if not any(_is_prop_attn(n) for n in graph.node) and not _function_calls(out, OP_NAME):
        kept = [f for f in out.functions if not (f.domain == DOMAIN and f.name == OP_NAME)]
        del out.functions[:]
        out.functions.extend(kept)
    if not any(n.domain == DOMAIN for n in graph.node) and not any(f.domain == DOMAIN for f in out.functions):
        kept_ops = [o for o in out.opset_import if o.domain != DOMAIN]
        del out.opset_import[:]
        out.opset_import.extend(kept_ops)
    return out


def count_native_attention(model: onnx.ModelProto) -> int:
    """Number of standard ``Attention`` nodes in the main graph."""
    return sum(n.op_type == "Attention" and n.domain in ("", "ai.onnx") for n in model.graph.node)


def _is_prop_attn(node: onnx.NodeProto) -> bool:
    return node.domain == DOMAIN and node.op_type == OP_NAME


def _function_calls(model: onnx.ModelProto, op_type: str) -> bool:
    return any(n.domain == DOMAIN and n.op_type == op_type for f in model.functions for n in f.node)


def _ai_onnx_version(opset_import) -> int:
    versions = [o.version for o in opset_import if o.domain in ("", "ai.onnx")]
    return versions[0] if versions else 0


def _set_ai_onnx_version(opset_import, version: int) -> None:
    for o in opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = version
            return
    opset_import.append(helper.make_opsetid("", version))


def _signature(schema):
    io = lambda params: [(p.name, p.option) for p in params]  # noqa: E731
    attrs = {k: (a.type, a.required, a.default_value.SerializeToString()) for k, a in schema.attributes.items()}
    return io(schema.inputs), io(schema.outputs), attrs


def _check_opset_bump(nodes, old: int, new: int, where: str) -> None:
    """Raise if one of the ai.onnx ops among ``nodes`` changes signature from opset ``old`` to ``new``."""
    problems = []
    for op_type in sorted({n.op_type for n in nodes if n.domain in ("", "ai.onnx")}):
        try:
            before = defs.get_schema(op_type, old, "")
            after = defs.get_schema(op_type, new, "")
        except defs.SchemaError:
            problems.append(f"{op_type} (no schema at opset {old} or {new})")
            continue
        if before.since_version == after.since_version:
            continue
        if after.deprecated:
            problems.append(f"{op_type} (deprecated at opset {new})")
            continue
        ins_a, outs_a, attrs_a = _signature(before)
        ins_b, outs_b, attrs_b = _signature(after)
        changed = [k for k, spec in attrs_a.items() if attrs_b.get(k) != spec]
        added = [k for k, spec in attrs_b.items() if k not in attrs_a and (spec[1] or (op_type, k) not in _SAFE_NEW_ATTRIBUTES)]
        if ins_a != ins_b or outs_a != outs_b or changed or added:
            problems.append(f"{op_type} (opset {before.since_version} -> {after.since_version} changes its signature)")
    if problems:
        raise DeploytkError(
            f"Native Attention needs ai.onnx opset {new}, but raising {where}'s opset {old} would change: " + ", ".join(problems) + ".",
            hint="Build with `attention_impl=plugin` (deploytk's attention kernel), which keeps the exported opset.",
        )


def _all_nodes(nodes):
    """``nodes`` and the nodes of their subgraphs (If/Loop/Scan bodies)."""
    for node in nodes:
        yield node
        for attr in node.attribute:
            for sub in itertools.chain([attr.g] if attr.HasField("g") else [], attr.graphs):
                yield from _all_nodes(sub.node)


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of each named value of the main graph, as far as shape inference knows it."""
    try:
        inferred = infer_shapes(model)
    except Exception:  # an unknown type only costs a CastLike
        inferred = model
    g = inferred.graph
    types = {init.name: init.data_type for init in g.initializer}
    for value in itertools.chain(g.input, g.value_info, g.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    return types


class _NameSource:
    """Fresh value and node names that collide with nothing in the model."""

    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.values = {x for n in _all_nodes(g.node) for x in itertools.chain(n.input, n.output)}
        self.values |= {v.name for v in itertools.chain(g.input, g.output, g.value_info, g.initializer)}
        self.nodes = {n.name for n in _all_nodes(g.node) if n.name}

    @staticmethod
    def _fresh(prefix: str, used: set[str]) -> str:
        name, i = prefix, 1
        while name in used:
            name, i = f"{prefix}_{i}", i + 1
        used.add(name)
        return name

    def fresh(self, prefix: str) -> str:
        return self._fresh(prefix, self.values)

    def fresh_node(self, prefix: str) -> str:
        return self._fresh(prefix, self.nodes)
