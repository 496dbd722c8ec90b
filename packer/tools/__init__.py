"""The tools over packed datasets: ``verify``, ``info``, ``convert``, ``merge``, ``view`` and ``index``.

* :mod:`~packer.tools.verify` -- recompute every checksum and check what the readers would refuse,
  locally (:mod:`~packer.tools.verify_fields` for typed fields) or on an object store
  (:mod:`~packer.tools.verify_remote`); :mod:`~packer.tools.verify_report` is what both print;
* :mod:`~packer.tools.info` -- what a dataset holds, or how far an interrupted pack got;
* :mod:`~packer.tools.convert` -- a packed dataset into another format, local or on object storage
  (:mod:`~packer.tools.convert_sources`: where the datasets it and merge read are);
* :mod:`~packer.tools.merge` -- packed datasets of one format and schema joined into one (convert's
  source and prepare stage over a chain of datasets);
* :mod:`~packer.tools.view` -- a read-only web page of a dataset (served, or written with ``--html``).
* :mod:`~packer.tools.index` -- WebDataset shards indexed where they are, never written (which shards:
  :mod:`~packer.tools.index_list`; one shard read once: :mod:`~packer.tools.index_scan`; on Ray:
  :mod:`~packer.tools.index_ray`);
  :mod:`~packer.tools.verify_inplace` checks such an index's shards.

Only the CLI imports this package.
"""
