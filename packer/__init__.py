"""Pack an ImageFolder tree into WebDataset shards, LMDB, HDF5 or memory-mapped arrays.

``from packer import pack, PackOptions``; the ``pack-dataset`` command is a
thin layer over :func:`pack`. Readers live in the ``readers`` package.
"""

from packer.api import WRITERS, pack
from packer.options import PackOptions
from packer.pipeline import OutputError, OutputExistsError, PackError, SplitResult
from packer.source import SourceError

__all__ = ["pack", "PackOptions", "PackError", "OutputError", "OutputExistsError", "SourceError", "SplitResult", "WRITERS"]
