"""Decoding stored image bytes to RGB uint8 arrays (HWC).

Counterpart of ``packer/images.py``, which decides what bytes are stored.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

__all__ = ["decode_rgb"]


def decode_rgb(data: bytes | memoryview) -> np.ndarray:
    """Decode JPEG/PNG bytes to an RGB ``uint8`` array of shape (H, W, 3)."""
    with Image.open(io.BytesIO(data)) as im:
        return np.asarray(im.convert("RGB"))
