"""What a pack reads from: the :class:`~packer.sources.source.Source` (the stable list of a split's
files, with labels) and the columns that hold it without a Python object per file.

:mod:`~packer.sources.source` also finds the images of an ImageFolder tree; the other sources
(manifests, COCO, shards, Hugging Face datasets) are in :mod:`packer.importers` and give a
``Source`` too. Imports only :mod:`packer.errors` and :mod:`readers.contract`.
"""
