"""How a batch of items becomes the batch the training loop receives: ``collate`` and ``Collate``.

``collate`` stacks equal-shape images, packs encoded bytes flat (a :class:`ByteBatch`), gathers a
whole-batch read (:class:`readers.formats.batch.GatheredItems`; a batch of samples yielded unread,
:class:`readers.formats.batch.Pending`, becomes one) and hands typed-field samples to
:mod:`readers.formats.collate`. ``Collate`` (what ``make_loader`` gives worker processes) does the
same into reusable shared-memory slots (:mod:`readers.loader.shmring`), so a batch crosses to the
main process as a reference to its slot, never as pickled ``bytes``.

``BatchTransform`` (``make_loader(..., batch_transform=f)``) runs a caller's ``f`` on the collated
image batch where the batch is made: in the worker process (``Collate``), in the loader thread
(``readers.loader.threads``) or in the main process with ``num_workers=0``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from readers.formats.batch import GatheredItems, batch_buffer, byte_batch, gathered, shared_tensor
from readers.formats.collate import collate_fields, is_field_batch
from readers.loader import shmring
from readers.loader.shmring import ByteBatch

__all__ = ["collate", "Collate", "BatchTransform"]


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
    batch = gathered(batch)  # samples yielded unread (readers.formats.batch.Pending): one whole-batch read
    if isinstance(batch, GatheredItems):  # a whole-batch read (readers.formats.batch)
        return batch.gather()
    if is_field_batch(batch):  # samples with typed fields (readers.formats.collate, docs/fields.md)
        return collate_fields(batch)
    columns = list(zip(*batch))
    out = [_collate_images(columns[0])]
    out += [torch.as_tensor(c, dtype=torch.int64) for c in columns[1:]]
    return tuple(out)


def _what(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return f"a {type(value).__name__}" + (f" of shape {tuple(shape)}" if shape is not None else "")


class BatchTransform:
    """``f`` applied to a collated batch's images: ``(images, labels[, index])`` becomes
    ``(f(images), labels[, index])``; a dict batch (typed fields) gets ``f`` on its ``"image"``.

    ``images`` is what the loader would deliver: one ``uint8`` tensor ``[B, C, H, W]`` for
    stored pixels and decoded images of one size, a :class:`ByteBatch` for ``decode=False``.
    ``f`` must return a batch of as many images (a tensor, or a sequence, with ``B`` first);
    anything else is refused in one line naming ``f``. Picklable when ``f`` is (a function or
    class defined at module level), so it reaches spawn and fork worker processes alike.
    """

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        if not callable(fn):
            raise TypeError(f"batch_transform must be callable, got {_what(fn)}")
        self.fn = fn

    @property
    def name(self) -> str:
        return getattr(self.fn, "__qualname__", None) or type(self.fn).__name__

    def images(self, images: Any) -> Any:
        """``f(images)``, checked to be a batch of ``len(images)`` images."""
        out = self.fn(images)
        n = len(images)
        if isinstance(out, (torch.Tensor, np.ndarray)) and out.ndim >= 1 and len(out) == n:
            return out
        if isinstance(out, (ByteBatch, list, tuple)) and len(out) == n:
            return out
        want = f"a tensor whose first dimension is the batch's {n} images"
        raise TypeError(f"batch_transform {self.name} returned {_what(out)}, not a batch: it must return {want}")

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, dict) and "image" in batch:
            return {**batch, "image": self.images(batch["image"])}
        if isinstance(batch, tuple) and batch:
            return (self.images(batch[0]), *batch[1:])
        raise TypeError(f"batch_transform {self.name}: the loader made {_what(batch)}, which has no images "
                        "to transform (batch_transform needs (images, labels...) batches or an 'image' field)")


def then(transform: BatchTransform | None, batch: Any) -> Any:
    """``batch`` through ``transform`` when there is one."""
    return batch if transform is None else transform(batch)


def _outside(slot: shmring.Slot, batch: Any) -> bool:
    """Whether no tensor of ``batch`` lies in ``slot`` (so the slot may be reused while it travels)."""
    parts = batch.values() if isinstance(batch, dict) else batch
    for part in parts:
        if isinstance(part, (list, tuple)) and not _outside(slot, part):
            return False
        data = part.data if isinstance(part, ByteBatch) else part
        if isinstance(data, torch.Tensor) and data.numel() and data.device.type == "cpu":
            if slot.address <= data.data_ptr() < slot.address + slot.nbytes:
                return False
    return True


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

    ``batch_transform`` (a :class:`BatchTransform`) runs on each batch here, in the worker, before
    it is sent: a result that is a view of the slot (a crop, a flip by stride) still travels as
    a reference to the slot; a new tensor (normalised floats) travels the ordinary way.
    """

    def __init__(self, slots: int = 4, wait_s: float = 0.05, batch_transform: BatchTransform | None = None) -> None:
        self.ring = shmring.ShmSlots(slots, wait_s) if shmring.available() else None
        self.batch_transform = batch_transform

    def __call__(self, batch: Sequence[tuple]) -> Any:
        bt = self.batch_transform
        batch = gathered(batch)  # samples yielded unread (readers.formats.batch.Pending): one whole-batch read
        if self.ring is None or not batch or get_worker_info() is None:
            return then(bt, collate(batch))  # the main process: nothing to send
        if isinstance(batch, GatheredItems):
            return self._gathered(self.ring, batch, bt)
        if is_field_batch(batch):
            return then(bt, collate(batch))  # samples with typed fields: readers.formats.collate
        first = batch[0][0]
        if isinstance(first, (bytes, bytearray)) and bt is None:
            images, *rest = zip(*batch)
            packed = self.ring.pack(images, tuple(torch.as_tensor(c, dtype=torch.int64) for c in rest))
            if packed is not None:
                return packed
        elif isinstance(first, torch.Tensor) and first.dtype != torch.bfloat16 and first.device.type == "cpu":
            stacked = self._stacked(self.ring, batch, bt)
            if stacked is not None:
                return stacked
        return then(bt, collate(batch))  # other items, or no free slot in time

    @staticmethod
    def _stacked(ring: shmring.ShmSlots, batch: Sequence[tuple], bt: BatchTransform | None = None) -> Any:
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
        made = then(bt, (torch.from_numpy(out), *(torch.as_tensor(c, dtype=torch.int64) for c in rest)))
        sent = ring.send(slot, made)
        if sent is None and bt is not None and _outside(slot, made):
            return made  # the transform's new tensors: sent the ordinary way (the slot stays free)
        return sent  # None (slot left free): collated again outside it

    @staticmethod
    def _gathered(ring: shmring.ShmSlots, items: GatheredItems, bt: BatchTransform | None = None) -> Any:
        """The whole-batch read written straight into a free slot of ``ring`` (sent as a reference to it)."""
        got: list[shmring.Slot | None] = []

        def alloc(nbytes: int) -> Any:  # the batch's one buffer: the slot (a second one: not in the slot)
            slot = ring.slot(nbytes) if not got else None
            got.append(slot)
            return slot.array if slot is not None else batch_buffer(nbytes)

        result = then(bt, items.gather(alloc))
        slot = got[0] if got else None
        if slot is None:  # no free slot in time (the caller keeps its batches): the ordinary way
            return result
        sent = ring.send(slot, result)
        if sent is not None:
            return sent
        if bt is not None and _outside(slot, result):
            return result  # the transform's new tensors: sent the ordinary way (the slot stays free)
        # a batch of another shape than send knows: read it again outside the slot (which stays free)
        return then(bt, items.again().gather())
