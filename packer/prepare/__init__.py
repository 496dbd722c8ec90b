"""The prepare stage: each source image read, validated, repaired or normalized, in worker processes.

* :mod:`~packer.prepare.images` -- per-image work (validate, normalize, resize);
  :mod:`~packer.prepare.validate_fast`, :mod:`~packer.prepare.jpeg_repair` -- its fast path and
  its lossless header repair;
* :mod:`~packer.prepare.workers` -- reading a ``Source``'s files and preparing them in order;
  :mod:`~packer.prepare.stage` -- the same for sources whose bytes this process reads;
* :mod:`~packer.prepare.pool` -- the one process pool; :mod:`~packer.prepare.readahead`.

Imports :mod:`packer.errors`, :mod:`packer.sources` and ``readers``' contract and decode stack;
nothing about formats or the output folder.
"""
