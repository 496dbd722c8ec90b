"""The order of an epoch, computed from the index alone (no I/O).

* :mod:`~readers.order.epoch` -- the shard-based order (``ShardDataset``), split across ranks and loader
  workers, and its mid-epoch resume; re-exports the two below, so it names the whole order;
* :mod:`~readers.order.mapstyle` -- the map-style readers' keyed permutation, split across ranks;
* :mod:`~readers.order.draw` -- epochs of a set length and mixtures' draws from their sources;
* :mod:`~readers.order.sampler` -- ``EpochSampler``, the map-style readers' sampler with exact resume;
* :mod:`~readers.order.mixture`, :mod:`~readers.order.subsets` -- ``mix`` and ``subset``;
* :mod:`~readers.order.quality` -- how close an order comes to a uniform shuffle.

Imports only :mod:`readers.contract`.
"""
