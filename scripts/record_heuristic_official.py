"""Record the official l1 / l2 / l-inf heuristic's kept tokens for deploytk's tests.

The "Which Tokens to Use?" study's fixed-pattern pruning (JoakimHaurum/TokenReduction,
``models/heuristic.py``, the ``--not_contiguous`` keep-rate mode) keeps, from each reduction
block on, the patches within an L1 / L2 / L-inf radius of the image centre, the radius chosen
so that the count is closest to int(num_patches * keep_rate^(stage + 1)). This script calls the
official ``prep_pattern_stage_subset`` on a stand-in for the model (it reads only the fields set
below) and writes, per grid, pattern and keep rate, the kept-patch mask of every block to
``tests/data/heuristic_official_masks.npz``. Only the recorded masks are kept in the repository.

Usage: python scripts/record_heuristic_official.py PATH/TO/TokenReduction
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "heuristic_official_masks.npz"
GRIDS = (14, 8)  # DeiT at 224 px (16 px patches); the digits ViT (32 px, 4 px patches)
PATTERNS = ("l1", "l2", "linf")
KEEP_RATES = (0.25, 0.5, 0.7, 0.9)  # the study's keep rates
REDUCTION_LOC = [3, 6, 9]  # the study's blocks 4, 7 and 10, 0-indexed
DEPTH = 12


def main(repo: Path) -> None:
    spec = importlib.util.spec_from_file_location("official_heuristic", repo / "models" / "heuristic.py")
    official = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec.loader.exec_module(official)
    masks = {}
    for grid in GRIDS:
        for pattern in PATTERNS:
            for keep_rate in KEEP_RATES:
                model = SimpleNamespace(
                    patch_embed=SimpleNamespace(num_patches=grid * grid),
                    heuristic_pattern=pattern,
                    depth=DEPTH,
                    reduction_loc=REDUCTION_LOC,
                    keep_rate=[keep_rate],
                )
                # HeuristicVisionTransformer.__init__'s token targets for a single keep rate
                num_tokens = [int(model.patch_embed.num_patches * keep_rate ** (idx + 1)) for idx in range(len(REDUCTION_LOC))]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    z, threshold, _ = official.HeuristicVisionTransformer.prep_pattern_stage_subset(model, num_tokens)
                masks[f"grid{grid}_{pattern}_k{keep_rate}"] = np.stack([(z <= t).reshape(-1).numpy() for t in threshold])
    np.savez_compressed(OUT, **masks)
    print(f"wrote {OUT} ({len(masks)} masks)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
