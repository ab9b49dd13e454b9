"""The ONNX a build parses: deploytk nodes switched between plugin and native per build.

TensorRT's parser turns a node that carries ``plugin_namespace`` into the registered plugin
``namespace::op_type`` and inlines the node's model-local function when the node is not a
plugin node (onnx-tensorrt ModelImporter: ``attrs.count("plugin_namespace")`` selects the
plugin path). So ``native`` means: drop the plugin attributes (merge ops), or rewrite to the
standard ``Attention`` op that TensorRT fuses (``export.native_attention``). Ops without a
deploytk plugin (none today) always go native.
"""

from __future__ import annotations

import onnx

from deploytk.build.options import BuildOptions
from deploytk.errors import DeploytkError
from deploytk.exporter.native_attention import use_native_attention
from deploytk.ops import DOMAIN, OPS, PLUGIN_ATTRIBUTES
from deploytk.optional import version_tuple

ATTENTION_OP = "ProportionalAttention"
#: the first TensorRT whose ONNX parser imports the standard ``Attention`` op (10.14 added
#: IAttention and the parser's Attention importer; earlier parsers find no importer for it)
NATIVE_ATTENTION_MIN_TENSORRT = (10, 14)
#: what ``merge_impl`` switches: every matching op and TokenAggregate
MERGE_PLUGIN_OPS = tuple(op for op in OPS if op != ATTENTION_OP)


def _strip_plugin_attributes(node: onnx.NodeProto) -> None:
    keep = [a for a in node.attribute if a.name not in PLUGIN_ATTRIBUTES]
    del node.attribute[:]
    node.attribute.extend(keep)


def prepare_for_build(model: onnx.ModelProto, options: BuildOptions, plugin_ops: tuple[str, ...]) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` for TensorRT's parser, and the deploytk op types that will run as plugins."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    has_attention = any(n.domain == DOMAIN and n.op_type == ATTENTION_OP for n in out.graph.node)
    if options.attention_impl == "native" and has_attention:
        # no softmax_precision: TensorRT's parser refuses Attention nodes that set it
        out = use_native_attention(out, expand_mask=False, softmax_precision=False)
    wanted = set(plugin_ops)
    if options.merge_impl == "native":
        wanted -= set(MERGE_PLUGIN_OPS)
    plugins = set()
    for node in out.graph.node:
        if node.domain != DOMAIN:
            continue
        if node.op_type in wanted:
            plugins.add(node.op_type)
        else:
            _strip_plugin_attributes(node)  # the parser inlines the function body
    return out, sorted(plugins)


def check_tensorrt_supports(model: onnx.ModelProto, options: BuildOptions, tensorrt_version: str) -> None:
    """Refuse, before any parsing, a build this TensorRT cannot do: native attention needs >= 10.14."""
    has_attention = any(n.domain == DOMAIN and n.op_type == ATTENTION_OP for n in model.graph.node)
    if options.attention_impl != "native" or not has_attention:
        return
    version = version_tuple(tensorrt_version)
    if version is None:
        return  # an unparsable version string: let the parser decide
    if version < NATIVE_ATTENTION_MIN_TENSORRT:
        need = ".".join(map(str, NATIVE_ATTENTION_MIN_TENSORRT))
        raise DeploytkError(
            f"`attention_impl=native` needs TensorRT >= {need} (its ONNX parser imports the standard Attention op "
            f"from {need} on); this is TensorRT {tensorrt_version}.",
            hint=f"Use `attention_impl=plugin` (deploytk's ProportionalAttention kernel), or install TensorRT >= {need}.",
        )
