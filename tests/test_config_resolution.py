"""A config is resolved once: the method is looked up by name and its options parsed when the config is read, and every
later layer (the reference, inspect, the manifest's config, tune) takes the resolved class from the config."""

from __future__ import annotations

import pytest

import deploytk.config
from deploytk.analysis.inspect import inspect_config
from deploytk.config import config_from_dict, config_to_dict
from deploytk.errors import DeploytkError
from deploytk.reducers.evit import EViT


def test_the_method_is_looked_up_once_for_a_whole_inspect(monkeypatch):
    calls = []
    real = deploytk.config.get_method
    monkeypatch.setattr(deploytk.config, "get_method", lambda name: calls.append(name) or real(name))
    cfg = config_from_dict(
        {"model": "deit_tiny_patch16_224", "merge": {"method": "evit", "options": {"keep_rate": 0.7}}, "export": {"img_size": 64}}
    )
    report = inspect_config(cfg)
    config_to_dict(cfg)
    assert calls == ["evit"]
    assert cfg.merge.reduction is EViT and cfg.merge.parsed_options.keep_rate == 0.7
    assert report["method"] == "evit" and report["method_options"]["keep_rate"] == 0.7


def test_a_copy_with_other_options_is_resolved_again():
    cfg = config_from_dict({"merge": {"method": "evit", "options": {"keep_rate": 0.7}}})
    copy = cfg.model_copy(update={"merge": cfg.merge.model_copy(update={"options": {"keep_rate": 0.5}})})
    assert cfg.merge.parsed_options.keep_rate == 0.7 and copy.merge.parsed_options.keep_rate == 0.5


def test_bad_options_are_refused_when_the_config_is_read():
    with pytest.raises(DeploytkError, match=r"invalid config \(in memory\): unknown option `merge.options.keep` for method evit"):
        config_from_dict({"merge": {"method": "evit", "options": {"keep": 0.7}}})
