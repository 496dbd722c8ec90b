"""Pack a dataset into WebDataset shards, LMDB, HDF5 or memory-mapped ``uint8`` arrays.

Sources: an image folder (``root/<class>/<image>``, optionally under split
folders ``train/``, ``val/``, ...; local or under an ``s3://`` prefix), a
CSV / JSONL / Parquet manifest (one row per sample: an image column and typed
fields such as captions, boxes, tags or scores), COCO ``instances_*.json``
annotations (boxes, category ids, areas, segmentation), WebDataset ``.tar``
shards written by other tools, and a Hugging Face ``datasets`` dataset (saved
to disk or as Parquet). Each sample's fields are stored with their types
(``docs/fields.md``); every image is validated once on the way in.

``from packer import pack, PackOptions`` (and ``RemoteOptions`` for object
storage); the ``pack-dataset`` command is a thin layer over :func:`pack`
(``pack-dataset convert``, ``verify`` and ``info`` over their modules).
Readers live in the ``readers`` package.
"""

from packer.api import WRITERS, pack
from packer.errors import OutputError, OutputExistsError, PackError, PackerError, SourceError, UsageError
from packer.options import PackOptions, RemoteOptions
from packer.pipeline import SplitResult
from packer.writer import SampleError, Writer
from packer.mapping import MapError, MapResult, pack_map
from packer.appending import roll_back

__all__ = ["pack", "PackOptions", "RemoteOptions", "PackerError", "UsageError", "PackError", "OutputError",
           "OutputExistsError", "SourceError", "SplitResult", "WRITERS"]
__all__ += ["Writer", "SampleError"]  # packer.writer: write a dataset from Python, sample by sample
__all__ += ["pack_map", "MapResult", "MapError"]  # packer.mapping: map a function over inputs into a dataset
__all__ += ["roll_back"]  # packer.appending: undo an interrupted append (Writer(append=True), --append)
