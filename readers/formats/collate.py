"""Batches of samples with typed fields (docs/fields.md): one column per field, collated by what it holds.

``readers.loader.collation.collate`` hands a batch here when its items are field samples: a
:class:`Sample` (the tuple a reader returns for ``fields=(...)``) or a dict (``fields=None`` on
a dataset without ``label``). Per field, over the batch:

==========================================  ==================================================
values                                      batch
==========================================  ==================================================
tensors of one shape (decoded images)       one stacked tensor
tensors of different shapes                 a list of tensors
``bytes`` (``decode=False`` images, bytes)  a :class:`readers.loader.shmring.ByteBatch` (flat + offsets)
``int`` (int fields, the sample index)      an ``int64`` tensor
``float``                                   a ``float64`` tensor
arrays of one shape (fixed fields)          one stacked tensor of the field's dtype
arrays of different lengths (``[*,...]``)   a list of tensors; ``pad=True``: ``(padded, lengths)``
``str`` (text)                              a list of ``str``
anything else (json, PIL images)            a list
==========================================  ==================================================

Variable-length array fields are told by the sample (``Sample.variable``), never by their
shapes: a batch whose boxes all happen to be ``(0, 4)`` is still a list (or padded).
``pad=True`` pads variable-length arrays with ``pad_value`` to the longest in the batch:
``(tensor [B, L, ...], lengths int64 [B])``. Use ``FieldCollate(pad=True)`` as ``collate_fn``.
"""

from __future__ import annotations

from typing import Any, Container, Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

__all__ = ["Sample", "SampleDict", "FieldCollate", "collate_fields", "collate_column", "is_field_batch"]


class Sample(tuple):
    """The item of a reader opened with ``fields=(...)``: a plain tuple of the fields in that order
    (plus the index with ``return_index``), marked so that the loader collates it field by field.
    ``variable``: the positions of variable-length array fields (``float32[*,4]``), which collate
    to a list (or padded) even when a batch's arrays happen to have one shape."""

    variable: frozenset = frozenset()


class SampleDict(dict):
    """A dict sample (``fields=None`` on a dataset without ``label``); ``variable``: the keys of
    variable-length array fields (see :class:`Sample`)."""

    variable: frozenset = frozenset()


def is_field_batch(batch: Any) -> bool:
    """Whether ``batch`` is a list of field samples (a :class:`Sample` or a dict each)."""
    return isinstance(batch, (list, tuple)) and len(batch) > 0 and isinstance(batch[0], (Sample, dict))


def _stack_arrays(arrays: Sequence[np.ndarray]) -> torch.Tensor:
    # numpy stack, not torch.stack: torch's intra-op threads spin against the loader's own workers
    return torch.from_numpy(np.ascontiguousarray(np.stack(arrays)))


def _pad(arrays: Sequence[np.ndarray], pad_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = np.array([len(a) for a in arrays], dtype=np.int64)
    first = arrays[0]
    out = np.full((len(arrays), int(lengths.max(initial=0)), *first.shape[1:]), pad_value, dtype=first.dtype)
    for k, a in enumerate(arrays):
        out[k, : len(a)] = a
    return torch.from_numpy(out), torch.from_numpy(lengths)


def collate_column(values: Sequence[Any], pad: bool = False, pad_value: float = 0, variable: bool = False) -> Any:
    """One field's values over a batch, collated as the module docstring's table says
    (``variable``: a variable-length array field, never stacked)."""
    first = values[0]
    if variable and all(isinstance(v, np.ndarray) and v.ndim for v in values):
        if pad:
            return _pad(values, pad_value)
        return [torch.from_numpy(v) for v in values]
    if isinstance(first, torch.Tensor):
        if all(isinstance(v, torch.Tensor) and v.shape == first.shape for v in values):
            if first.dtype == torch.bfloat16:
                return torch.stack(list(values))
            return _stack_arrays([v.numpy() for v in values])
        return list(values)
    if isinstance(first, (bytes, bytearray, memoryview)):
        from readers.formats.batch import byte_batch, shared_tensor

        return byte_batch(values, alloc=shared_tensor if get_worker_info() is not None else None)
    if isinstance(first, (bool, int, np.integer)) and all(isinstance(v, (bool, int, np.integer)) for v in values):
        return torch.tensor([int(v) for v in values], dtype=torch.int64)
    if isinstance(first, (float, np.floating)) and all(isinstance(v, (int, float, np.number)) for v in values):
        return torch.tensor([float(v) for v in values], dtype=torch.float64)
    if isinstance(first, np.ndarray) and all(isinstance(v, np.ndarray) for v in values):
        if all(v.shape == first.shape for v in values):
            return _stack_arrays(values)
        if pad and all(v.ndim == first.ndim and v.shape[1:] == first.shape[1:] for v in values) and first.ndim:
            return _pad(values, pad_value)
        return [torch.from_numpy(v) for v in values]
    return list(values)


def collate_fields(batch: Sequence[Any], pad: bool = False, pad_value: float = 0) -> Any:
    """A batch of field samples: a tuple (for :class:`Sample` items) or a dict, one entry per field."""
    first = batch[0]
    variable: Container[Any] = getattr(first, "variable", frozenset())
    if isinstance(first, dict):
        return {k: collate_column([s[k] for s in batch], pad, pad_value, k in variable) for k in first}
    return tuple(collate_column(col, pad, pad_value, k in variable) for k, col in enumerate(zip(*batch)))


class FieldCollate:
    """A picklable ``collate_fn`` for field samples with ``pad`` set (``make_loader(collate_fn=...)``);
    a batch of anything else goes to torch's ``default_collate``."""

    def __init__(self, pad: bool = False, pad_value: float = 0) -> None:
        self.pad, self.pad_value = pad, pad_value

    def __call__(self, batch: list[Any]) -> Any:  # what a DataLoader hands its collate_fn
        if is_field_batch(batch):
            return collate_fields(batch, self.pad, self.pad_value)
        return torch.utils.data.default_collate(batch)
