"""A stand-in for a few ``torchvision.transforms`` (torchvision does not import beside this CPU torch):
the same call conventions (``ToTensor`` takes a PIL image or an ndarray and refuses a tensor with
torchvision's message; ``Compose`` holds ``.transforms``; PIL in, PIL out for the geometric steps)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img


class RandomApply(torch.nn.Module):
    def __init__(self, transforms, p=0.5):
        super().__init__()
        self.transforms, self.p = transforms, p

    def forward(self, img):
        if self.p < torch.rand(1):
            return img
        for t in self.transforms:
            img = t(img)
        return img


class Resize:
    def __init__(self, size):
        self.size = size

    def __call__(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        if w <= h:
            return img.resize((self.size, int(self.size * h / w)), Image.BILINEAR)
        return img.resize((int(self.size * w / h), self.size), Image.BILINEAR)


class CenterCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        left, top = int(round((w - self.size) / 2.0)), int(round((h - self.size) / 2.0))
        return img.crop((left, top, left + self.size, top + self.size))


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = p

    def __call__(self, img: Image.Image) -> Image.Image:
        if not isinstance(img, Image.Image):
            raise TypeError(f"img should be PIL Image. Got {type(img)}")
        return img.transpose(Image.FLIP_LEFT_RIGHT) if torch.rand(1) < self.p else img


class ToTensor:
    def __call__(self, pic) -> torch.Tensor:
        if not (isinstance(pic, Image.Image) or isinstance(pic, np.ndarray)):
            raise TypeError(f"pic should be PIL Image or ndarray. Got {type(pic)}")
        arr = np.asarray(pic, dtype=np.uint8)
        return torch.from_numpy(arr.transpose(2, 0, 1).copy()).float().div(255)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return (t - self.mean) / self.std


class Grayscale:
    """A tensor-in, tensor-out step (like v2 transforms on a uint8 tensor)."""

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        return t.float().mean(0, keepdim=True).expand(3, -1, -1).to(t.dtype)
