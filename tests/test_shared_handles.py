"""A reader and its copies (``with_order``, ``with_batch_reads``, ``with_samples``: ``make_loader`` makes
two) share one set of handles: dropping a copy leaves them open for the others; the last one dropped
closes them; ``close()`` closes them when asked.

Before, each copy's finalizer closed the shared handles: ``make_loader``'s intermediate copy, dropped
at once, closed the store of a remote dataset while the loader's copy was streaming from it (its
requests then opened a second client behind the caller's back)."""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest

from readers import make_loader, open_dataset


@pytest.fixture
def closes(monkeypatch):
    """The readers whose ``close()`` ran (by ``id``): every format's ``close`` ends in the base class's."""
    from readers.formats.base import PackedDataset

    seen: list[int] = []
    original = PackedDataset.close

    def counted(self):
        seen.append(id(self))
        original(self)

    monkeypatch.setattr(PackedDataset, "close", counted)
    return seen


def test_copies_share_the_handles_until_the_last_goes(packed_generated, closes):
    ds = open_dataset(packed_generated["wds"], decode=False)
    kept = ds.with_samples(np.arange(4))
    ordered = ds.with_order(seed=3)
    loader = make_loader(ds, batch_size=4, num_workers=0)  # its copy of a copy (with_order, with_batch_reads)
    assert loader.dataset is not ds
    del ordered
    gc.collect()
    assert closes == [], "a dropped copy closed the handles the others share"
    assert sum(len(labels) for _images, labels in loader) == len(ds)  # the loader's copy reads through them
    assert len(list(kept)) == 4
    del loader, kept
    gc.collect()
    assert closes == [], "the original is still here"
    del ds
    gc.collect()
    assert len(closes) == 1, "the last one dropped closes the shared handles, once"


def test_close_closes_at_once_and_a_copy_in_another_process_holds_its_own(packed_generated, closes):
    ds = open_dataset(packed_generated["wds"], decode=False)
    copy_ = ds.with_order(seed=1)
    copy_.close()
    assert closes == [id(copy_)], "close() is not deferred to the last copy"
    closes.clear()
    shipped = pickle.loads(pickle.dumps(ds))  # as a spawned worker receives it: a holder of its own
    shipped_id = id(shipped)
    del shipped
    gc.collect()
    assert closes == [shipped_id]
    closes.clear()
    del copy_
    gc.collect()
    assert closes == []
    del ds
    gc.collect()
    assert len(closes) == 1
