"""The tools over packed datasets: ``verify``, ``info`` and ``convert``.

* :mod:`~packer.tools.verify` -- recompute every checksum and check what the readers would refuse,
  locally (:mod:`~packer.tools.verify_fields` for typed fields) or on an object store
  (:mod:`~packer.tools.verify_remote`); :mod:`~packer.tools.verify_report` is what both print;
* :mod:`~packer.tools.info` -- what a dataset holds, or how far an interrupted pack got;
* :mod:`~packer.tools.convert` -- a packed dataset into another format.

Only the CLI imports this package.
"""
