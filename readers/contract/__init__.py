"""The contract: what a packed dataset is on disk, and the small torch-free pieces everything above shares.

``packer`` writes what this package defines and ``readers`` reads it; nothing here imports torch or
any other ``readers`` package, so a tool that only writes or checks datasets pays for none of them
(``tests/test_layering.py`` keeps it so).

* :mod:`~readers.contract.spec` -- the index (``index.json``) read and written, file names, formats,
  checksums; :mod:`~readers.contract.indexarrays` -- the per-sample index arrays: their dtypes, which
  each format has, their files, each one mapped, checked and saved; :mod:`~readers.contract.locks` -- the lock a running pack holds in its folder;
  :mod:`~readers.contract.samplenames` -- ``names.jsonl``, each sample's source path;
  :mod:`~readers.contract.generations` -- the generations of a dataset grown by appends;
* :mod:`~readers.contract.fields` -- the :class:`Schema`, parsing a field type, and where each
  field lives in each format; the types themselves, with what each does to a value (a CSV cell, a
  null, a column), in :mod:`~readers.contract.fieldtypes` and :mod:`~readers.contract.numeric`;
  :mod:`~readers.contract.jsontext` -- strict JSON text (depth, big integers, duplicate keys);
* :mod:`~readers.contract.checks` -- what an index's values may be, checked on open;
  :mod:`~readers.contract.checkcache` -- the record of checks that passed (and what it is keyed by);
* :mod:`~readers.contract.safeio` -- the one place that opens, sizes, reads, maps and atomically
  writes a dataset's files;
* :mod:`~readers.contract.location`, :mod:`~readers.contract.units`,
  :mod:`~readers.contract.messages`, :mod:`~readers.contract.env`,
  :mod:`~readers.contract.perprocess` -- paths and URLs, sizes, one-line messages, what this
  process may use, one value per process.
"""
