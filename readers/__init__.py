"""PyTorch readers for datasets written by ``pack-dataset``.

``from readers import open_dataset, make_loader`` is all a training loop
needs. Names are imported lazily so that tools which only need the on-disk
contract (``readers.contract.spec``) do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "ShardDataset",
    "LMDBDataset",
    "HDF5Dataset",
    "MemmapDataset",
    "open_dataset",
    "make_loader",
    "mix",
    "Mixture",
    "subset",
    "Subset",
]

_LAZY = {
    "ShardDataset": "readers.formats.wds",
    "LMDBDataset": "readers.formats.lmdb",
    "HDF5Dataset": "readers.formats.hdf5",
    "MemmapDataset": "readers.formats.mmap",
    "open_dataset": "readers.formats.registry",
    "make_loader": "readers.loader.dataloader",
    "mix": "readers.order.mixture",
    "Mixture": "readers.order.mixture",
    "subset": "readers.order.subsets",
    "Subset": "readers.order.subsets",
}


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'readers' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
