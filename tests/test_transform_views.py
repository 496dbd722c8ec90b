"""The fused transforms take a caller's array views as they are (issue 37, item 1: torch's resize reads a
strided crop without a numpy copy first): a view with a row stride wider than the row, a flipped
(negative-stride) view and a read-only array give the pixels of the same image made compact."""

from __future__ import annotations

import numpy as np
import torch

from readers.decode.transforms import imagenet_eval_transform, imagenet_train_transform, resized_crop


def _image(h: int = 181, w: int = 243) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(5)
    base = np.stack([(xx * 3) % 256, (yy * 5) % 256, ((xx + yy) * 7) % 256], axis=-1)
    return np.clip(base + rng.integers(-30, 30, base.shape), 0, 255).astype(np.uint8)


def test_strided_flipped_and_read_only_views_give_the_compact_images_output():
    wide = _image(181, 300)
    views = {
        "wider rows": wide[:, 20:263],
        "flipped": np.ascontiguousarray(wide[:, 20:263][:, ::-1])[:, ::-1],
        "read-only": np.ascontiguousarray(wide[:, 20:263]),
    }
    views["read-only"].flags.writeable = False
    compact = np.ascontiguousarray(wide[:, 20:263])
    box = (10, 15, 150, 200)
    want = [resized_crop(compact, box, (64, 64)), resized_crop(compact, box, (64, 64), flip=True),
            imagenet_eval_transform(64, 72)(compact), imagenet_train_transform(64, seed=1)(compact)]
    for name, view in views.items():
        assert view.strides != compact.strides or name == "read-only", name
        got = [resized_crop(view, box, (64, 64)), resized_crop(view, box, (64, 64), flip=True),
               imagenet_eval_transform(64, 72)(view), imagenet_train_transform(64, seed=1)(view)]
        for g, w in zip(got, want):
            assert g.is_contiguous() and torch.equal(g, w), name
