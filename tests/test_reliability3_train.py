"""Issue 33, training items: ``workers="auto"`` weighs a Python ``sample_transform`` like a ``transform``."""

from __future__ import annotations

from readers.loader import choose_workers
from readers.registry import open_dataset


def _by_name(sample: dict) -> dict:
    return sample


def test_auto_workers_weigh_a_python_sample_transform_like_a_transform(packed_generated):
    """Issue 33 item 12: a reader with a sample_transform of the caller's own (Python per sample,
    holding the GIL) got threads from workers="auto" because it stores bytes (decode=False)."""
    ds = open_dataset(packed_generated["lmdb"], decode=False, sample_transform=_by_name)
    try:
        kind, why = choose_workers(ds, num_workers=2)
    finally:
        ds.close()
    assert (kind, why) == ("processes", "a Python sample_transform of your own (_by_name)")
