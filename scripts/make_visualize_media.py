"""Draw the docs' `deploytk visualize` pictures of a video and an audio model: ToMe on a synthetic clip and a synthetic sound.

The models are transformers classes built from small configs with seeded random weights (no download) and saved with
save_pretrained, as a config's `model: hf:<folder>` reads them; the clip (flat colour regions, a ball rolling across)
and the sound (a tone with harmonics, a pause, a rising chirp) are written here with PyAV and soundfile. As in the
image picture, random weights still give patches of one flat region nearly the same embedding, so ToMe merges within
regions first (on the spectrogram: the silence and the empty high bands).

    .venv/bin/python scripts/make_visualize_media.py [--output docs/assets]

writes `visualize_videomae.png` and `visualize_ast.png` there (needs the [hf], [media] and [bench] extras).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

FRAMES, HEIGHT, WIDTH, FPS = 16, 120, 160, 8
RATE, SECONDS = 16000, 4.0
LAYERS = dict(hidden_size=192, num_hidden_layers=8, num_attention_heads=3, intermediate_size=768, num_labels=10)
VIDEOMAE = dict(image_size=112, patch_size=16, num_frames=8, tubelet_size=2, **LAYERS)  # 4 tubelet groups of 7x7 patches
AST = dict(patch_size=16, frequency_stride=10, time_stride=10, max_length=400, num_mel_bins=128, **LAYERS)  # 12x39 patches


def clip_frames() -> list[np.ndarray]:
    """A ball rolling left to right over sky, hills and a road (flat colours), ``FRAMES`` RGB frames."""
    frames = []
    for i in range(FRAMES):
        img = Image.new("RGB", (WIDTH, HEIGHT), (135, 190, 235))  # sky
        d = ImageDraw.Draw(img)
        d.ellipse((-40, 50, 90, 130), fill=(90, 160, 70))  # hills
        d.ellipse((70, 60, 220, 140), fill=(70, 140, 60))
        d.rectangle((0, 92, WIDTH, HEIGHT), fill=(120, 120, 125))  # road
        d.ellipse((120, 12, 145, 37), fill=(250, 210, 60))  # sun
        x = 10 + (WIDTH - 50) * i // (FRAMES - 1)
        d.ellipse((x, 66, x + 30, 96), fill=(200, 40, 40))  # the ball
        frames.append(np.asarray(img))
    return frames


def write_clip(path: Path) -> None:
    import av  # deploytk[media]

    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=FPS)  # lossless: the frames drawn are the frames made, no codec blocks
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv444p"
        for rgb in clip_frames():
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def write_sound(path: Path) -> None:
    """1.5 s of a 330 Hz tone with three harmonics, 1 s of silence, 1.5 s of a chirp rising from 300 Hz to 4 kHz."""
    import soundfile  # deploytk[media]

    t = np.arange(int(SECONDS * RATE)) / RATE
    tone = sum(0.3 / k * np.sin(2 * np.pi * 330 * k * t) for k in range(1, 5)) * (t < 1.5)
    start = 2.5
    u = np.clip(t - start, 0, None)
    rise = (4000 - 300) / (SECONDS - start)
    chirp = 0.3 * np.sin(2 * np.pi * (300 * u + rise * u * u / 2)) * (t >= start)
    soundfile.write(str(path), (tone + chirp).astype(np.float32), RATE)


def saved(model_class: str, config_class: str, settings: dict, folder: Path, seed: int) -> Path:
    import torch
    import transformers  # deploytk[hf]

    torch.manual_seed(seed)
    getattr(transformers, model_class)(getattr(transformers, config_class)(**settings)).eval().save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("docs/assets"))
    args = parser.parse_args()
    import deploytk

    with tempfile.TemporaryDirectory(prefix="visualize-media-") as tmp:
        work = Path(tmp)
        write_clip(work / "clip.mkv")
        write_sound(work / "sound.wav")
        runs = [
            ("videomae", saved("VideoMAEForVideoClassification", "VideoMAEConfig", VIDEOMAE, work / "videomae", 0), "clip.mkv", 20),
            ("ast", saved("ASTForAudioClassification", "ASTConfig", AST, work / "ast", 1), "sound.wav", 48),
        ]
        for name, folder, sample, r in runs:
            out = args.output / f"visualize_{name}.png"
            report = deploytk.visualize(
                f"hf:{folder}", work / sample, output=out, method="tome", r=r, layers=[1, 3, 5, 7], config_name=f"{name} (random weights)"
            )
            print(f"wrote {out}: tokens after blocks 1, 3, 5, 7: {[layer['tokens'] for layer in report.to_dict()['layers']]}")


if __name__ == "__main__":
    main()
