"""The method registry: what each method says it exports is what it traces, the docs table comes from it, bad registrations fail."""

import json
import re
from pathlib import Path

import pytest
import timm
import torch

from deploytk.cli.render import methods_markdown
from deploytk.exporter.onnx_export import traced_op_counts
from deploytk.merging.merged_vit import build_merged
from deploytk.merging.reduction import METHODS, Reduction, register_method
from deploytk.ops import OPS
from deploytk.reducers import describe_methods, get_method

from helpers import seeded_init

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
@pytest.mark.parametrize("name", sorted(METHODS))
def test_declared_ops_are_the_traced_ones(name):
    """``Reduction.ops`` (what `deploytk methods` lists) against the deploytk ops torch.export finds in the model."""
    method = get_method(name)
    vit = seeded_init(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=48, num_heads=3, depth=12))
    # no prop_attn (only the method's ops), unless the method needs it
    model = build_merged(method, vit, 4, method.needs_prop_attn, method.parse_options({})).eval()
    with torch.no_grad():
        program = torch.export.export(model, (torch.zeros(2, 3, 32, 32),))
    traced = traced_op_counts(program.graph)
    assert set(traced) == set(method.ops) and set(method.ops) <= set(OPS), (name, traced)


def test_the_methods_page_table_is_the_registry():
    """The methods guide's table (docs/guides/methods.md) is `deploytk methods --markdown`, verbatim."""
    text = (ROOT / "docs" / "guides" / "methods.md").read_text()
    table = re.search(r"<!-- methods table: deploytk methods --markdown -->\n(.*?)<!-- end methods table -->", text, re.S)
    assert table, "docs/guides/methods.md has lost its methods table markers"
    assert table.group(1) == methods_markdown(describe_methods())


def test_the_cli_description_is_the_registry():
    """`deploytk methods` prints deploytk/cli/methods.json (the registry imports torch); it must be describe_methods()."""
    written = json.loads((ROOT / "deploytk" / "cli" / "methods.json").read_text())
    assert written == describe_methods(), "deploytk/cli/methods.json is stale: run python scripts/write_cli_methods.py"


def test_every_method_documents_every_option():
    for m in describe_methods():
        assert m["summary"] and all(o["description"] for o in m["options"]), m["name"]


def test_register_method_refuses_a_clash_or_a_nameless_class():
    with pytest.raises(TypeError, match="needs a Reduction subclass with its own `name`"):
        register_method(type("Nameless", (Reduction,), {}))
    clash = type("Clash", (Reduction,), {"name": "tome", "__module__": "somewhere.else"})
    with pytest.raises(TypeError, match="method name 'tome' is registered twice"):
        register_method(clash)
    assert METHODS["tome"] is get_method("tome") and METHODS["tome"] is not clash
