"""Issue 33, training items: ``workers="auto"`` weighs a Python ``sample_transform`` like a ``transform``."""

from __future__ import annotations

from readers.loader.dataloader import choose_workers
from readers.formats.registry import open_dataset


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


def test_samples_per_epoch_past_what_an_epoch_can_index_is_refused_at_construction(packed_generated):
    """Issue 33 item 12: samples_per_epoch=10**12 was accepted and the first batch raised MemoryError."""
    import pytest

    from readers import make_loader, mix
    from readers.order.sampler import MAX_EPOCH

    ds = open_dataset(packed_generated["lmdb"], decode=False)
    try:
        with pytest.raises(ValueError, match=r"samples_per_epoch is 1,000,000,000,000, more than one epoch can "
                                             r"index \(4,294,967,296"):
            make_loader(ds, batch_size=4, samples_per_epoch=10**12)
        with pytest.raises(ValueError, match="more than one epoch can index"):
            mix([(ds, 1.0)], samples_per_epoch=MAX_EPOCH + 1)
        assert mix([(ds, 1.0)], samples_per_epoch=MAX_EPOCH).spec.length == MAX_EPOCH  # the bound itself: no draw yet
    finally:
        ds.close()


def _keys(batch) -> list[bytes]:
    import hashlib

    images, labels = batch
    return [hashlib.sha1(bytes(img)).digest() + bytes([int(lab)]) for img, lab in zip(images, labels)]


def _halves(ds, weights):
    from readers import mix, subset

    return mix([(subset(ds, indices=range(0, 12)), weights[0]), (subset(ds, indices=range(12, len(ds))), weights[1])])


def test_a_mixture_resumed_with_another_seed_delivers_each_remaining_sample_once(packed_generated):
    """Issue 33 item 11: the resumed run skipped the new draw's first positions, not the samples the saved
    run had delivered (some repeated, as many left out). Weights as the sizes: each sample once an epoch."""
    from readers import make_loader

    ds = open_dataset(packed_generated["lmdb"], decode=False)
    try:
        n = len(ds)
        first = make_loader(_halves(ds, (12, n - 12)), batch_size=4, seed=1, num_workers=0, collate_fn=list)
        it = iter(first)
        seen = [k for _ in range(2) for k in _keys(zip(*next(it)))]
        state = first.state_dict()
        del it
        second = make_loader(_halves(ds, (12, n - 12)), batch_size=4, seed=2, num_workers=0, collate_fn=list)
        second.load_state_dict(state)
        rest = [k for batch in second for k in _keys(zip(*batch))]
        whole = [k for batch in make_loader(_halves(ds, (12, n - 12)), batch_size=4, seed=1, num_workers=0,
                                            collate_fn=list) for k in _keys(zip(*batch))]
    finally:
        ds.close()
    assert len(seen) == 8 and len(rest) == n - 8
    assert sorted(seen + rest) == sorted(whole) and len(set(whole)) == n


def test_a_mixture_that_draws_a_share_refuses_another_seed_in_one_line(packed_generated):
    import pytest

    from readers import make_loader

    ds = open_dataset(packed_generated["lmdb"], decode=False)
    try:
        first = make_loader(_halves(ds, (1, 1)), batch_size=4, seed=1, num_workers=0, collate_fn=list)
        it = iter(first)
        next(it)
        state = first.state_dict()
        del it
        second = make_loader(_halves(ds, (1, 1)), batch_size=4, seed=2, num_workers=0, collate_fn=list)
        with pytest.raises(ValueError, match=r"saved loader state is for seed 1 .* resume with the same seed"):
            second.load_state_dict(state)
        second.load_state_dict(dict(state, seed=2))  # the same seed: accepted
    finally:
        ds.close()
