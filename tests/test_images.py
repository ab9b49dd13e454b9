"""Images are read faithfully, in one place (deploytk.data.read_rgb), for every command.

Each case writes a file whose pixels are known (PNGs encoded here with zlib, not by Pillow), and
compares the model input deploytk makes from it with timm's transform of an RGB image computed
independently from those pixels with numpy.
"""

import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from deploytk.adapters import adapt
from deploytk.data import load_samples, read_rgb
from deploytk.errors import DeploytkError
from deploytk.inputs import ImageInput

RNG = np.random.default_rng(0)
H, W = 20, 28  # not square: a rotation shows


def write_png(path, pixels: np.ndarray, color_type: int, bit_depth: int, palette: np.ndarray | None = None) -> None:
    """A PNG straight from ``pixels`` (no filter): color type 0 gray, 2 RGB, 3 palette, 4 gray+alpha, 6 RGBA."""
    h, w = pixels.shape[:2]
    if bit_depth == 1:
        rows = [np.packbits(pixels[y].astype(np.uint8)).tobytes() for y in range(h)]
    else:
        rows = [pixels[y].astype(">u2" if bit_depth == 16 else "u1").tobytes() for y in range(h)]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    body = chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0))
    if palette is not None:
        body += chunk(b"PLTE", palette.astype(np.uint8).tobytes())
    body += chunk(b"IDAT", zlib.compress(b"".join(b"\x00" + r for r in rows)))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body + chunk(b"IEND", b""))


def gray16():
    v = RNG.integers(0, 65536, (H, W), dtype=np.uint16)
    return v, np.repeat((v >> 8).astype(np.uint8)[..., None], 3, axis=2)


def rgb16():
    v = RNG.integers(0, 65536, (H, W, 3), dtype=np.uint16)
    return v, (v >> 8).astype(np.uint8)


def gray_alpha16():
    v = RNG.integers(0, 65536, (H, W, 2), dtype=np.uint16)
    return v, np.repeat((v[..., :1] >> 8).astype(np.uint8), 3, axis=2)


def gray8():
    v = RNG.integers(0, 256, (H, W), dtype=np.uint8)
    return v, np.repeat(v[..., None], 3, axis=2)


def rgba8():
    v = RNG.integers(0, 256, (H, W, 4), dtype=np.uint8)
    return v, v[..., :3]  # the alpha is dropped, as timm's and torchvision's loaders drop it


def bilevel():
    v = RNG.integers(0, 2, (H, W), dtype=np.uint8)
    return v, np.repeat((v * 255)[..., None], 3, axis=2)


PALETTE = RNG.integers(0, 256, (16, 3), dtype=np.uint8)


def palette():
    v = RNG.integers(0, 16, (H, W), dtype=np.uint8)
    return v, PALETTE[v]


PNG_CASES = {
    "16-bit gray (I;16)": (gray16, 0, 16),
    "16-bit RGB": (rgb16, 2, 16),
    "16-bit gray + alpha": (gray_alpha16, 4, 16),
    "8-bit gray (L)": (gray8, 0, 8),
    "8-bit RGBA": (rgba8, 6, 8),
    "1-bit (1)": (bilevel, 0, 1),
    "palette (P)": (palette, 3, 8),
}


@pytest.fixture(scope="module")
def transform():
    import timm

    return adapt(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=96, num_heads=3)).eval_transform()


#: read_rgb's images go through load_samples as an image kind's files
IMAGE = ImageInput(3, 224, 224)


def model_input_of(rgb: np.ndarray, transform) -> np.ndarray:
    return transform(Image.fromarray(rgb)).numpy()[None]


@pytest.mark.parametrize("case", list(PNG_CASES))
def test_png_modes_give_the_model_input_of_their_faithful_rgb(case, tmp_path, transform):
    make, color_type, bit_depth = PNG_CASES[case]
    pixels, expected_rgb = make()
    path = tmp_path / "image.png"
    write_png(path, pixels, color_type, bit_depth, PALETTE if color_type == 3 else None)
    assert np.array_equal(np.asarray(read_rgb(path)), expected_rgb)
    assert np.array_equal(load_samples([path], transform, IMAGE), model_input_of(expected_rgb, transform))


def test_a_16_bit_png_is_not_read_as_white(tmp_path, transform):
    """The defect: Pillow's convert("RGB") clips 16-bit samples at 255, so a mid-gray 16-bit image became white."""
    path = tmp_path / "mid_gray.png"
    write_png(path, np.full((H, W), 32768, dtype=np.uint16), 0, 16)
    assert np.asarray(read_rgb(path)).max() == 128
    with Image.open(path) as img:
        assert np.asarray(img.convert("RGB")).min() == 255  # what the old loader fed the model


def test_cmyk_follows_pillow_s_rule(tmp_path, transform):
    cmyk = RNG.integers(0, 256, (H, W, 4), dtype=np.uint8)
    path = tmp_path / "cmyk.tif"
    Image.fromarray(cmyk, "CMYK").save(path)
    c, k = cmyk[..., :3].astype(float), cmyk[..., 3:].astype(float)
    expected = np.round((255 - c) * (255 - k) / 255).astype(np.uint8)
    got = np.asarray(read_rgb(path)).astype(int)
    assert np.abs(got - expected).max() <= 1  # Pillow's integer rounding of the same formula


def test_exif_orientation_is_applied(tmp_path, transform):
    rgb = RNG.integers(0, 256, (H, W, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    path = tmp_path / "rotated.png"
    Image.fromarray(rgb).save(path, exif=exif)
    expected = np.rot90(rgb, k=-1)
    assert np.array_equal(np.asarray(read_rgb(path)), expected)
    assert np.array_equal(load_samples([path], transform, IMAGE), model_input_of(np.ascontiguousarray(expected), transform))


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p.write_text("not an image"), "could not be read (cannot identify image file"),
        (lambda p: Image.fromarray(np.ones((4, 4), np.float32)).save(p.with_suffix(".tif")), "32-bit floating-point pixels"),
        (lambda p: Image.fromarray(np.full((4, 4), 70000, np.int32)).save(p.with_suffix(".tif")), "outside 0..65535"),
    ],
    ids=["not an image", "float pixels", "32-bit integers beyond 16 bits"],
)
def test_what_cannot_be_made_rgb_is_refused_with_the_file_name(tmp_path, make, message):
    path = tmp_path / "bad.png"
    make(path)
    path = path if path.exists() else path.with_suffix(".tif")
    with pytest.raises(DeploytkError) as err:
        read_rgb(path)
    assert str(path) in str(err.value) and message in str(err.value)
