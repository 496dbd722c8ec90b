"""Resize-then-center-crop geometry: the one definition, shared by packer, readers and bench.

"Shorter side to ``resize``, then the center ``crop``" is torchvision's
``Resize(resize)`` followed by ``CenterCrop(crop)``:

* ``Resize(n)`` on an image with ``w <= h`` gives ``n x int(n * h / w)``
  (shorter side exactly ``n``, longer side truncated), and the mirror image
  otherwise;
* ``CenterCrop((ch, cw))`` starts at ``top = int(round((h - ch) / 2))``,
  ``left = int(round((w - cw) / 2))`` (Python's round: halves to even).

The readers' eval transform (:func:`readers.decode.transforms.resize_center_crop_box`),
the packer's ``mmap --resize`` and the benchmarks' naive baseline all take
their sizes from here. Plain integers only, no torch: the packer's worker
processes import it.
"""

from __future__ import annotations

from numbers import Integral
from typing import NamedTuple

__all__ = ["ResizeCrop", "resize_short_side", "resize_center_crop"]


class ResizeCrop(NamedTuple):
    """Resize the image to ``height x width``, then keep ``crop_height x crop_width`` from ``(top, left)``."""

    height: int
    width: int
    top: int
    left: int
    crop_height: int
    crop_width: int

    @property
    def box(self) -> tuple[int, int, int, int]:
        """The crop as PIL's ``(left, upper, right, lower)`` in resized pixels."""
        return self.left, self.top, self.left + self.crop_width, self.top + self.crop_height


def resize_short_side(height: int, width: int, size: int) -> tuple[int, int]:
    """``(height, width)`` after torchvision's ``Resize(size)``: shorter side ``size``, longer side truncated."""
    if height < 1 or width < 1:
        raise ValueError(f"image size must be positive, got {height}x{width}")
    if size < 1:
        raise ValueError(f"resize must be >= 1, got {size}")
    if width <= height:
        return int(size * height / width), size
    return size, int(size * width / height)


def resize_center_crop(height: int, width: int, resize: int, crop: int | tuple[int, int]) -> ResizeCrop:
    """Sizes and offsets of ``Resize(resize)`` + ``CenterCrop(crop)`` for a ``height x width`` image.

    ``crop`` is one side or ``(height, width)``. A crop larger than the
    resized image gives negative offsets (torchvision pads there); callers
    that cannot pad should keep ``crop <= resize``.
    """
    ch, cw = (int(crop), int(crop)) if isinstance(crop, (int, Integral)) else (int(crop[0]), int(crop[1]))
    if ch < 1 or cw < 1:
        raise ValueError(f"crop must be positive, got {ch}x{cw}")
    rh, rw = resize_short_side(height, width, resize)
    return ResizeCrop(rh, rw, int(round((rh - ch) / 2.0)), int(round((rw - cw) / 2.0)), ch, cw)
