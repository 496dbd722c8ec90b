"""The naive baseline every reader is compared with: one file per sample, read with PIL.

What a first training script does with torchvision's ``ImageFolder`` and
``Resize(256), CenterCrop(224), ToTensor()``: open the file, ``convert("RGB")``,
resize the shorter side to 256 (bilinear), keep the center 224 x 224, and turn
it into a float32 CHW tensor in [0, 1], through a plain ``DataLoader`` with its
defaults. Re-implemented here (torchvision is not a dependency) with the
geometry of :mod:`readers.decode.geometry`, the same as the readers' eval transform.
This is the project's one naive baseline: ``dataset-bench``, the benchmark
scripts and the notebooks all use it. :class:`PilEvalTransform` is the same
per-image work after the open, as a ``transform=`` a user hands our readers
(``image="pil"``): the side-by-side run compares the two.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from readers.decode.geometry import resize_center_crop

__all__ = ["NaiveImageFolder", "naive_load", "naive_loader", "pil_eval", "PilEvalTransform"]


def naive_load(fp: Any, resize: int = 256, crop: int = 224) -> Any:
    """The naive per-file work: PIL open, RGB, shorter side to ``resize``, center crop, float32 CHW in [0, 1].

    ``fp`` is a path or a binary file object.
    """
    from PIL import Image

    with Image.open(fp) as im:
        img = im.convert("RGB")
    return pil_eval(img, resize, crop)


def pil_eval(img: Any, resize: int = 256, crop: int = 224) -> Any:
    """A PIL RGB image: shorter side to ``resize`` (bilinear), center crop ``crop``, float32 CHW in [0, 1]
    (torchvision's ``Resize``, ``CenterCrop``, ``ToTensor``)."""
    import torch
    from PIL import Image

    g = resize_center_crop(img.height, img.width, resize, crop)
    img = img.resize((g.width, g.height), Image.Resampling.BILINEAR).crop(g.box)
    arr = np.array(img, dtype=np.uint8)
    # exactly torchvision's ToTensor: HWC -> contiguous CHW, then float / 255
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous().to(torch.float32).div(255)


class PilEvalTransform:
    """A user's own transform, the way one writes it for torchvision: PIL image in, :func:`pil_eval`
    out (resize 256, center crop 224, to tensor). A plain callable (no ``accepts_bytes``): our readers
    decode and hand it a PIL image when opened with ``image="pil"``. Picklable."""

    def __init__(self, resize: int = 256, crop: int = 224) -> None:
        self.resize, self.crop = resize, crop

    def __call__(self, img: Any) -> Any:
        return pil_eval(img, self.resize, self.crop)

    def __repr__(self) -> str:
        return f"PilEvalTransform(resize={self.resize}, crop={self.crop})"


class NaiveImageFolder:
    """The baseline dataset: ``root/<class>/<image>``, one :func:`naive_load` per sample.

    Files and labels come from the packer's scan of the folder (the same
    order and classes the packed datasets have); ``sizes`` are the files'
    byte sizes.
    """

    def __init__(self, root: str | os.PathLike, resize: int = 256, crop: int = 224) -> None:
        from packer.sources.source import scan

        source = scan(root)
        self.root = Path(root)
        self.files = [str(self.root / p) for p in source.paths]
        self.labels = list(source.labels)
        self.sizes = list(source.sizes)
        self.resize, self.crop = resize, crop

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return naive_load(self.files[i], self.resize, self.crop), self.labels[i]


def naive_loader(root: str | os.PathLike, *, batch_size: int, num_workers: int, seed: int = 0) -> Any:
    """:class:`NaiveImageFolder` through a plain ``DataLoader``: shuffled, otherwise its defaults
    (no pinning, workers not persistent)."""
    import torch
    from torch.utils.data import DataLoader

    g = torch.Generator()
    g.manual_seed(seed)
    dataset: Any = NaiveImageFolder(root)  # a map-style dataset by protocol (__len__, __getitem__)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                      generator=g)
