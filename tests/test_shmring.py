"""Reusable shared-memory slots for decode=False batches (readers.loader.shmring)."""

from __future__ import annotations

import gc
import os
import pickle

import numpy as np
import pytest
import torch

import readers.loader.dataloader
from readers import make_loader, open_dataset
from readers.loader import shmring
from readers.loader.dataloader import Collate
from readers.loader.shmring import ByteBatch

pytestmark = pytest.mark.skipif(not shmring.available(), reason="no writable /dev/shm")


def _ours() -> set[str]:
    """Segments of this process, of its children and of processes that have exited (its loader workers):
    not those of another live process (another pytest-xdist worker's loaders)."""
    import psutil

    mine = {os.getpid(), *(c.pid for c in psutil.Process().children(recursive=True))}
    return {n for n in os.listdir("/dev/shm") if n.startswith("dataset-packer-")
            and (shmring.pid_of(n) in mine or not psutil.pid_exists(shmring.pid_of(n)))}


@pytest.mark.slow  # DataLoader worker processes
@pytest.mark.parametrize("fmt", ["wds", "lmdb"])
@pytest.mark.parametrize("slots", [1, 3])
def test_batches_through_slots_equal_the_stored_bytes(packed_generated, fmt, slots):
    before = _ours()
    ds = open_dataset(packed_generated[fmt], decode=False, return_index=True)
    loader = make_loader(ds, batch_size=4, num_workers=2, collate_fn=Collate(slots=slots))
    for _epoch in range(3):  # slots are reused many times over
        seen = []
        for batch, _labels, index in loader:
            assert isinstance(batch, ByteBatch)
            for k, i in enumerate(index.tolist()):
                assert batch.get(k) == ds.read(i)
            seen += index.tolist()
        assert sorted(seen) == list(range(len(ds.labels)))
    del loader
    gc.collect()
    assert _ours() == before, "shared-memory segments left in /dev/shm"


@pytest.fixture
def unmap_own_segments():
    """Unpickling here attaches this process's own segments, as a main process attaches a
    worker's; unmap them afterwards (a worker's are unmapped when it exits)."""
    yield
    gc.collect()  # batches still over them
    for name in [n for n in shmring.ATTACHED if shmring.pid_of(n) == os.getpid()]:
        shmring.ATTACHED.pop(name).close()


def test_a_slot_is_freed_once_the_batch_over_it_is_gone(unmap_own_segments):
    ring = shmring.ShmSlots(slots=1, wait_s=0.05)
    items = [b"abc", b"", b"\x00" * 1000]
    sent = ring.pack(items, (torch.tensor([1, 2, 3]),))
    assert sent is not None
    assert ring.pack([b"x"], ()) is None  # the only slot is still in flight: no free slot in time
    batch, labels = pickle.loads(pickle.dumps(sent))  # what the main process does
    assert [batch.get(k) for k in range(len(batch))] == items and labels.tolist() == [1, 2, 3]
    assert ring.pack([b"x"], ()) is None  # the batch is a view of the slot: still in use
    view = batch.data[3:]
    del batch, sent
    assert ring.pack([b"x"], ()) is None  # a view of the batch keeps the slot too
    del view
    again = ring.pack([b"xyz"], ())  # free: nothing refers to the slot any more
    (batch2,) = pickle.loads(pickle.dumps(again))
    assert batch2.get(0) == b"xyz"


def test_a_batch_bigger_than_a_slot_gets_a_bigger_segment(unmap_own_segments):
    ring = shmring.ShmSlots(slots=2)
    small = ring.pack([b"a" * 10], ())
    pickle.loads(pickle.dumps(small))
    big_item = np.random.default_rng(0).bytes(9 << 20)  # past the 8 MiB minimum slot
    big = ring.pack([big_item, b"tail"], ())
    assert big.args[0] != small.args[0]
    (batch,) = pickle.loads(pickle.dumps(big))
    assert batch.get(0) == big_item and batch.get(1) == b"tail"


def _allocated(ring: shmring.ShmSlots) -> int:
    """Bytes of memory the ring's segment holds (its memfd's allocated blocks)."""
    return os.fstat(ring._local.get().fd).st_blocks * 512


