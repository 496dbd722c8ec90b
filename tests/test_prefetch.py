"""readers/loader/prefetch.py: DevicePrefetcher on CPU (always) and CUDA (when present)."""

from __future__ import annotations

import pytest
import torch

from readers.loader.prefetch import IMAGENET_MEAN, IMAGENET_STD, DevicePrefetcher, normalize

MEAN = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
STD = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)


def batches(n=3, b=4, h=8, w=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 256, (b, 3, h, w), dtype=torch.uint8, generator=g), torch.arange(b) + 10 * i)
            for i in range(n)]


def test_cpu_exact_normalization_and_labels():
    data = batches()
    pf = DevicePrefetcher(data, "cpu")
    out = list(pf)
    assert len(out) == len(data) == len(pf)
    for (x, y), (imgs, labels) in zip(out, data):
        assert x.dtype == torch.float32 and x.device.type == "cpu"
        assert torch.equal(x, (imgs.float() / 255 - MEAN) / STD)
        assert torch.equal(y, labels)
        assert x.is_contiguous()


def test_channels_last_and_same_values():
    data = batches()
    plain = [x for x, _ in DevicePrefetcher(data, "cpu")]
    cl = [x for x, _ in DevicePrefetcher(data, "cpu", channels_last=True)]
    for a, b in zip(plain, cl):
        assert b.is_contiguous(memory_format=torch.channels_last) and not b.is_contiguous()
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes(dtype):
    data = batches(1)
    (x, _), = list(DevicePrefetcher(data, "cpu", dtype=dtype))
    assert x.dtype == dtype
    work = torch.float64 if dtype == torch.float64 else torch.float32
    ref = ((data[0][0].to(work) / 255 - MEAN.to(work)) / STD.to(work)).to(dtype)
    assert torch.equal(x, ref)


def test_custom_mean_std_and_extra_items_pass_through():
    imgs = torch.full((2, 3, 4, 4), 255, dtype=torch.uint8)
    batch = (imgs, torch.tensor([1, 2]), ["a", "b"], {"k": 1})
    (x, y, names, meta), = list(DevicePrefetcher([batch], "cpu", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)))
    assert torch.equal(x, torch.ones(2, 3, 4, 4))
    assert torch.equal(y, torch.tensor([1, 2])) and names == ["a", "b"] and meta == {"k": 1}


def test_copy_times_recorded_and_stats():
    pf = DevicePrefetcher(batches(5), "cpu")
    assert pf.stats()["batches"] == 0
    for _ in pf:
        pass
    assert len(pf.copy_times) == 5 and all(t >= 0 for t in pf.copy_times)
    s = pf.stats()
    assert s["batches"] == 5 and s["copy_s_total"] == pytest.approx(sum(pf.copy_times))
    assert s["copy_s_max"] >= s["copy_s_median"] >= 0
    for _ in pf:  # a second epoch keeps counting
        pass
    assert len(pf.copy_times) == 10
    pf.reset_stats()
    assert pf.copy_times == []


def test_len_only_when_loader_has_one():
    def gen():
        yield from batches(2)

    pf = DevicePrefetcher(gen(), "cpu")
    with pytest.raises(TypeError, match="no len"):
        len(pf)
    assert len(list(pf)) == 2


def test_with_a_real_dataloader():
    imgs = torch.randint(0, 256, (10, 3, 6, 6), dtype=torch.uint8)
    labels = torch.arange(10)
    dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(imgs, labels), batch_size=4)
    pf = DevicePrefetcher(dl, "cpu", channels_last=True)
    assert len(pf) == 3
    xs, ys = zip(*pf)
    assert torch.equal(torch.cat(ys), labels)
    assert torch.equal(torch.cat(xs), (imgs.float() / 255 - MEAN) / STD)


def test_rejects_bad_batches_and_options():
    with pytest.raises(TypeError, match="uint8"):
        list(DevicePrefetcher([(torch.zeros(2, 3, 4, 4), torch.zeros(2))], "cpu"))
    with pytest.raises(TypeError, match=r"\[B, 3, H, W\]"):
        list(DevicePrefetcher([(torch.zeros(3, 4, 4, dtype=torch.uint8), torch.zeros(1))], "cpu"))
    with pytest.raises(TypeError, match="batches"):
        list(DevicePrefetcher([torch.zeros(2, 3, 4, 4, dtype=torch.uint8)], "cpu"))
    with pytest.raises(ValueError, match="3 values"):
        DevicePrefetcher([], "cpu", mean=(0.5, 0.5))
    with pytest.raises(ValueError, match="zeros"):
        DevicePrefetcher([], "cpu", std=(0.0, 1.0, 1.0))
    with pytest.raises(ValueError, match="floating"):
        DevicePrefetcher([], "cpu", dtype=torch.int32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="only meaningful without CUDA")
def test_cuda_requested_without_cuda_is_an_error():
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        DevicePrefetcher([], "cuda")
    assert DevicePrefetcher([]).device.type == "cpu"


def test_normalize_function():
    x = torch.randint(0, 256, (2, 3, 5, 5), dtype=torch.uint8)
    assert torch.equal(normalize(x, MEAN, STD), (x.float() / 255 - MEAN) / STD)


# --------------------------------------------------------------------------- CUDA (skipped here)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pin", [True, False])
def test_cuda_matches_cpu(pin):
    data = batches(6, b=8, h=32, w=32)
    if pin:
        data = [(x.pin_memory(), y.pin_memory()) for x, y in data]
    pf = DevicePrefetcher(data, "cuda", channels_last=True)
    cpu = list(DevicePrefetcher(data, "cpu", channels_last=True))
    n = 0
    for (x, y), (xc, yc) in zip(pf, cpu):
        assert x.device.type == "cuda" and x.is_contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(x.cpu(), xc, rtol=0, atol=1e-6)
        assert torch.equal(y.cpu(), yc)
        n += 1
    assert n == 6
    s = pf.stats()
    assert s["batches"] == 6 and s["copy_s_total"] > 0
