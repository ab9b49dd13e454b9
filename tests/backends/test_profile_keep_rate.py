"""`deploytk profile` on a keep-rate method's artifact, whose manifest has no merge.r (it used to end in a KeyError)."""

import json

import pytest
from typer.testing import CliRunner

from deploytk.cli import app


@pytest.mark.slow  # slow tier since issue 55: the quick check reaches every line it covers through other tests
def test_profile_reports_the_keep_rate_settings(exported):
    art = exported("digits_vit_evit_k70")
    args = ["profile", str(art), "--batch-sizes", "1", "--warmup", "0", "--iterations", "1"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["r"] is None and report["method_options"] == {"layers": [3, 6, 9], "keep_rate": 0.7}
    assert report["results"][0]["speedup_vs_dense"] > 0
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0 and "evit layers=[3, 6, 9], keep_rate=0.7 fp32" in " ".join(table.output.split())
