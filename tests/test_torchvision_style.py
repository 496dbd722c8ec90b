"""torchvision-style pipelines: what ``transform`` receives, image="pil" for ToTensor pipelines, Compose
keeping the fused decode, and a one-time warning when a fused transform is wrapped where it is lost."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import readers.decode.compose
import tv_standin as T
from readers import make_loader, open_dataset
from readers.contract.spec import FORMATS
from readers.decode.transforms import Compose, accepts_bytes, imagenet_eval_transform, imagenet_train_transform

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(autouse=True)
def fresh_warning(monkeypatch):
    monkeypatch.setattr(readers.decode.compose, "_warned_lost", False)


class Spy:
    """Records the type of what it is given; passes it on."""

    def __init__(self):
        self.seen = []

    def __call__(self, x):
        self.seen.append(type(x))
        return x


class FusedSpy(Spy):
    """A fused transform that records what the reader hands it."""

    accepts_bytes = True

    def __init__(self, fused):
        super().__init__()
        self.fused = fused

    def __call__(self, x):
        self.seen.append(type(x))
        return self.fused(x)


def classic():
    return T.Compose([T.Resize(40), T.CenterCrop(32), T.RandomHorizontalFlip(p=0.0), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


@pytest.mark.parametrize("fmt", FORMATS, ids=FORMATS)
def test_classic_totensor_pipeline_runs_unchanged_with_image_pil(packed_generated, fmt, stored_bytes):
    ds = open_dataset(packed_generated[fmt], transform=classic(), image="pil", return_index=True)
    images, _labels, idx = next(iter(make_loader(ds, batch_size=4, num_workers=0)))
    assert images.dtype == torch.float32 and images.shape == (4, 3, 32, 32)
    for k, i in enumerate(idx.tolist()):
        data = stored_bytes(packed_generated[fmt], i)
        if fmt == "mmap":
            h, w = int(ds.index.arrays["heights"][i]), int(ds.index.arrays["widths"][i])
            pil = Image.fromarray(np.frombuffer(data, np.uint8).reshape(h, w, 3), "RGB")
        else:
            pil = Image.open(io.BytesIO(data)).convert("RGB")
        torch.testing.assert_close(images[k], classic()(pil), rtol=0, atol=0)


def test_default_image_is_a_uint8_chw_tensor_so_totensor_refuses_it(packed_generated):
    ds = open_dataset(packed_generated["lmdb"], transform=T.Compose([T.ToTensor()]))
    with pytest.raises(TypeError, match="pic should be PIL Image or ndarray"):
        ds[0]
    spy = Spy()
    open_dataset(packed_generated["lmdb"], transform=spy)[0]
    assert spy.seen == [torch.Tensor]
    pil_spy = Spy()
    item = open_dataset(packed_generated["hdf5"], transform=None, image="pil")[0]
    assert isinstance(item[0], Image.Image) and item[0].mode == "RGB"
    open_dataset(packed_generated["hdf5"], transform=pil_spy, image="pil")[0]
    assert pil_spy.seen == [Image.Image]
    with pytest.raises(ValueError, match="image must be one of"):
        open_dataset(packed_generated["hdf5"], image="numpy")


@pytest.mark.parametrize("compose", [Compose, T.Compose], ids=["ours", "torchvision-style"])
def test_compose_with_a_fused_first_step_keeps_the_fused_path(packed_generated, compose):
    spy, fused = Spy(), FusedSpy(imagenet_eval_transform(size=32, resize=36))
    pipeline = compose([fused, spy, T.Grayscale()])
    assert accepts_bytes(pipeline)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = open_dataset(packed_generated["wds"], transform=pipeline)
        image, _ = next(iter(ds))
    assert fused.seen == [bytes], "the fused first step did not get the stored bytes"
    assert spy.seen == [torch.Tensor] and image.shape == (3, 32, 32) and image.dtype == torch.uint8
    nested = Compose([compose([fused]), T.Grayscale()])
    assert accepts_bytes(nested)


@pytest.mark.parametrize("make", [
    lambda f: T.Compose([T.Grayscale(), f]),          # not first
    lambda f: T.Compose([T.RandomApply([f], p=1.0)]),  # inside a wrapper that may skip it
    lambda f: Compose([Compose([T.Grayscale(), f])]),  # nested, not first
], ids=["second", "random-apply", "nested"])
def test_a_wrapped_fused_transform_warns_once(packed_generated, make):
    pipeline = make(imagenet_train_transform(size=32))
    assert not accepts_bytes(pipeline)
    with pytest.warns(UserWarning, match="fused reduced-size decode is lost"):
        ds = open_dataset(packed_generated["lmdb"], transform=pipeline)
    image, _ = ds[0]  # still works, on decoded images
    assert image.shape == (3, 32, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_dataset(packed_generated["lmdb"], transform=make(imagenet_train_transform(size=32)))  # once only


def test_plain_fused_transform_and_plain_pipelines_do_not_warn(packed_generated):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_dataset(packed_generated["lmdb"], transform=imagenet_train_transform())
        open_dataset(packed_generated["lmdb"], transform=classic(), image="pil")
        open_dataset(packed_generated["mmap"], transform=imagenet_eval_transform())
