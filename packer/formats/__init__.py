"""The writers of the four formats (WebDataset shards, LMDB, HDF5, memory-mapped arrays) and what they
share: :mod:`~packer.formats.base` (what a writer implements; ``packer.pipeline`` drives it) and
:mod:`~packer.formats.fieldstore` (the typed fields every format writes the same way).

Imports the prepare stage's results, the options and the output folder's policy, and the
contract's layouts; never a reader.
"""
