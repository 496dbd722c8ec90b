"""Pack an ImageFolder tree into WebDataset shards, LMDB, HDF5 or memory-mapped arrays.

``from packer import pack, PackOptions``; the ``pack-dataset`` command is a
thin layer over :func:`pack`. Readers live in the ``readers`` package.
"""

from packer.api import WRITERS, pack
from packer.errors import OutputError, OutputExistsError, PackError, PackerError, SourceError, UsageError
from packer.options import PackOptions
from packer.pipeline import SplitResult

__all__ = ["pack", "PackOptions", "PackerError", "UsageError", "PackError", "OutputError", "OutputExistsError",
           "SourceError", "SplitResult", "WRITERS"]
