"""Real video and audio files the tests make themselves: a clip of a square moving over a gradient, and a chord."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def clip_frames(count: int = 16, size: tuple[int, int] = (48, 64)) -> list[np.ndarray]:
    """``count`` RGB frames (H x W x 3 uint8): a white square moving left to right over a gradient whose brightness
    rises with the frame's index (so a decoded frame tells which frame it was)."""
    h, w = size
    frames = []
    for i in range(count):
        base = np.full((h, w, 3), 10 + (200 * i) // max(count - 1, 1), np.uint8)
        base[..., 1] = np.linspace(0, 120, w, dtype=np.uint8)[None, :]
        x = (w - 12) * i // max(count - 1, 1)
        base[h // 2 - 6 : h // 2 + 6, x : x + 12] = 255
        frames.append(base)
    return frames


def write_clip(path: Path, count: int = 16, size: tuple[int, int] = (48, 64), fps: int = 8) -> list[np.ndarray]:
    """Encode ``clip_frames`` to ``path`` (mp4: MPEG-4 part 2; webm: VP9; avi: MJPEG) with PyAV; returns the frames."""
    import av

    codec = {".mp4": "mpeg4", ".webm": "libvpx-vp9", ".avi": "mjpeg"}[Path(path).suffix]
    frames = clip_frames(count, size)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height = size[1], size[0]
        stream.pix_fmt = "yuvj420p" if codec == "mjpeg" else "yuv420p"
        if codec == "mpeg4":
            stream.options = {"qscale": "2"}
        for rgb in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return frames


def write_sound(path: Path, seconds: float = 1.0, rate: int = 22050, hertz: tuple[float, ...] = (440.0, 660.0)) -> np.ndarray:
    """A stereo chord of ``hertz`` (one tone per channel, fading in) written with soundfile (wav or flac by suffix)."""
    import soundfile

    t = np.arange(int(seconds * rate)) / rate
    ramp = np.minimum(1.0, t / 0.1)
    channels = [0.3 * ramp * np.sin(2 * np.pi * f * t) for f in hertz]
    samples = np.stack(channels, axis=1).astype(np.float32)
    soundfile.write(str(path), samples, rate)
    return samples
