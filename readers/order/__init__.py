"""The order of an epoch, computed from the index alone (no I/O).

* :mod:`~readers.order.epoch` -- shard and sample orders, seeded, split across ranks and workers;
* :mod:`~readers.order.sampler` -- ``EpochSampler``, the map-style readers' sampler with exact resume;
* :mod:`~readers.order.mixture`, :mod:`~readers.order.subsets` -- ``mix`` and ``subset``;
* :mod:`~readers.order.quality` -- how close an order comes to a uniform shuffle.

Imports only :mod:`readers.contract`.
"""
