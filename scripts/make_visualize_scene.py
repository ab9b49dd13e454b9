"""Draw the synthetic scene of the `deploytk visualize` picture in the docs: flat colour regions (sky, ground, sun, house, tree).

Flat regions make what token merging does visible even with random weights: patches of one
colour have nearly the same embedding, so ToMe merges within a region first.

    .venv/bin/python scripts/make_visualize_scene.py [--output assets/visualize/scene.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from PIL import Image, ImageDraw

SIZE = 224


def scene() -> Image.Image:
    img = Image.new("RGB", (SIZE, SIZE), (135, 190, 235))  # sky
    d = ImageDraw.Draw(img)
    d.rectangle((0, 150, SIZE, SIZE), fill=(90, 160, 70))  # ground
    d.ellipse((160, 20, 205, 65), fill=(250, 210, 60))  # sun
    d.rectangle((40, 100, 120, 170), fill=(190, 60, 50))  # house
    d.polygon([(30, 100), (80, 55), (130, 100)], fill=(110, 70, 40))  # roof
    d.rectangle((70, 130, 90, 170), fill=(60, 40, 30))  # door
    d.rectangle((160, 120, 172, 175), fill=(90, 60, 35))  # tree trunk
    d.ellipse((138, 80, 194, 132), fill=(40, 110, 45))  # tree crown
    return img


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("assets/visualize/scene.png"))
    args = parser.parse_args()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    scene().save(args.output)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
