"""Datasets packed by the previous release (0.1.0, before typed fields) keep reading unchanged.

``tests/fixtures/release-0.x/<format>/`` holds 6 of the bundled photos (2 classes, JPEG and
PNG) packed by that release's code; ``expected.json`` beside them records, per sample, the
label, the name, the CRC-32 and length of the stored bytes and the decoded shape. How they
were made: ``tests/fixtures/release-0.x/README.md``. Never re-pack them with newer code.
"""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from readers.formats.registry import open_dataset
from readers.contract.spec import FORMATS
from reference import pil_rgb, stored_samples

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "release-0.x"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())["formats"]


@pytest.fixture
def old(tmp_path, request) -> Path:
    """A private copy of the fixture (nothing a test does may change the committed files)."""
    return Path(shutil.copytree(FIXTURES / request.param, tmp_path / request.param))


def _items(ds) -> list[tuple]:
    items = list(ds) if isinstance(ds, torch.utils.data.IterableDataset) else [ds[i] for i in range(len(ds))]
    return sorted(items, key=lambda t: t[-1])


def _bytes(data) -> bytes:
    return data if isinstance(data, bytes) else data.numpy().tobytes()


@pytest.mark.parametrize("old", FORMATS, indirect=True)
def test_old_release_reads_every_sample_unchanged(old):
    fmt = old.name
    want = EXPECTED[fmt]
    raw = open_dataset(old, decode=False, return_index=True)
    dec = open_dataset(old, return_index=True)
    try:
        assert raw.classes == want["classes"] and len(raw.index.labels) == want["num_samples"]
        assert list(raw.index.names()) == [s["name"] for s in want["samples"]]
        oracle = stored_samples(old)  # read with tarfile / lmdb / h5py / numpy, never through readers
        got_raw, got_dec = _items(raw), _items(dec)
        assert [t[-1] for t in got_raw] == [t[-1] for t in got_dec] == list(range(want["num_samples"]))
        for s, (data, label, i), (image, label2, _) in zip(want["samples"], got_raw, got_dec):
            data = _bytes(data)
            assert (label, label2) == (s["label"], s["label"]), f"{fmt} sample {i}"
            assert (zlib.crc32(data), len(data)) == (s["stored_crc32"], s["stored_bytes"]), f"{fmt} sample {i}"
            assert zlib.crc32(oracle[i]) == s["stored_crc32"], f"{fmt} sample {i}: the oracle reads other bytes"
            assert list(image.shape) == s["shape_chw"] and image.dtype == torch.uint8
            hwc = image.permute(1, 2, 0).numpy()
            if fmt == "mmap":  # stored pixels: the decoded image is exactly the stored bytes
                assert hwc.tobytes() == data
            else:
                assert np.array_equal(hwc, pil_rgb(data)), f"{fmt} sample {i}: decoded pixels differ"
    finally:
        raw.close()
        dec.close()


@pytest.mark.parametrize("old", FORMATS, indirect=True)
def test_old_release_verify_and_info(old, capsys):
    from packer.cli import main

    assert main(["verify", str(old), "-q"]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["info", str(old)]) == 0
    out = capsys.readouterr().out
    assert "animals" in out and "textures" in out and "6" in out, out