@pytest.mark.parametrize("item_mb, gives_back", [(20, True), (4, False)])
def test_free_slots_of_big_batches_give_their_pages_back(unmap_own_segments, item_mb, gives_back):
    """Three batches in flight at once, then two of them done with: taking a slot for the next batch
    gives back the pages of the other free one when slots are RELEASE_BYTES or more (a worker's
    memory follows its batches in flight) and keeps them when slots are small (reused as they are);
    the batch still in flight keeps its bytes either way."""
    ring = shmring.ShmSlots(slots=4, wait_s=0.05)
    rng = np.random.default_rng(item_mb)
    items = [rng.bytes(item_mb << 20) for _ in range(4)]
    batches = [pickle.loads(pickle.dumps(ring.pack([item], ()))) for item in items[:3]]  # slots 0, 1, 2
    if ring._local.get().fd < 0:
        pytest.skip("no memfd here: the segment is a /dev/shm file")
    capacity = ring._local.get().capacity
    assert (capacity >= shmring.RELEASE_BYTES) == gives_back
    held = _allocated(ring)
    assert held >= 3 * (item_mb << 20)
    del batches[0:2]  # slots 0 and 1 done with; slot 2 still in flight
    gc.collect()
    (fourth,) = pickle.loads(pickle.dumps(ring.pack([items[3]], ())))  # takes slot 0
    assert fourth.get(0) == items[3] and batches[0][0].get(0) == items[2]
    freed = held - _allocated(ring)
    if gives_back:
        assert freed >= (item_mb << 20) - (1 << 20), f"{freed} bytes given back"  # slot 1's pages
        (fifth,) = pickle.loads(pickle.dumps(ring.pack([items[0]], ())))  # slot 1 again: pages come back
        assert fifth.get(0) == items[0]
    else:
        assert freed == 0


def test_byte_batch_lives_beside_the_slots(unmap_own_segments):
    assert readers.loader.dataloader.ByteBatch is ByteBatch  # the loader re-exports it
    ring = shmring.ShmSlots(slots=1)  # alive while its batch is received, as a worker's ring is
    (batch,) = pickle.loads(pickle.dumps(ring.pack([b"ab", b"c"], ())))
    assert isinstance(batch, ByteBatch) and len(batch) == 2 and batch.get(0) == b"ab" and batch.get(1) == b"c"


@pytest.mark.slow
def test_forked_or_pickled_slots_make_their_own_segment(unmap_own_segments):
    ring = shmring.ShmSlots(slots=2)
    mine = ring.pack([b"parent"], ())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            sent = ring.pack([b"child"], ())
            os.write(w, pickle.dumps(sent.args[0]))
            os.close(w)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        child_name = pickle.loads(f.read())
    os.waitpid(pid, 0)
    if os.path.exists(os.path.join("/dev/shm", child_name)):  # only without memfd_create
        os.unlink(os.path.join("/dev/shm", child_name))  # os._exit skipped the child's own clean-up
    assert child_name != mine.args[0] and shmring.pid_of(child_name) == pid
    copy = pickle.loads(pickle.dumps(ring))  # travels without the segment
    assert copy.slots == 2 and copy._local.peek() is None
    (batch,) = pickle.loads(pickle.dumps(mine))  # the parent's segment still works after the child
    assert batch.get(0) == b"parent"
    assert ring.pack([b"again"], ()).args[0] == mine.args[0]


def test_slots_must_fit_the_header():
    with pytest.raises(ValueError, match="slots"):
        shmring.ShmSlots(slots=0)


@pytest.mark.slow  # DataLoader worker processes
def test_finished_loaders_leave_no_mappings(packed_generated):
    """The main process unmaps the slots of workers that have exited."""
    ds = open_dataset(packed_generated["lmdb"], decode=False)
    for _round in range(3):
        loader = make_loader(ds, batch_size=4, num_workers=2, workers="processes")
        for _batch in loader:
            pass
        pids = {w.pid for w in loader._iterator._workers}
        del loader, _batch
        gc.collect()
    shmring.release_dead()
    # (segments of this process itself are not a worker's)
    worker_segments = {n for n in shmring.ATTACHED if shmring.pid_of(n) != os.getpid()}
    assert not worker_segments, f"mappings of exited workers kept: {worker_segments} (last workers {pids})"
