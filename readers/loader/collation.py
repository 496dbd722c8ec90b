"""How a batch of items becomes the batch the training loop receives: ``collate`` and ``Collate``.

``collate`` stacks equal-shape images, packs encoded bytes flat (a :class:`ByteBatch`), gathers a
whole-batch read (:class:`readers.formats.batch.GatheredItems`) and hands typed-field samples to
:mod:`readers.formats.collate`. ``Collate`` (what ``make_loader`` gives worker processes) does the
same into reusable shared-memory slots (:mod:`readers.loader.shmring`), so a batch crosses to the
main process as a reference to its slot, never as pickled ``bytes``.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from readers.formats.batch import GatheredItems, batch_buffer, byte_batch, shared_tensor
from readers.formats.collate import collate_fields, is_field_batch
from readers.loader import shmring
from readers.loader.shmring import ByteBatch

__all__ = ["collate", "Collate"]


def _collate_bytes(items: Sequence[Any]) -> ByteBatch:
    """Pack encoded samples into one uint8 tensor, written straight into shared memory
    when running in a loader worker (so sending it to the main process copies nothing)."""
    return byte_batch(items, alloc=shared_tensor if get_worker_info() is not None else None)


def _collate_images(images: Sequence[Any]) -> Any:
    # numpy stack, not torch.stack: torch's intra-op threads spin against the
    # loader's own workers on a busy machine (measured here: 0.3 ms vs up to
    # 100 ms for a 6 MB batch).
    first = images[0]
    if isinstance(first, (bytes, bytearray, memoryview)):
        return _collate_bytes(images)
    if type(first).__module__.startswith("PIL."):
        return list(images)  # image="pil" without a transform that makes tensors
    if isinstance(first, torch.Tensor):
        same = all(t.shape == first.shape for t in images)
        if same and first.dtype != torch.bfloat16:
            return torch.from_numpy(np.stack([t.numpy() for t in images]))
        if same:
            return torch.stack(list(images))
        return list(images)  # images of different sizes and no resizing transform
    return torch.utils.data.default_collate(list(images))


def collate(batch: Sequence[tuple]) -> tuple:
    """Collate (image, label[, index]) items: stack equal-shape images, pack bytes flat."""
    if isinstance(batch, GatheredItems):  # a whole-batch read (readers.formats.batch)
        return batch.gather()
    if is_field_batch(batch):  # samples with typed fields (readers.formats.collate, docs/fields.md)
        return collate_fields(batch)
    columns = list(zip(*batch))
    out = [_collate_images(columns[0])]
    out += [torch.as_tensor(c, dtype=torch.int64) for c in columns[1:]]
    return tuple(out)


class Collate:
    """``collate`` plus reusable shared-memory slots for whole batches (see readers.loader.shmring).

    In a loader worker, a batch goes into one of the worker's reusable slots
    and the main process rebuilds it as views of that slot: a whole-batch read
    (``GatheredItems``: ByteBatches of ``decode=False`` readers, mmap's pixel
    tensors) is written there directly by ``get_batch``, a batch of ``bytes``
    items is copied there, decoded images of one shape are stacked there.
    Everything else (PIL images, images of different shapes, a batch for which
    no slot freed up within ``wait_s``, and the main process itself) goes
    through ``collate``.
    """

    def __init__(self, slots: int = 4, wait_s: float = 0.05) -> None:
        self.ring = shmring.ShmSlots(slots, wait_s) if shmring.available() else None

    def __call__(self, batch: Sequence[tuple]) -> Any:
        if self.ring is None or not batch or get_worker_info() is None:
            return collate(batch)  # the main process: nothing to send
        if isinstance(batch, GatheredItems):
            return self._gathered(self.ring, batch)
        if is_field_batch(batch):
            return collate(batch)  # samples with typed fields: readers.formats.collate
        first = batch[0][0]
        if isinstance(first, (bytes, bytearray)):
            images, *rest = zip(*batch)
            packed = self.ring.pack(images, tuple(torch.as_tensor(c, dtype=torch.int64) for c in rest))
            if packed is not None:
                return packed
        elif isinstance(first, torch.Tensor) and first.dtype != torch.bfloat16 and first.device.type == "cpu":
            stacked = self._stacked(self.ring, batch)
            if stacked is not None:
                return stacked
        return collate(batch)  # other items, or no free slot in time

    @staticmethod
    def _stacked(ring: shmring.ShmSlots, batch: Sequence[tuple]) -> Any:
        """Decoded images of one shape and dtype stacked straight into a free slot of ``ring`` (one copy each)."""
        images, *rest = zip(*batch)
        first = images[0]
        if not all(isinstance(t, torch.Tensor) and t.shape == first.shape and t.dtype == first.dtype for t in images):
            return None
        slot = ring.slot(len(images) * first.numel() * first.element_size())
        if slot is None:
            return None
        out = slot.array.view(first.numpy().dtype).reshape(len(images), *first.shape)
        np.stack([t.numpy() for t in images], out=out)
        sent = ring.send(slot, (torch.from_numpy(out), *(torch.as_tensor(c, dtype=torch.int64) for c in rest)))
        return sent

    @staticmethod
    def _gathered(ring: shmring.ShmSlots, items: GatheredItems) -> Any:
        """The whole-batch read written straight into a free slot of ``ring`` (sent as a reference to it)."""
        got: list[shmring.Slot | None] = []

        def alloc(nbytes: int) -> Any:  # the batch's one buffer: the slot (a second one: not in the slot)
            slot = ring.slot(nbytes) if not got else None
            got.append(slot)
            return slot.array if slot is not None else batch_buffer(nbytes)

        result = items.gather(alloc)
        slot = got[0] if got else None
        if slot is None:  # no free slot in time (the caller keeps its batches): the ordinary way
            return result
        sent = ring.send(slot, result)
        if sent is not None:
            return sent
        # a batch of another shape than send knows: read it again outside the slot (which stays free)
        return GatheredItems(items.dataset, items.indices.tolist()).gather()
