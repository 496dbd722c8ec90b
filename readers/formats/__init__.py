"""The readers of the four formats, what they share, and ``open_dataset``.

* :mod:`~readers.formats.registry` -- ``open_dataset(path)``: the index's format to its reader;
  :mod:`~readers.formats.resolve` -- a folder, URL, store or index to its Index (a URL's store is
  imported only for a URL: a local path never loads :mod:`readers.remote`);
* :mod:`~readers.formats.base` -- what every reader shares (index, per-process handles, decode);
  :mod:`~readers.formats.batch`, :mod:`~readers.formats.collate`,
  :mod:`~readers.formats.shardbatch` -- whole-batch reads and collation;
* :mod:`~readers.formats.wds`, :mod:`~readers.formats.lmdb`, :mod:`~readers.formats.hdf5`,
  :mod:`~readers.formats.mmap` -- one reader each, with the torch-free checks ``packer`` also runs
  (:mod:`~readers.formats.h5layout`, :mod:`~readers.formats.lmdbcheck`,
  :mod:`~readers.formats.wds_io`); :mod:`~readers.formats.inplace` -- shards a wds index reads where
  they are (``pack-dataset index``).

Imports the contract, the decode stack, the order and the remote stores.
"""
