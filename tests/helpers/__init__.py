"""What several test modules share: seeded weights, the shipped configs, the shared exports, file-system snapshots.

Imported as ``helpers`` (pyproject's pytest ``pythonpath`` holds ``tests``); fixtures live in the conftest.py files.
"""

from helpers.configs import CONFIGS, DIGITS_INPUT, ROOT, digits_config, export_config, tome_model
from helpers.exports import ExportCache
from helpers.files import snapshot
from helpers.plugins import assert_every_deploytk_node_builds_as_a_plugin
from helpers.weights import (
    VISIONZIP_BUDGETS,
    VISIONZIP_TOWER,
    official_learned_layout,
    seeded_images,
    seeded_init,
    seeded_learned_state,
)

__all__ = [
    "VISIONZIP_BUDGETS",
    "VISIONZIP_TOWER",
    "CONFIGS",
    "DIGITS_INPUT",
    "ROOT",
    "ExportCache",
    "assert_every_deploytk_node_builds_as_a_plugin",
    "digits_config",
    "export_config",
    "official_learned_layout",
    "seeded_images",
    "seeded_init",
    "seeded_learned_state",
    "snapshot",
    "tome_model",
]
