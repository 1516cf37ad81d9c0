"""The PNG writer's stored pixel data (app/platform/tiny_images.py): a zlib stream any inflater reads back,
split into blocks where one would overflow its 16-bit length, and a PNG of it that the server takes."""

from __future__ import annotations

import zlib

from app.platform.tiny_images import png, scanlines, stored
from app.wire.images import read_image


def test_stored_data_inflates_to_itself_across_block_boundaries() -> None:
    block = 0xFFFF
    for size in (0, 1, block - 1, block, block + 1, 3 * block + 7):
        data = bytes((i * 7) % 251 for i in range(size))
        assert zlib.decompress(stored(data)) == data, size


def test_a_png_with_stored_pixel_data_is_taken_with_its_size() -> None:
    image = read_image(png(5, 3, seed=2, compressed=False))
    assert (image.format, image.width, image.height) == ("png", 5, 3)
    assert zlib.compress(scanlines(5, 3, seed=2)) not in image.data, "the pixel data was deflated, not stored"
